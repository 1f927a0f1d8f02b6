//! Operators' writes: retry, cancel, delete and purge, each over the rows
//! it picks, and why a job named by key was left alone.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use queue_core::{
    ActionReport, JobState, PurgeParams, PurgeReport, RetryParams, SkipReason, Skipped, StoreError,
    Targets, CANCELED_BEFORE_RUN_MESSAGE,
};
use sqlx::Row;

use super::PgAdmin;
use crate::bind::{query, Value};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::admin::{AdminWrite, Pick};
use crate::sql::{Param, Statement};

impl<K: PgKey> PgAdmin<K> {
    /// [`Admin::retry`](queue_core::Admin::retry) on `conn`, inside
    /// whatever transaction it has open: the jobs are queued again, and
    /// wake workers, only if that transaction commits. The statement runs
    /// under a savepoint, so that one meeting a unique key taken
    /// meanwhile runs again without aborting the caller's transaction.
    /// Pass a sqlx [`Transaction`](sqlx::Transaction) (or a connection
    /// outside one), not a connection where `BEGIN` was sent by hand:
    /// sqlx must know it is inside a transaction to make a savepoint.
    ///
    /// ```no_run
    /// # async fn run(admin: queue_store_postgres::PgAdmin<i64>, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use queue_core::{RetryParams, Targets};
    ///
    /// let mut tx = pool.begin().await?;
    /// // ... the application's own writes on `tx` ...
    /// let report = admin.retry_in(&mut tx, &Targets::id(42), RetryParams::default()).await?;
    /// tx.commit().await?;
    /// println!("{} retried", report.changed);
    /// # Ok(()) }
    /// ```
    pub async fn retry_in(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
        params: RetryParams,
    ) -> Result<ActionReport<K>, StoreError> {
        self.retry_on(conn, Savepoint::Each, targets, params).await
    }

    /// [`Admin::cancel`](queue_core::Admin::cancel) on `conn`, inside
    /// whatever transaction it has open (see [`PgAdmin::retry_in`]).
    pub async fn cancel_in(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
    ) -> Result<ActionReport<K>, StoreError> {
        self.cancel_on(conn, Savepoint::Each, targets).await
    }

    /// [`Admin::force_fail`](queue_core::Admin::force_fail) on `conn`,
    /// inside whatever transaction it has open (see
    /// [`PgAdmin::retry_in`]). The failed jobs' finish time is the
    /// transaction's start.
    pub async fn force_fail_in(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
        reason: &str,
    ) -> Result<ActionReport<K>, StoreError> {
        self.force_fail_on(conn, Savepoint::Each, targets, reason)
            .await
    }

    /// [`Admin::delete`](queue_core::Admin::delete) on `conn`, inside
    /// whatever transaction it has open (see [`PgAdmin::retry_in`]).
    pub async fn delete_in(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
    ) -> Result<ActionReport<K>, StoreError> {
        self.delete_on(conn, Savepoint::Each, targets).await
    }

    pub(super) async fn retry_on(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        targets: &Targets<K>,
        params: RetryParams,
    ) -> Result<ActionReport<K>, StoreError> {
        let write = AdminWrite::Retry(params.reset_attempts);
        self.write_and_report(conn, savepoint, write, targets, None)
            .await
    }

    pub(super) async fn force_fail_on(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        targets: &Targets<K>,
        reason: &str,
    ) -> Result<ActionReport<K>, StoreError> {
        let write = AdminWrite::ForceFail;
        self.write_and_report(conn, savepoint, write, targets, Some(reason))
            .await
    }

    pub(super) async fn delete_on(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        targets: &Targets<K>,
    ) -> Result<ActionReport<K>, StoreError> {
        let write = AdminWrite::Delete;
        self.write_and_report(conn, savepoint, write, targets, None)
            .await
    }

    /// One `write` over `targets` (with an operator's `reason`), and its
    /// report. The time it writes is the store's, not the caller's: a
    /// retried job is claimable from now on the database's clock (a
    /// force-fail's finish time is the statement's `now()`).
    async fn write_and_report(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        write: AdminWrite,
        targets: &Targets<K>,
        reason: Option<&str>,
    ) -> Result<ActionReport<K>, StoreError> {
        let (limit, now) = (limit_of(targets), self.callers_now());
        let mut changed = self
            .write(conn, savepoint, write, targets, limit, now, reason)
            .await?;
        for pause in LOCKED_PAUSES {
            let Some(locked) = self.locked_left(conn, targets, &changed, &[write]).await? else {
                break;
            };
            tokio::time::sleep(pause).await;
            let again = self
                .write(
                    conn,
                    savepoint,
                    write,
                    &locked,
                    limit_of(&locked),
                    now,
                    reason,
                )
                .await?;
            changed.extend(again);
        }
        let counts = (changed.len() as u64, 0);
        self.report(conn, targets, changed, counts, &[write], Last::Changed)
            .await
    }

