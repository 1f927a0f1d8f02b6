//! [`PgJobTransaction`]: a running job's handle on the database: its own
//! transaction in transactional mode, the pool in lease mode.
//!
//! A job's transaction takes two round trips: `BEGIN; EXECUTE lock(..)`
//! when the handler first asks for it, and `EXECUTE complete(..); COMMIT AND
//! CHAIN` when the attempt completes (see [`crate::sql::prepared`]). The
//! chained transaction stays open, empty, on the connection, so the next
//! job on it locks its row without a `BEGIN`. A connection the stash does
//! not know to hold the two statements prepares them in the same round trip
//! (`DO ..; BEGIN; EXECUTE lock(..)`); if they never stick (a pooler that
//! hands out another server connection per transaction), the store goes
//! back to four bound statements for good.
//!
//! A stashed connection whose backend died while it waited is replaced
//! before the job's transaction opens, and an attempt cut off by a failed
//! connection is told apart from a handler's failure
//! ([`PgJobTransaction::cut_off`]).
//!
//! A job that waits for a handler has its lock carried by the commit before
//! it when its kind's jobs ask for their transactions, and with late lock
//! rides on (off by default) a handler's lock may ride on another job's
//! commit: either saves the lock's round trip (see [`crate::ride`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::StreamExt;
use queue_core::{Lease, StoreError, WriteResult};
use sqlx::postgres::PgTransactionManager;
use sqlx::{Executor, PgConnection, PgPool, SqlSafeStr};
use sqlx_core::transaction::TransactionManager;

use crate::bind::{lease_value, query};
use crate::completer::{run_finish, FinishRow};
use crate::error::{is_connection_fault, store_error};
use crate::options::StateValues;
use crate::record::PgKey;
use crate::ride::{Arrival, EarlyLock, OpenGuard, Rides};
use crate::sql::prepared::NOT_HELD;
use crate::sql::{literal, Param, Statements};
use crate::stash::{Lent, Stash};

/// A running job's handle on the database: what a handler gets as the
/// store's `JobStore` (a handle to the job's transaction, not a store).
///
/// In transactional mode, [`PgJobTransaction::transaction`] opens the job's
/// transaction on first use: `BEGIN`, then a `FOR KEY SHARE` lock on the
/// job's row (checked to still be this claim's). The handler's writes on it
/// commit together with the job's completion, or roll back if the attempt
/// fails or the job moved on. A handler that never asks for it costs no
/// transaction at all. In lease mode there is no job transaction; write
/// through [`PgJobTransaction::pool`].
#[derive(Debug)]
pub struct PgJobTransaction<K = i64> {
    pool: PgPool,
    /// The job's transaction, once opened.
    tx: Option<OpenTransaction>,
    /// What opening the transaction needs; `None` in lease mode and for
    /// handles outside any claim.
    claim: Option<JobClaim<K>>,
    /// Why the transaction could not be opened, when its connection failed.
    cut_off: Option<String>,
    /// The job's lock, boarded while it waits for a handler, for a commit
    /// to carry.
    early: Option<EarlyLock>,
    /// Whether the handler asked for the transaction.
    asked: bool,
}

/// A job's open transaction.
#[derive(Debug)]
struct OpenTransaction {
    /// sqlx tracks the transaction on the connection, so a handler's own
    /// `begin()` on it makes a savepoint. `prepared`: the transaction was
    /// opened by the prepared lock, and completes by the prepared
    /// completion.
    lent: Lent,
    /// Counts the transaction as open for the store's rides.
    _open: Option<OpenGuard>,
}

/// The claim a job's transaction locks.
#[derive(Debug)]
pub(crate) struct JobClaim<K> {
    pub sql: Arc<Statements>,
    pub states: Arc<StateValues>,
    pub lease: Lease<K>,
    pub stash: Arc<Stash>,
    pub prepared: Arc<PreparedStatements>,
    /// Where locks ride on other jobs' commits; `None` when they never do.
    pub rides: Option<Arc<Rides>>,
    /// The job's kind, for the rides to learn whether its jobs ask for
    /// their transactions.
    pub kind: Option<String>,
}

/// Whether the store's job transactions use statements prepared in SQL.
#[derive(Debug)]
pub(crate) struct PreparedStatements {
    usable: AtomicBool,
}

impl PreparedStatements {
    /// `on`: as configured ([`crate::PgStoreOptions::prepared_job_statements`]).
    pub(crate) fn new(on: bool) -> Arc<PreparedStatements> {
        Arc::new(PreparedStatements {
            usable: AtomicBool::new(on),
        })
    }

