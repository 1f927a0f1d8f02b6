//! Recording attempts' outcomes: the finish statements and lease mode's
//! batched completer.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use queue_core::{Lease, StoreError, Transition, WriteResult};
use sqlx::postgres::PgConnection;
use sqlx::Row;
use tokio::sync::{mpsc, oneshot};

use crate::bind::{query, state, Value};
use crate::error::store_error;
use crate::options::StateValues;
use crate::record::PgKey;
use crate::sql::{Param, Statement, Statements};
use crate::stash::Stash;

/// The most attempts one batched completion statement finishes.
const MAX_COMPLETION_BATCH: usize = 1000;
/// With this many outcomes waiting, the completer writes without waiting
/// out its delay.
const EAGER_COMPLETION_BATCH: usize = 500;

/// One attempt's end, as a row of the batched finish statement.
pub(crate) struct FinishRow<K> {
    pub id: K,
    pub token: i64,
    target: String,
    pub finished_at: Option<DateTime<Utc>>,
    message: Option<String>,
    process_after: Option<DateTime<Utc>>,
    failed: i32,
    /// The attempt succeeded (its row may be deleted instead).
    succeeded: bool,
}

impl<K: PgKey> FinishRow<K> {
    pub(crate) fn new(
        lease: &Lease<K>,
        transition: Transition,
        now: DateTime<Utc>,
        states: &StateValues,
    ) -> Result<Self, StoreError> {
        let target = states.get(transition.target()).to_owned();
        let succeeded = matches!(transition, Transition::Complete);
        let (finished_at, message, process_after, failed) = match transition {
            Transition::Complete => (Some(now), None, None, 0),
            Transition::Retry { message, retry_at } => {
                (Some(now), Some(message), Some(retry_at), 1)
            }
            Transition::Fail { message } => (Some(now), Some(message), None, 1),
            Transition::Cancel { message } => (Some(now), Some(message), None, 0),
            Transition::Release => (None, None, None, 0),
            other => {
                return Err(StoreError::Config(format!(
                    "the Postgres store does not know the transition {other:?}"
                )))
            }
        };
        Ok(FinishRow {
            succeeded,
            id: lease.id.clone(),
            token: lease.token,
            target,
            finished_at,
            message,
            process_after,
            failed,
        })
    }
}

/// Records attempts' ends; returns the keys of the rows it applied to (the
/// others had moved on). Attempts that succeeded go through a statement of
/// their own, which writes less (or deletes their rows under
/// [`CompletedJobs::Delete`](crate::CompletedJobs::Delete)).
pub(crate) async fn run_finish<K: PgKey>(
    sql: &Statements,
    states: &StateValues,
    conn: &mut PgConnection,
    rows: &[FinishRow<K>],
) -> Result<HashSet<K>, StoreError> {
    let (succeeded, others): (Vec<&FinishRow<K>>, Vec<&FinishRow<K>>) =
        rows.iter().partition(|r| r.succeeded);
    let mut applied = HashSet::with_capacity(rows.len());
    if !succeeded.is_empty() {
        let (many, one) = &sql.finish_succeeded;
        applied.extend(finish(many, one, states, conn, &succeeded).await?);
    }
    if !others.is_empty() {
        applied.extend(finish(&sql.finish, &sql.finish_one, states, conn, &others).await?);
    }
    Ok(applied)
}