    pub(super) async fn cancel_on(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        targets: &Targets<K>,
    ) -> Result<ActionReport<K>, StoreError> {
        const WRITES: [AdminWrite; 2] = [AdminWrite::CancelWaiting, AdminWrite::RequestStop];
        let (limit, now) = (limit_of(targets), self.callers_now());
        let (mut canceled, mut flagged) = self
            .cancel_round(conn, savepoint, targets, limit, now)
            .await?;
        let stop_limit = limit.saturating_sub(canceled.len());
        // The two writes pick apart. With the waiting jobs' write full,
        // running jobs below its highest key may not have been reached: the
        // next call starts where this one did. With it short, every
        // waiting job was reached, and the running ones up to the highest
        // flagged (all of them, if that write was short too).
        let last = if canceled.len() >= limit {
            Last::None
        } else if flagged.len() >= stop_limit {
            Last::Of(flagged.clone())
        } else {
            Last::Changed
        };
        for pause in LOCKED_PAUSES {
            let Some(locked) = self
                .locked_left(
                    conn,
                    targets,
                    &[&canceled[..], &flagged[..]].concat(),
                    &WRITES,
                )
                .await?
            else {
                break;
            };
            tokio::time::sleep(pause).await;
            let (more_canceled, more_flagged) = self
                .cancel_round(conn, savepoint, &locked, limit_of(&locked), now)
                .await?;
            canceled.extend(more_canceled);
            flagged.extend(more_flagged);
        }
        let (waiting, running) = (canceled.len() as u64, flagged.len() as u64);
        let mut changed = canceled;
        changed.extend(flagged);
        self.report(conn, targets, changed, (waiting, running), &WRITES, last)
            .await
    }