    fn usable(&self) -> bool {
        self.usable.load(Ordering::Relaxed)
    }

    fn give_up(&self) {
        if self.usable.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                "statements prepared with PREPARE do not stay on this pool's connections (a pooler \
                 in transaction mode?); job transactions go back to four round trips"
            );
        }
    }
}

impl<K> Drop for PgJobTransaction<K> {
    fn drop(&mut self) {
        // A handle dropped with its transaction open (an abandoned
        // attempt): the rollback goes out when the pool next pings the
        // connection, which is at once.
        if let Some(mut tx) = self.tx.take() {
            PgTransactionManager::start_rollback(&mut tx.lent.conn);
            match &self.claim {
                Some(claim) => claim.stash.return_checked(tx.lent),
                None => drop(tx),
            }
        }
    }
}

/// How a job's transaction ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Commit,
    RollBack,
}

/// Ends the job's transaction on `lent` and hands the connection back; a
/// connection that fails to end it is closed (the server then rolls back).
async fn end_transaction(mut lent: Lent, stash: &Stash, ending: Ending) -> Result<(), sqlx::Error> {
    let ended = match ending {
        Ending::Commit => PgTransactionManager::commit(&mut lent.conn).await,
        Ending::RollBack => PgTransactionManager::rollback(&mut lent.conn).await,
    };
    match ended {
        Ok(()) => stash.put(lent),
        Err(_) => lent.conn.close_on_drop(),
    }
    ended
}

/// Gives up a connection whose transaction failed midway: closed, so the
/// server rolls back and the pool never sees it again.
fn discard(lent: Lent) {
    let mut conn = lent.conn;
    PgTransactionManager::start_rollback(&mut conn);
    conn.close_on_drop();
}

/// How the prepared lock went.
enum Locked {
    Held,
    NotHeld,
    /// The connection lacks the prepared statements.
    Unprepared,
}

/// Whether `error` is a prepared statement's [`NOT_HELD`] report.
fn is_not_held(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().as_deref() == Some("22P02") && db.message().contains(NOT_HELD))
}

fn is_unprepared(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("26000"))
}

/// A statement argument: any value as an escaped literal, which the
/// prepared statement's parameter type reads.
fn lease_argument<K: PgKey>(
    lease: &Lease<K>,
    finished_at: Option<DateTime<Utc>>,
    p: Param,
) -> Option<String> {
    match p {
        Param::Id => Some(literal(&lease.id.to_string())),
        Param::Token => Some(literal(&lease.token.to_string())),
        Param::FinishedAt => {
            finished_at.map(|at| literal(&at.to_rfc3339_opts(SecondsFormat::Micros, true)))
        }
        _ => None,
    }
}

/// A statement this crate built without a value for one of its parameters.
fn unbound() -> StoreError {
    StoreError::Backend {
        context: "internal error: a prepared statement has a parameter without a value".into(),
        source: "statement and binder disagree".into(),
    }
}

/// `EXECUTE lock(..)` for the claim's job.
fn execute_lock<K: PgKey>(claim: &JobClaim<K>) -> Result<String, StoreError> {
    claim
        .sql
        .held_lock
        .execute(|p| lease_argument(&claim.lease, None, p))
        .ok_or_else(unbound)
}

/// `BEGIN; EXECUTE lock(..)` in one round trip, preceded by the `DO` block
/// that prepares the statements when `prepare`. A failed lock leaves the
/// connection out of any transaction.
async fn begin_prepared<K: PgKey>(
    conn: &mut PgConnection,
    claim: &JobClaim<K>,
    prepare: bool,
) -> Result<Locked, StoreError> {
    let lock = execute_lock(claim)?;
    let text = if prepare {
        format!("{}; BEGIN; {lock}", claim.sql.prepare_held)
    } else {
        format!("BEGIN; {lock}")
    };
    let error =
        match PgTransactionManager::begin(conn, Some(sqlx::AssertSqlSafe(text).into_sql_str()))
            .await
        {
            Ok(()) => return Ok(Locked::Held),
            Err(error) => error,
        };
    let locked = if is_not_held(&error) {
        Locked::NotHeld
    } else if is_unprepared(&error) {
        Locked::Unprepared
    } else {
        return Err(store_error("opening a job's transaction", error));
    };
    // The `BEGIN` took: the server waits in a failed transaction that
    // sqlx, which counts only the begins that succeed, does not know of.
    conn.execute(sqlx::raw_sql("ROLLBACK"))
        .await
        .map_err(|e| store_error("rolling back a job's failed lock", e))?;
    Ok(locked)
}

