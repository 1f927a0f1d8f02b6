//! Records and keys: what a claimed row decodes into.

use queue_core::{Job, JobId, JobState, LogEntry};
use sqlx::postgres::{PgHasArrayType, PgRow};
use sqlx::{Column, Postgres, Row};

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

/// The default table's columns, in the order it creates them.
pub(crate) const DEFAULT_COLUMNS: [&str; 17] = [
    "id",
    "kind",
    "payload",
    "priority",
    "state",
    "failure_message",
    "queued_at",
    "started_at",
    "finished_at",
    "process_after",
    "num_resets",
    "num_failures",
    "last_heartbeat_at",
    "execution_logs",
    "worker_hostname",
    "cancel",
    "claim_token",
];

/// Finds a row's columns by name, trying first where the default table's
/// column order puts them (a claim returns thousands of rows with the same
/// columns: comparing one name is cheaper than hashing it for every read).
struct Columns<'r> {
    row: &'r PgRow,
    /// Where the `id` column is: the default table's columns follow it in
    /// order unless the table was altered.
    base: usize,
}

impl<'r> Columns<'r> {
    fn new(row: &'r PgRow) -> Self {
        let base = row
            .columns()
            .iter()
            .position(|c| c.name() == DEFAULT_COLUMNS[0])
            .unwrap_or(0);
        Columns { row, base }
    }

    /// Decodes column `n` of [`DEFAULT_COLUMNS`].
    fn get<T>(&self, n: usize) -> Result<T, sqlx::Error>
    where
        T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
    {
        let name = DEFAULT_COLUMNS[n];
        match self.row.columns().get(self.base + n) {
            // On failure, again by name: the error then names the column.
            Some(column) if column.name() == name => self
                .row
                .try_get(self.base + n)
                .or_else(|_| self.row.try_get(name)),
            _ => self.row.try_get(name),
        }
    }
}

/// Decodes a row of the default table into a [`Job`].
pub fn decode_job(row: &PgRow) -> Result<Job, sqlx::Error> {
    let c = Columns::new(row);
    let state: &str = c.get(4)?;
    let state = JobState::ALL
        .into_iter()
        .find(|s| s.as_str() == state)
        .ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: format!("{state:?} is not a state of the default table").into(),
        })?;
    let logs: Option<Vec<serde_json::Value>> = c.get(13)?;
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
        id: c.get(0)?,
        kind: c.get(1)?,
        payload: c.get(2)?,
        priority: c.get(3)?,
        state,
        failure_message: c.get(5)?,
        queued_at: c.get(6)?,
        started_at: c.get(7)?,
        finished_at: c.get(8)?,
        process_after: c.get(9)?,
        num_resets: c.get(10)?,
        num_failures: c.get(11)?,
        last_heartbeat_at: c.get(12)?,
        execution_logs,
        worker_hostname: c.get(14)?,
        cancel: c.get(15)?,
        claim_token: c.get(16)?,
    })
}