    /// One cancel over `targets`, up to `limit` jobs: the waiting jobs
    /// canceled, then the running ones asked to stop.
    async fn cancel_round(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        targets: &Targets<K>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<(Vec<K>, Vec<K>), StoreError> {
        let canceled = self
            .write(
                conn,
                savepoint,
                AdminWrite::CancelWaiting,
                targets,
                limit,
                now,
                None,
            )
            .await?;
        let stop_limit = limit.saturating_sub(canceled.len());
        let flagged = self
            .write(
                conn,
                savepoint,
                AdminWrite::RequestStop,
                targets,
                stop_limit,
                now,
                None,
            )
            .await?;
        Ok((canceled, flagged))
    }

    /// The jobs named by key that `writes` left because another
    /// transaction held their rows, as targets to try again; `None` when
    /// there are none (or `targets` is a filter, whose next call reaches
    /// them). A heartbeat or a completion holds a row for a moment, so an
    /// operator naming a running job should not be told to try again
    /// because one was under way.
    async fn locked_left(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
        changed: &[K],
        writes: &[AdminWrite],
    ) -> Result<Option<Targets<K>>, StoreError> {
        if !matches!(targets, Targets::Ids(ids) if ids.len() > changed.len()) {
            return Ok(None);
        }
        // A job still in a state the writes move it out of was held when
        // its write came, even if its row is free by now; unless the table
        // lacks what the write needs (a cancel flag to request a stop).
        let mut doable = Vec::with_capacity(writes.len());
        for write in writes {
            if self.inner.sql.write(*write, Pick::Ids)?.is_some() {
                doable.push(*write);
            }
        }
        let movable = self.states_moved_by(&doable);
        let locked: Vec<K> = self
            .skipped(conn, targets, changed, writes)
            .await?
            .into_iter()
            .filter(|s| {
                s.reason == SkipReason::Locked
                    || (s.reason == SkipReason::State
                        && s.state.is_some_and(|state| movable.contains(&state)))
            })
            .map(|s| s.id)
            .collect();
        Ok((!locked.is_empty()).then(|| Targets::Ids(locked)))
    }

    /// The report of `writes` that changed `changed` (`done` jobs
    /// changed, `stop_requested` running ones asked to stop), read on
    /// `conn`: the jobs named that were left alone, and where the next
    /// batch starts (after `last`).
    async fn report(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
        changed: Vec<K>,
        (done, stop_requested): (u64, u64),
        writes: &[AdminWrite],
        last: Last<K>,
    ) -> Result<ActionReport<K>, StoreError> {
        let skipped = self.skipped(conn, targets, &changed, writes).await?;
        // Keys name their jobs: no call follows.
        let last = match (last, matches!(targets, Targets::Matching { .. })) {
            (_, false) | (Last::None, _) => None,
            (Last::Of(keys), true) => self.highest_of(conn, keys).await?,
            (Last::Changed, true) => self.highest_of(conn, changed).await?,
        };
        Ok(ActionReport::new(done, stop_requested, skipped).last(last))
    }

    /// Runs `write` over `targets` on `conn`; returns the keys it changed.
    /// `limit` caps a [`Targets::Matching`] call. A statement Postgres
    /// refuses for a reason a new statement does not meet runs again, up
    /// to [`RETRY_ROUNDS`] times, under a savepoint where `savepoint` asks:
    ///
    /// - On a table partitioned by state, a row another transaction moved
    ///   to another partition while the statement waited for it fails the
    ///   whole statement (SQLSTATE 40001): the next one sees the row where
    ///   it is now.
    /// - A retry queues at most one job per unique key and none whose key
    ///   another job holds, so it meets a unique violation only when a
    ///   concurrent enqueue took a key after its snapshot. The failed
    ///   statement's locks are gone by the time the connection answers,
    ///   and the next statement's snapshot sees the key's new holder and
    ///   leaves that job alone.
    ///
    /// Each statement is all or nothing: nothing is written twice, and a
    /// failure reports no partial work.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        conn: &mut sqlx::PgConnection,
        savepoint: Savepoint,
        write: AdminWrite,
        targets: &Targets<K>,
        limit: usize,
        now: DateTime<Utc>,
        reason: Option<&str>,
    ) -> Result<Vec<K>, StoreError> {
        let context = write_context(write);
        let mut tries = 0;
        loop {
            tries += 1;
            let done = match savepoint {
                Savepoint::None => {
                    self.write_on(conn, write, targets, limit, now, reason)
                        .await
                }
                Savepoint::Each => {
                    let mut inner = sqlx::Connection::begin(&mut *conn)
                        .await
                        .map_err(|e| store_error(context, e))?;
                    let done = self
                        .write_on(&mut inner, write, targets, limit, now, reason)
                        .await;
                    match done {
                        Ok(_) => inner.commit().await,
                        Err(_) => inner.rollback().await,
                    }
                    .map_err(|e| store_error(context, e))?;
                    done
                }
            };
            match done {
                Err(error) if is_moved_row(&error) && tries < RETRY_ROUNDS => continue,
                Err(error) if is_unique_violation(&error) && tries < RETRY_ROUNDS => continue,
                Err(error) if is_unique_violation(&error) => {
                    return Err(StoreError::Conflict {
                        context: format!(
                            "{context}: {RETRY_ROUNDS} statements in a row met enqueues taking the same unique keys; nothing was retried, try again"
                        ),
                        source: Box::new(error),
                    })
                }
                other => return other,
            }
        }
    }