/// Opens the job's transaction with the prepared lock, preparing the
/// statements in the same round trip unless the connection is known to hold
/// them (and again if it turns out not to). `Unprepared`: they did not
/// stick; the caller falls back to bound statements.
async fn open_prepared<K: PgKey>(
    lent: &mut Lent,
    claim: &JobClaim<K>,
) -> Result<Locked, StoreError> {
    if lent.prepared {
        match begin_prepared(&mut lent.conn, claim, false).await? {
            Locked::Unprepared => lent.prepared = false,
            locked => return Ok(locked),
        }
    }
    let locked = begin_prepared(&mut lent.conn, claim, true).await?;
    lent.prepared = !matches!(locked, Locked::Unprepared);
    Ok(locked)
}

/// Opens the job's transaction with bound statements: `BEGIN`, then the
/// lock. `false`: the row is no longer this claim's (the transaction is
/// rolled back).
async fn open_bound<K: PgKey>(
    conn: &mut PgConnection,
    claim: &JobClaim<K>,
) -> Result<bool, StoreError> {
    PgTransactionManager::begin(conn, None)
        .await
        .map_err(|e| store_error("opening a job's transaction", e))?;
    let lease = &claim.lease;
    let lock = query(&claim.sql.lock, |p| lease_value(lease, &claim.states, p))?;
    let held = lock
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| store_error("locking a claimed job", e))?
        .is_some();
    if !held {
        PgTransactionManager::rollback(conn)
            .await
            .map_err(|e| store_error("rolling back a stale job's transaction", e))?;
    }
    Ok(held)
}

/// Locks the job's row inside the empty transaction a previous job's
/// `COMMIT AND CHAIN` left open on `conn`: one round trip, no `BEGIN`. A
/// failed lock ends that transaction.
async fn lock_chained<K: PgKey>(
    conn: &mut PgConnection,
    claim: &JobClaim<K>,
) -> Result<Locked, StoreError> {
    let lock = execute_lock(claim)?;
    let error = match conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(lock))).await {
        Ok(_) => return Ok(Locked::Held),
        Err(error) => error,
    };
    if is_connection_fault(&error) {
        // Nothing to roll back on a dead connection.
        return Err(store_error("locking a claimed job", error));
    }
    PgTransactionManager::rollback(conn)
        .await
        .map_err(|e| store_error("rolling back a job's failed lock", e))?;
    if is_not_held(&error) {
        Ok(Locked::NotHeld)
    } else if is_unprepared(&error) {
        Ok(Locked::Unprepared)
    } else {
        Err(store_error("locking a claimed job", error))
    }
}

/// Opens the job's transaction on `lent`: `true` once the row is locked
/// (`lent.prepared` then says whether by the prepared lock), `false` if it
/// is no longer this claim's.
async fn open<K: PgKey>(lent: &mut Lent, claim: &JobClaim<K>) -> Result<bool, StoreError> {
    if PgTransactionManager::get_transaction_depth(&lent.conn) == 1 {
        // A chained transaction (only the prepared completion leaves one).
        match lock_chained(&mut lent.conn, claim).await? {
            Locked::Held => return Ok(true),
            Locked::NotHeld => return Ok(false),
            // Lost its statements: prepared again below.
            Locked::Unprepared => lent.prepared = false,
        }
    }
    if claim.prepared.usable() {
        match open_prepared(lent, claim).await? {
            Locked::Held => return Ok(true),
            Locked::NotHeld => return Ok(false),
            Locked::Unprepared => claim.prepared.give_up(),
        }
    }
    lent.prepared = false;
    open_bound(&mut lent.conn, claim).await
}

/// Opens the job's transaction on a stashed connection, or, if that one
/// turns out dead (its backend killed while it waited), on a new one.
async fn open_on_live_connection<K: PgKey>(
    claim: &JobClaim<K>,
) -> Result<(Lent, bool), StoreError> {
    let mut tries = 0;
    let mut lent = claim
        .stash
        .take_for_job()
        .await
        .map_err(|e| store_error("opening a job's transaction", e))?;
    loop {
        tries += 1;
        match open(&mut lent, claim).await {
            Ok(held) => return Ok((lent, held)),
            Err(error) => {
                discard(lent);
                if tries > 1 || !matches!(error, StoreError::Unavailable { .. }) {
                    return Err(error);
                }
                lent = claim
                    .stash
                    .take_new()
                    .await
                    .map_err(|e| store_error("opening a job's transaction", e))?;
            }
        }
    }
}

