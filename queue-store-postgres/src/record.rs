//! Records and keys: what a claimed row decodes into.

use queue_core::{Job, JobId, JobState, LogEntry};
use sqlx::postgres::{PgHasArrayType, PgRow};
use sqlx::{Postgres, Row};

/// A key type the store can use: integer, bigint, uuid or text columns.
pub trait PgKey:
    JobId
    + for<'q> sqlx::Encode<'q, Postgres>
    + for<'r> sqlx::Decode<'r, Postgres>
    + sqlx::Type<Postgres>
    + PgHasArrayType
    + Unpin
{
    /// The column types (as `format_type` spells them) this key decodes from.
    const PG_TYPES: &'static [&'static str];
}

impl PgKey for i32 {
    const PG_TYPES: &'static [&'static str] = &["integer"];
}

impl PgKey for i64 {
    const PG_TYPES: &'static [&'static str] = &["bigint"];
}

impl PgKey for uuid::Uuid {
    const PG_TYPES: &'static [&'static str] = &["uuid"];
}

impl PgKey for String {
    const PG_TYPES: &'static [&'static str] = &["text", "character varying"];
}

/// Decodes one claimed row (the select list) into a record.
pub type Decoder<R> = fn(&PgRow) -> Result<R, sqlx::Error>;

/// Decodes a row of the default table into a [`Job`].
pub fn decode_job(row: &PgRow) -> Result<Job, sqlx::Error> {
    let state: String = row.try_get("state")?;
    let state = JobState::ALL
        .into_iter()
        .find(|s| s.as_str() == state)
        .ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: format!("{state:?} is not a state of the default table").into(),
        })?;
    let logs: Option<Vec<serde_json::Value>> = row.try_get("execution_logs")?;
    let execution_logs = logs
        .unwrap_or_default()
        .into_iter()
        .map(serde_json::from_value::<LogEntry>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| sqlx::Error::ColumnDecode {
            index: "execution_logs".into(),
            source: Box::new(e),
        })?;
    Ok(Job {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        priority: row.try_get("priority")?,
        state,
        failure_message: row.try_get("failure_message")?,
        queued_at: row.try_get("queued_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        process_after: row.try_get("process_after")?,
        num_resets: row.try_get("num_resets")?,
        num_failures: row.try_get("num_failures")?,
        last_heartbeat_at: row.try_get("last_heartbeat_at")?,
        execution_logs,
        worker_hostname: row.try_get("worker_hostname")?,
        cancel: row.try_get("cancel")?,
        claim_token: row.try_get("claim_token")?,
    })
}