    /// One statement of `write` on `conn`.
    async fn write_on(
        &self,
        conn: &mut sqlx::PgConnection,
        write: AdminWrite,
        targets: &Targets<K>,
        limit: usize,
        now: DateTime<Utc>,
        reason: Option<&str>,
    ) -> Result<Vec<K>, StoreError> {
        let (pick, filter) = match targets {
            Targets::Ids(ids) if ids.is_empty() => return Ok(Vec::new()),
            Targets::Ids(_) => (Pick::Ids, None),
            Targets::Matching { .. } if limit == 0 => return Ok(Vec::new()),
            Targets::Matching { filter, after, .. } => {
                (Pick::Matching(filter, after.is_some()), Some(filter))
            }
            other => {
                return Err(StoreError::Refused(format!(
                    "the Postgres store does not know the targets {other:?}"
                )))
            }
        };
        let Some(statement) = self.inner.sql.write(write, pick)? else {
            return Ok(Vec::new());
        };
        let mut ids = match targets {
            Targets::Ids(ids) => Some(ids.clone()),
            _ => None,
        };
        let mut after = match targets {
            Targets::Matching { after, .. } => after.clone(),
            _ => None,
        };
        let context = write_context(write);
        let rows = query(&statement, |p| match p {
            Param::Ids => ids.take().map(Value::Keys),
            Param::After => after.take().map(Value::Key),
            Param::Limit => Some(Value::Int(i64::try_from(limit).unwrap_or(i64::MAX))),
            Param::Message => Some(Value::Text(CANCELED_BEFORE_RUN_MESSAGE.to_owned())),
            Param::Reason => reason.map(|r| Value::Text(r.to_owned())),
            Param::Now => Some(Value::Time(self.to_db(now))),
            Param::Channel => Some(Value::Text(self.inner.options.notify_channel())),
            other => filter.and_then(|f| self.filter_value(f, other)),
        })?
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| store_error(context, e))?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(|e| store_error(context, e)))
            .collect()
    }

    /// Where the call after a [`Targets::Matching`] call that changed
    /// `changed` starts: the highest of them, in the key column's order
    /// (every matching job below it was picked).
    async fn highest_of(
        &self,
        conn: &mut sqlx::PgConnection,
        changed: Vec<K>,
    ) -> Result<Option<K>, StoreError> {
        if changed.is_empty() {
            return Ok(None);
        }
        let context = "reading where the next batch starts";
        let rows = rows_for_keys(conn, &self.inner.sql.highest_key(), changed, context).await?;
        rows.first()
            .map(|row| row.try_get(0).map_err(|e| store_error(context, e)))
            .transpose()
    }

    /// The states `writes` move jobs out of (every state, if one of them
    /// names none).
    fn states_moved_by(&self, writes: &[AdminWrite]) -> Vec<JobState> {
        let mut movable = Vec::new();
        for write in writes {
            let states = self.inner.sql.states_moved_by(*write);
            if states.is_empty() {
                return JobState::ALL.to_vec();
            }
            movable.extend(states);
        }
        movable
    }

    /// The keys of `targets` none of `changed` holds, each with why: no
    /// such job, a state none of `writes` moves a job out of, a row
    /// another transaction held, or a unique key another job holds.
    async fn skipped(
        &self,
        conn: &mut sqlx::PgConnection,
        targets: &Targets<K>,
        changed: &[K],
        writes: &[AdminWrite],
    ) -> Result<Vec<Skipped<K>>, StoreError> {
        let Targets::Ids(ids) = targets else {
            return Ok(Vec::new());
        };
        let changed: HashSet<&K> = changed.iter().collect();
        let left: Vec<K> = ids
            .iter()
            .filter(|id| !changed.contains(id))
            .cloned()
            .collect();
        if left.is_empty() {
            return Ok(Vec::new());
        }
        let context = "reading why jobs were left alone";
        let rows = rows_for_keys(conn, &self.inner.sql.states_of, left.clone(), context).await?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let read = |e| store_error(context, e);
            let id: K = row.try_get("id").map_err(read)?;
            let stored: String = row.try_get("state").map_err(read)?;
            let free: bool = row.try_get("free").map_err(read)?;
            let key_held: bool = row.try_get("key_held").map_err(read)?;
            found.insert(id, (stored, free, key_held));
        }
        let movable = self.states_moved_by(writes);
        let retry = writes.iter().any(|w| matches!(w, AdminWrite::Retry(_)));
        Ok(left
            .into_iter()
            .map(|id| {
                let Some((stored, free, key_held)) = found.remove(&id) else {
                    return Skipped::missing(id);
                };
                let state = self.state_of(&stored);
                let reason = if !state.is_some_and(|s| movable.contains(&s)) {
                    SkipReason::State
                } else if !free {
                    SkipReason::Locked
                } else if retry && key_held {
                    SkipReason::KeyHeld
                } else {
                    // Moved on between the write and this read.
                    SkipReason::State
                };
                Skipped::new(id, stored, state, reason)
            })
            .collect())
    }

    /// [`Admin::purge`](queue_core::Admin::purge) on `conn`, inside
    /// whatever transaction it has open (see [`PgAdmin::retry_in`]): the
    /// jobs are gone, or in the archive, only if that transaction commits.
    pub async fn purge_in(
        &self,
        conn: &mut sqlx::PgConnection,
        params: &PurgeParams,
    ) -> Result<PurgeReport, StoreError> {
        self.purge_on(conn, params).await
    }

    /// A purge's batch: oldest finished first where an index allows,
    /// reporting the latest finish time it removed for the next batch to
    /// start from.
    pub(super) async fn purge_on(
        &self,
        conn: &mut sqlx::PgConnection,
        params: &PurgeParams,
    ) -> Result<PurgeReport, StoreError> {
        let Some(filter) = params.filter()? else {
            return Ok(PurgeReport::new(0, None));
        };
        // With an archive, purged jobs move there; else they are deleted.
        let archive = self.inner.options.archive.is_some();
        let context = write_context(if archive {
            AdminWrite::Archive
        } else {
            AdminWrite::Delete
        });
        let statement = match self.inner.sql.purge(&filter, archive)? {
            Some(statement) if params.limit > 0 => statement,
            _ => return Ok(PurgeReport::new(0, None)),
        };
        let row = query(&statement, |p| match p {
            Param::Limit => Some(Value::Int(i64::try_from(params.limit).unwrap_or(i64::MAX))),
            other => self.filter_value(&filter, other),
        })?
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| store_error(context, e))?;
        let purged: i64 = row.try_get(0).map_err(|e| store_error(context, e))?;
        let latest: Option<DateTime<Utc>> = row.try_get(1).map_err(|e| store_error(context, e))?;
        let found: Option<i32> = row.try_get(2).map_err(|e| store_error(context, e))?;
        Ok(PurgeReport::new(
            u64::try_from(purged).unwrap_or(0),
            // On the callers' clock, as the next batch's bound is given.
            latest.map(|at| self.to_local(at)),
        )
        .found(found.and_then(|n| u64::try_from(n).ok()).unwrap_or(0)))
    }
}