/// Hands the job's lock to the next commit when that is worth it: `None`
/// when it is not (the job locks by itself).
async fn ride<K: PgKey>(claim: &JobClaim<K>) -> Result<Option<Arrival>, StoreError> {
    let Some(rides) = &claim.rides else {
        return Ok(None);
    };
    if !claim.prepared.usable() || !rides.worth_riding() {
        return Ok(None);
    }
    let ticket = rides.board(execute_lock(claim)?);
    Ok(Some(rides.arrive(ticket).await))
}

/// Boards the claimed job's lock for the commits to come, when its kind's
/// last job asked for its transaction.
fn board_early<K: PgKey>(claim: &JobClaim<K>) -> Option<EarlyLock> {
    let rides = claim.rides.as_ref()?;
    if !claim.prepared.usable() || !rides.predicts(claim.kind.as_deref()?) {
        return None;
    }
    let lock = execute_lock(claim).ok()?;
    Some(EarlyLock::board(rides, &claim.stash, lock))
}

fn not_held<K: PgKey>(lease: &Lease<K>) -> StoreError {
    StoreError::Conflict {
        context: format!("locking job {}", lease.id),
        source: "the job was reset, reclaimed or deleted before its transaction could lock it"
            .into(),
    }
}

impl<K: PgKey> PgJobTransaction<K> {
    /// The handle of a claimed job; `claim` is `None` in lease mode.
    pub(crate) fn claimed(pool: PgPool, claim: Option<JobClaim<K>>) -> Self {
        PgJobTransaction {
            pool,
            tx: None,
            claim,
            cut_off: None,
            early: None,
            asked: false,
        }
    }

    /// Boards the job's lock for the commits to come, when the job is
    /// about to wait for a handler and its kind's last job asked for its
    /// transaction.
    pub(crate) fn board_early(&mut self) {
        if self.early.is_none() && self.tx.is_none() {
            self.early = self.claim.as_ref().and_then(board_early);
        }
    }

    /// Whether the job's transaction is open (the handler asked for it).
    pub(crate) fn in_transaction(&self) -> bool {
        self.tx.is_some()
    }

    /// The job's transaction (transactional mode), opened and row-locked on
    /// first use. Fails if the job was reset, reclaimed or deleted before
    /// the lock, or in lease mode (which has none: use [`PgJobTransaction::pool`]).
    pub async fn transaction(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.tx.is_none() {
            let Some(claim) = &self.claim else {
                return Err(StoreError::Config(
                    "this job has no transaction: the store runs in lease mode (write through pool())".into(),
                ));
            };
            self.asked = true;
            let count_open = || claim.rides.as_ref().map(|rides| rides.opened());
            // A lock boarded early settles first; one no commit took may
            // still ride late.
            let early = match self.early.take() {
                Some(early) => early.settle().await,
                None => None,
            };
            let arrival = match early {
                Some(arrival) => Some(arrival),
                None => ride(claim).await?,
            };
            match arrival {
                Some(Arrival::Locked(conn)) => {
                    self.tx = Some(OpenTransaction {
                        lent: Lent {
                            conn,
                            prepared: true,
                        },
                        _open: count_open(),
                    });
                    return self.open_connection();
                }
                Some(Arrival::NotHeld) => return Err(not_held(&claim.lease)),
                Some(Arrival::Missed) | None => {}
            }
            match open_on_live_connection(claim).await {
                Ok((lent, true)) => {
                    self.tx = Some(OpenTransaction {
                        lent,
                        _open: count_open(),
                    })
                }
                Ok((lent, false)) => {
                    // The lock's transaction is over already.
                    claim.stash.put(lent);
                    return Err(not_held(&claim.lease));
                }
                Err(error) => {
                    if let StoreError::Unavailable { .. } = error {
                        self.cut_off = Some(error.chain());
                    }
                    return Err(error);
                }
            }
        }
        self.open_connection()
    }