/// Runs `many` over `rows` (or `one`, without arrays, cheaper to plan and
/// run, for a single row); returns the keys it applied to.
async fn finish<K: PgKey, R: Borrow<FinishRow<K>> + Sync>(
    many: &Statement,
    one: &Statement,
    states: &StateValues,
    conn: &mut PgConnection,
    rows: &[R],
) -> Result<HashSet<K>, StoreError> {
    if let [row] = rows {
        let row: &FinishRow<K> = row.borrow();
        let q = query(one, |p| match p {
            Param::TargetState => Some(Value::Text(row.target.clone())),
            Param::FinishedAt => Some(Value::OptTime(row.finished_at)),
            Param::Message => Some(Value::OptText(row.message.clone())),
            Param::ProcessAfter => Some(Value::OptTime(row.process_after)),
            Param::FailureIncrement => Some(Value::Int4(row.failed)),
            Param::Id => Some(Value::Key(row.id.clone())),
            Param::Token => Some(Value::Int(row.token)),
            Param::State(s) => Some(state(states, s)),
            _ => None,
        })?;
        let applied = q
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| store_error("recording a job outcome", e))?;
        return Ok(applied.map(|_| row.id.clone()).into_iter().collect());
    }
    let rows = || rows.iter().map(Borrow::borrow);
    let q = query(many, |p| {
        Some(match p {
            Param::Ids => Value::Keys(rows().map(|r| r.id.clone()).collect()),
            Param::Tokens => Value::Ints(rows().map(|r| r.token).collect()),
            Param::TargetStates => Value::Texts(rows().map(|r| Some(r.target.clone())).collect()),
            Param::FinishedAts => Value::Times(rows().map(|r| r.finished_at).collect()),
            Param::Messages => Value::Texts(rows().map(|r| r.message.clone()).collect()),
            Param::ProcessAfters => Value::Times(rows().map(|r| r.process_after).collect()),
            Param::FailureIncrements => Value::Int4s(rows().map(|r| r.failed).collect()),
            Param::State(s) => state(states, s),
            _ => return None,
        })
    })?;
    let rows = q
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| store_error("recording job outcomes", e))?;
    rows.iter()
        .map(|r| {
            r.try_get::<K, _>(0)
                .map_err(|e| store_error("reading finished job keys", e))
        })
        .collect()
}

/// A finish waiting for the completer.
pub(crate) struct Completion<K> {
    pub row: FinishRow<K>,
    pub reply: oneshot::Sender<Result<WriteResult, StoreError>>,
}

/// Lease mode's completer: finishes everything queued while the previous
/// statement ran in one statement, so batches grow with load and add no
/// delay when idle.
pub(crate) async fn complete_batches<K: PgKey>(
    stash: Arc<Stash>,
    sql: Arc<Statements>,
    states: Arc<StateValues>,
    delay: Duration,
    mut rx: mpsc::UnboundedReceiver<Completion<K>>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        if !delay.is_zero() {
            // Gather for up to `delay`, or until a batch is big enough.
            let deadline = tokio::time::Instant::now() + delay;
            while batch.len() < EAGER_COMPLETION_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(next)) => batch.push(next),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        while batch.len() < MAX_COMPLETION_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (rows, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|c| (c.row, c.reply)).unzip();
        let written = write_outcomes(&stash, &sql, &states, &rows).await;
        match written {
            Ok(applied) => {
                for (row, reply) in rows.iter().zip(replies) {
                    let result = if applied.contains(&row.id) {
                        WriteResult::Applied
                    } else {
                        WriteResult::Stale
                    };
                    let _ = reply.send(Ok(result));
                }
            }
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(copy_error(&error)));
                }
            }
        }
    }
}

/// Writes a batch of outcomes on a stashed connection; if that connection
/// turns out dead (its backend was killed while it waited), once more on a
/// new one. The finish statements are guarded, so writing again is safe.
async fn write_outcomes<K: PgKey>(
    stash: &Stash,
    sql: &Statements,
    states: &StateValues,
    rows: &[FinishRow<K>],
) -> Result<HashSet<K>, StoreError> {
    let mut on = stash.lend("recording job outcomes").await?;
    loop {
        match run_finish(sql, states, on.conn(), rows).await {
            Ok(applied) => {
                on.put_back();
                return Ok(applied);
            }
            Err(error) => on = on.replace_after(error).await?,
        }
    }
}

/// The same failure for each waiter of a failed batch (errors do not clone).
fn copy_error(error: &StoreError) -> StoreError {
    let source = std::io::Error::other(error.to_string()).into();
    let context = "recording job outcomes (batched)".to_owned();
    match error {
        StoreError::Unavailable { .. } => StoreError::Unavailable { context, source },
        StoreError::Conflict { .. } => StoreError::Conflict { context, source },
        StoreError::Config(message) => StoreError::Config(message.clone()),
        _ => StoreError::Backend { context, source },
    }
}
