//! The one way jobs are enqueued, whichever door they come in by: the
//! admin contract on any table ([`PgAdmin`](crate::PgAdmin)), the default
//! table's [`JobTable`](crate::JobTable), on the store's pool or on the
//! caller's connection, and diesel. Each runs a table's
//! [`EnqueueStatements`] with the values [`job_value`] binds, and keeps
//! unique keys by [`Rounds`].

use queue_core::{Enqueued, JobLimits, NewJob, StoreError, UniqueScope};
use sqlx::Row;

use crate::bind::{query, Value};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::enqueue::EnqueueStatements;
use crate::sql::{Param, Statement};
use crate::unique::{Answer, Rounds};

/// The value of the enqueue statements' `param` for `jobs`: one array
/// element per job, in order, or the first job's field for a statement of
/// one ([`EnqueueStatements::one`]). `None` for a parameter that is not
/// the jobs' ([`Param::Channel`] is the caller's).
pub(crate) fn job_value<K>(jobs: &[NewJob], param: Param) -> Option<Value<K>> {
    let first = jobs.first();
    Some(match param {
        Param::Kind => Value::Text(first?.kind.clone()),
        Param::Payload => Value::Json(first?.payload.clone()),
        Param::Priority => Value::Int(i64::from(first?.priority)),
        Param::ProcessAfter => Value::OptTime(first?.process_after),
        Param::Kinds => Value::Texts(jobs.iter().map(|j| Some(j.kind.clone())).collect()),
        Param::Payloads => Value::Jsons(jobs.iter().map(|j| j.payload.clone()).collect()),
        Param::Priorities => Value::Ints(jobs.iter().map(|j| i64::from(j.priority)).collect()),
        Param::ProcessAfters => Value::Times(jobs.iter().map(|j| j.process_after).collect()),
        Param::UniqueKeys => Value::Texts(
            jobs.iter()
                .map(|j| j.unique.as_ref().map(|u| u.key.clone()))
                .collect(),
        ),
        Param::UniqueForevers => Value::Bools(
            jobs.iter()
                .map(|j| {
                    j.unique
                        .as_ref()
                        .is_some_and(|u| u.scope == UniqueScope::Forever)
                })
                .collect(),
        ),
        Param::MaxAttemptses => Value::OptInts(
            jobs.iter()
                .map(|j| j.limits.max_attempts.map(i64::from))
                .collect(),
        ),
        Param::ExpiresAts => Value::Times(jobs.iter().map(|j| j.expires_at).collect()),
        Param::AtMostOnces => Value::Bools(jobs.iter().map(|j| j.limits.at_most_once).collect()),
        _ => return None,
    })
}

/// Whether any of `jobs` has a unique key: the enqueue then runs the
/// unique statement, in rounds.
pub(crate) fn any_unique(jobs: &[NewJob]) -> bool {
    jobs.iter().any(|j| j.unique.is_some())
}

/// The statement that enqueues `jobs`, none with a unique key: the bare
/// insert when none sets a limit or an expiry.
pub(crate) fn plain_statement<'s>(
    statements: &'s EnqueueStatements,
    jobs: &[NewJob],
) -> &'s Statement {
    let bare = jobs
        .iter()
        .all(|j| j.limits == JobLimits::default() && j.expires_at.is_none());
    if bare && jobs.len() == 1 {
        &statements.one
    } else if bare {
        &statements.bare
    } else {
        &statements.plain
    }
}

/// The refusal of unique keys on a table without a unique-key column.
pub(crate) fn no_unique_column(table: &str) -> StoreError {
    StoreError::Refused(format!(
        "table {table} has no unique_key column, so a unique key would be ignored; map one (Column::UniqueKey) with a unique index on it, or enqueue without a key"
    ))
}

/// Enqueues `jobs` into `table` with its `statements`, on `conn` (inside
/// whatever transaction it has open; `channel` is the one the statements
/// notify where the table's trigger does not); returns, in order, each
/// one's key and whether it was added.
pub(crate) async fn enqueue_on<K: PgKey>(
    conn: &mut sqlx::PgConnection,
    statements: &EnqueueStatements,
    table: &(dyn std::fmt::Display + Sync),
    channel: &str,
    jobs: &[NewJob],
) -> Result<Vec<Enqueued<K>>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let value = |jobs: &[NewJob], p: Param| match p {
        Param::Channel => Some(Value::Text(channel.to_owned())),
        other => job_value(jobs, other),
    };
    if !any_unique(jobs) {
        let context = "enqueueing jobs";
        let rows = query::<K>(plain_statement(statements, jobs), |p| value(jobs, p))?
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| store_error(context, e))?;
        return rows
            .iter()
            .map(|row| {
                row.try_get(0)
                    .map(|id| Enqueued { id, inserted: true })
                    .map_err(|e| store_error(context, e))
            })
            .collect();
    }
    let Some(statement) = &statements.unique else {
        return Err(no_unique_column(&table.to_string()));
    };
    let context = "enqueueing unique jobs";
    let mut rounds = Rounds::new(jobs);
    while let Some(batch) = rounds.next_batch() {
        let rows = query::<K>(statement, |p| value(&batch, p))?
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| store_error(context, e))?;
        let mut answers = Vec::with_capacity(rows.len());
        for row in &rows {
            let read = |e| store_error(context, e);
            answers.push(Answer {
                id: row.try_get("id").map_err(read)?,
                key: row.try_get("unique_key").map_err(read)?,
                inserted: row.try_get("inserted").map_err(read)?,
            });
        }
        rounds.record(&batch, answers);
    }
    rounds.finish()
}