    /// After the handler returned an error: whether its attempt was cut off
    /// by a failed connection (`Some`: why), in which case the error is the
    /// store's, not the handler's. The job's transaction, if open, is rolled
    /// back here; a rollback that finds the connection dead, like a
    /// transaction that could not be opened for want of a connection, means
    /// the attempt was cut off.
    pub(crate) async fn cut_off(&mut self) -> Option<String> {
        if let Some(why) = self.cut_off.take() {
            return Some(why);
        }
        let claim = self.claim.as_ref()?;
        let mut tx = self.tx.take()?;
        let mut ended = Ok(());
        while ended.is_ok() && PgTransactionManager::get_transaction_depth(&tx.lent.conn) > 0 {
            ended = PgTransactionManager::rollback(&mut tx.lent.conn).await;
        }
        match ended {
            Ok(()) => {
                claim.stash.put(tx.lent);
                None
            }
            Err(error) => {
                let cut_off = is_connection_fault(&error);
                discard(tx.lent);
                cut_off.then(|| {
                    format!("the job's connection to the database failed while it ran ({error}); its writes were rolled back")
                })
            }
        }
    }

    fn open_connection(&mut self) -> Result<&mut PgConnection, StoreError> {
        match self.tx.as_mut() {
            Some(tx) => Ok(&mut tx.lent.conn),
            None => Err(StoreError::Backend {
                context: "opening a job's transaction".into(),
                source: "the transaction vanished".into(),
            }),
        }
    }

    /// Ends the job's transaction, if the handler opened one, for an attempt
    /// that ended with `row`: a completion commits with the handler's writes
    /// (`Some`: recorded); any other outcome rolls them back and is the
    /// caller's to record (`None`), as is every outcome of a job without a
    /// transaction.
    pub(crate) async fn end(
        mut self,
        row: &FinishRow<K>,
        complete: bool,
    ) -> Option<Result<WriteResult, StoreError>> {
        let claim = self.claim.as_ref()?;
        if let (Some(rides), Some(kind)) = (&claim.rides, &claim.kind) {
            rides.learn(kind, self.asked);
        }
        // A lock boarded for a handler that never asked goes back.
        drop(self.early.take());
        let tx = self.tx.take()?;
        let stash = &claim.stash;
        if !complete {
            // A failed attempt leaves no trace of the handler's writes.
            if let Err(error) = end_transaction(tx.lent, stash, Ending::RollBack).await {
                tracing::warn!(%error, id = %row.id, "rolling back a failed attempt failed; the connection is closed");
            }
            return None;
        }
        if PgTransactionManager::get_transaction_depth(&tx.lent.conn) != 1 {
            discard(tx.lent);
            return Some(Err(StoreError::Backend {
                context: format!("committing job {}", row.id),
                source: "the handler left a nested transaction (savepoint) open; the attempt's writes were rolled back".into(),
            }));
        }
        Some(if tx.lent.prepared {
            commit_prepared(tx.lent, claim, row).await
        } else {
            commit_bound(tx.lent, claim, row).await
        })
    }
}