/// The pauses before a write by key tries again the jobs it left because
/// another transaction held their rows: about a third of a second in all,
/// longer than a heartbeat or a completion holds a row, far shorter than a
/// job's own transaction. A row still held after them is reported
/// [`SkipReason::Locked`].
const LOCKED_PAUSES: [std::time::Duration; 5] = [
    std::time::Duration::from_millis(10),
    std::time::Duration::from_millis(20),
    std::time::Duration::from_millis(40),
    std::time::Duration::from_millis(80),
    std::time::Duration::from_millis(160),
];

/// Statements a write runs before it gives up on rows that keep moving
/// to other partitions, or on enqueues that keep taking the keys of the
/// jobs a retry queues again.
const RETRY_ROUNDS: u32 = 5;

/// Whether each statement of a write runs under a savepoint: on a
/// caller's connection, so that a statement that fails and runs again
/// leaves the caller's transaction usable.
#[derive(Debug, Clone, Copy)]
pub(super) enum Savepoint {
    None,
    Each,
}

/// Where a [`Targets::Matching`] call's next batch starts.
enum Last<K> {
    /// Where this one did.
    None,
    /// After the highest of these.
    Of(Vec<K>),
    /// After the highest key changed.
    Changed,
}

/// What `write` is doing, for its errors.
fn write_context(write: AdminWrite) -> &'static str {
    match write {
        AdminWrite::Retry(_) => "retrying jobs",
        AdminWrite::CancelWaiting | AdminWrite::RequestStop => "cancelling jobs",
        AdminWrite::ForceFail => "failing jobs",
        AdminWrite::Delete => "deleting jobs",
        AdminWrite::Archive => "moving purged jobs to the archive",
    }
}

fn limit_of<K>(targets: &Targets<K>) -> usize {
    match targets {
        Targets::Ids(ids) => ids.len(),
        Targets::Matching { limit, .. } => *limit,
        _ => 0,
    }
}

/// Whether `error` is Postgres' refusal of a statement that met a row
/// another transaction moved to another partition (SQLSTATE 40001, a
/// serialization failure in any isolation level).
fn is_moved_row(error: &StoreError) -> bool {
    matches!(error, StoreError::Conflict { .. }) && sqlstate(error) == Some("40001".into())
}

/// Whether `error` is a unique violation (a second holder of a unique key).
fn is_unique_violation(error: &StoreError) -> bool {
    matches!(error, StoreError::Backend { .. }) && sqlstate(error) == Some("23505".into())
}

/// The SQLSTATE of the database error behind `error`, if that is one.
fn sqlstate(error: &StoreError) -> Option<String> {
    let (StoreError::Conflict { source, .. } | StoreError::Backend { source, .. }) = error else {
        return None;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}

/// The rows of `statement`, whose one parameter is a list of keys, for
/// `keys`, on `conn`.
async fn rows_for_keys<K: PgKey>(
    conn: &mut sqlx::PgConnection,
    statement: &Statement,
    keys: Vec<K>,
    context: &'static str,
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    let mut keys = Some(keys);
    query(statement, |p| match p {
        Param::Ids => keys.take().map(Value::Keys),
        _ => None,
    })?
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| store_error(context, e))
}