/// `EXECUTE complete(..); COMMIT AND CHAIN` in one round trip: the
/// handler's writes and the completion commit together, or roll back if the
/// job moved on. A lock waiting to ride goes along (`; EXECUTE lock(..)`),
/// and the connection then goes on to its job.
async fn commit_prepared<K: PgKey>(
    mut lent: Lent,
    claim: &JobClaim<K>,
    row: &FinishRow<K>,
) -> Result<WriteResult, StoreError> {
    let Some(complete) = claim
        .sql
        .held_complete
        .execute(|p| lease_argument(&claim.lease, row.finished_at, p))
    else {
        discard(lent);
        return Err(unbound());
    };
    let taken = claim
        .rides
        .as_ref()
        .and_then(|rides| rides.take().map(|ride| (rides, ride)));
    let Some((rides, ride)) = taken else {
        return match lent
            .conn
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "{complete}; COMMIT AND CHAIN"
            ))))
            .await
        {
            Ok(_) => {
                // Committed. The connection is in the empty transaction the
                // chain opened, which sqlx still counts as the job's: the
                // next job's transaction on it needs no `BEGIN` (and the
                // stash rolls it back if the connection goes to the pool
                // instead).
                claim.stash.put(lent);
                Ok(WriteResult::Applied)
            }
            Err(error) => failed_commit(lent, claim, row, error).await,
        };
    };
    let mut conn = lent.conn;
    let text = format!("{complete}; COMMIT AND CHAIN; {}", ride.lock);
    // Statements that completed before an error: once the completion and
    // the `COMMIT` have, the job committed whatever became of the lock.
    const COMMITTED: usize = 2;
    let mut completed = 0;
    let mut failure = None;
    {
        let mut results = conn.fetch_many(sqlx::raw_sql(sqlx::AssertSqlSafe(text)));
        while let Some(result) = results.next().await {
            match result {
                Ok(sqlx::Either::Left(_)) => completed += 1,
                Ok(sqlx::Either::Right(_)) => {}
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
    }
    let prepared = |conn| Lent {
        conn,
        prepared: true,
    };
    match failure {
        None => {
            if let Err(Arrival::Locked(conn)) = ride.deliver(Arrival::Locked(conn), rides) {
                // The rider is gone, or as many early locks as allowed
                // wait for handlers (the rider locks by itself): the lock
                // goes with a rollback.
                if let Err(error) =
                    end_transaction(prepared(conn), &claim.stash, Ending::RollBack).await
                {
                    tracing::warn!(%error, "rolling back an abandoned job's lock failed; the connection is closed");
                }
            }
            Ok(WriteResult::Applied)
        }
        Some(error) if completed >= COMMITTED => {
            // Committed; the rider's lock failed.
            let arrival = if is_not_held(&error) {
                Arrival::NotHeld
            } else {
                tracing::warn!(%error, "a job's lock riding on a commit failed; it locks by itself");
                Arrival::Missed
            };
            // A rider that is gone has nothing to learn.
            let _ = ride.deliver(arrival, rides);
            if let Err(error) =
                end_transaction(prepared(conn), &claim.stash, Ending::RollBack).await
            {
                tracing::warn!(%error, "rolling back a failed lock failed; the connection is closed");
            }
            Ok(WriteResult::Applied)
        }
        Some(error) => {
            let _ = ride.deliver(Arrival::Missed, rides);
            failed_commit(prepared(conn), claim, row, error).await
        }
    }
}

/// A job's completion and commit that failed: stale (rolled back) if the
/// job moved on, else an error (the connection closed).
async fn failed_commit<K: PgKey>(
    lent: Lent,
    claim: &JobClaim<K>,
    row: &FinishRow<K>,
    error: sqlx::Error,
) -> Result<WriteResult, StoreError> {
    if is_not_held(&error) {
        if let Err(error) = end_transaction(lent, &claim.stash, Ending::RollBack).await {
            tracing::warn!(%error, id = %row.id, "rolling back a stale attempt failed; the connection is closed");
        }
        Ok(WriteResult::Stale)
    } else {
        discard(lent);
        Err(store_error("committing a job's transaction", error))
    }
}

/// The completion, then `COMMIT`, as bound statements.
async fn commit_bound<K: PgKey>(
    mut lent: Lent,
    claim: &JobClaim<K>,
    row: &FinishRow<K>,
) -> Result<WriteResult, StoreError> {
    let applied = match run_finish(
        &claim.sql,
        &claim.states,
        &mut lent.conn,
        std::slice::from_ref(row),
    )
    .await
    {
        Ok(applied) => applied,
        Err(error) => {
            discard(lent);
            return Err(error);
        }
    };
    if !applied.contains(&row.id) {
        if let Err(error) = end_transaction(lent, &claim.stash, Ending::RollBack).await {
            tracing::warn!(%error, id = %row.id, "rolling back a stale attempt failed; the connection is closed");
        }
        return Ok(WriteResult::Stale);
    }
    end_transaction(lent, &claim.stash, Ending::Commit)
        .await
        .map_err(|e| store_error("committing a job's transaction", e))?;
    Ok(WriteResult::Applied)
}

impl<K> PgJobTransaction<K> {
    /// The store's pool (outside the job's transaction).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Gives up the job now: rolls its transaction back at once, as the
    /// server would for a worker that died. (Dropping the handle also rolls
    /// back, but only once its connection is next used.)
    pub async fn abandon(mut self) {
        let (Some(tx), Some(claim)) = (self.tx.take(), &self.claim) else {
            return;
        };
        if let Err(error) = end_transaction(tx.lent, &claim.stash, Ending::RollBack).await {
            tracing::warn!(%error, "rolling back an abandoned job failed; its connection is closed");
        }
    }

    /// A handle bound to no claim, writing through `pool`: what a late
    /// writer outside any claim would use (tests of stale writes).
    pub fn outside_transaction(pool: PgPool) -> Self {
        PgJobTransaction {
            pool,
            tx: None,
            claim: None,
            cut_off: None,
            early: None,
            asked: false,
        }
    }
}
