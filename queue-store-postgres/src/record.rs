//! Records and keys: what a claimed row decodes into.

use chrono::{DateTime, Utc};
use queue_core::{Job, JobId, JobRecord, JobState, Lease, LogEntry};
use sqlx::postgres::{PgHasArrayType, PgRow};
use sqlx::{Column as _, Postgres, Row};

use crate::options::{Column, PgStoreOptions};

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

/// Decodes one claimed row of a claim with a narrow select list, with the
/// row's lease and what the claim wrote.
pub(crate) type ClaimedDecoder<R> =
    fn(&PgRow, &Lease<<R as JobRecord>::Id>, &ClaimWrites<'_>) -> Result<R, sqlx::Error>;

/// How a store turns claimed rows into records.
pub(crate) enum RecordDecoder<R: JobRecord> {
    /// From the select list alone.
    Row(Decoder<R>),
    /// From the columns the claim did not write ([`claimed_job_select`]),
    /// the row's lease (read from the claim's own columns already) and what
    /// the claim wrote.
    Claimed(ClaimedDecoder<R>),
}

impl<R: JobRecord> RecordDecoder<R> {
    pub(crate) fn decode(
        &self,
        row: &PgRow,
        lease: &Lease<R::Id>,
        writes: &ClaimWrites<'_>,
    ) -> Result<R, sqlx::Error> {
        match self {
            RecordDecoder::Row(decode) => decode(row),
            RecordDecoder::Claimed(decode) => decode(row, lease, writes),
        }
    }
}

/// What a claim wrote into every row it took, besides its state, a new
/// claim token and an empty execution log.
pub(crate) struct ClaimWrites<'a> {
    /// The start and heartbeat time, as stored: to the microsecond.
    pub now: DateTime<Utc>,
    /// The worker's name.
    pub worker: &'a str,
}

impl<'a> ClaimWrites<'a> {
    pub(crate) fn new(now: DateTime<Utc>, worker: &'a str) -> Self {
        // Postgres keeps microseconds, and sqlx sends them truncated.
        let now = DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
        ClaimWrites { now, worker }
    }
}

/// The default table's columns a claim does not write, in the order the
/// claim returns them after its four `__queue_*` columns, each with the
/// standard column it is.
const CLAIM_READS: [(&str, Column); 9] = [
    ("kind", Column::Kind),
    ("payload", Column::Payload),
    ("priority", Column::Priority),
    ("failure_message", Column::FailureMessage),
    ("queued_at", Column::QueuedAt),
    ("finished_at", Column::FinishedAt),
    ("process_after", Column::ProcessAfter),
    ("num_resets", Column::NumResets),
    ("cancel", Column::Cancel),
];

/// The columns of a [`Job`] a claim writes ([`ClaimWrites`], the state,
/// the claim token, and an empty execution log) or returns already (the
/// key and the failure count).
const CLAIM_WRITES: [Column; 6] = [
    Column::StartedAt,
    Column::LastHeartbeatAt,
    Column::WorkerHostname,
    Column::ExecutionLogs,
    Column::ClaimToken,
    Column::NumFailures,
];

/// The select list of a claim on the default table that reads back only
/// the columns it did not write ([`CLAIM_READS`], named as in the default
/// table), or `None` if the options declare a column of a [`Job`] absent.
/// A claim returning the whole row (`alias.*`) spent 5-8 % more executor
/// time per row, and the worker 2-3 µs more CPU per job, sending and
/// decoding values the worker knows.
pub(crate) fn claimed_job_select(options: &PgStoreOptions) -> Option<String> {
    if CLAIM_WRITES
        .iter()
        .any(|c| options.column_name(*c).is_none())
    {
        return None;
    }
    let alias = options.alias.quoted();
    let columns = CLAIM_READS
        .iter()
        .map(|(name, column)| {
            let stored = options.column_name(*column)?.quoted();
            Some(format!("{alias}.{stored} AS \"{name}\""))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(columns.join(", "))
}

/// Decodes a row of a claim whose select list is [`claimed_job_select`]
/// into a [`Job`], with its lease (the key, the token and the failure count
/// the claim returned) and what the claim wrote.
pub(crate) fn decode_claimed_job(
    row: &PgRow,
    lease: &Lease<i64>,
    writes: &ClaimWrites<'_>,
) -> Result<Job, sqlx::Error> {
    // CLAIM_READS follow the claim's four columns, in order. On failure,
    // again by name: the error then names the column.
    fn at<'r, T>(row: &'r PgRow, (index, name): (usize, &str)) -> Result<T, sqlx::Error>
    where
        T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
    {
        row.try_get(index).or_else(|_| row.try_get(name))
    }
    let read = |n: usize| (4 + n, CLAIM_READS[n].0);
    Ok(Job {
        id: lease.id,
        kind: at(row, read(0))?,
        payload: at(row, read(1))?,
        priority: at(row, read(2))?,
        state: JobState::Processing,
        failure_message: at(row, read(3))?,
        queued_at: at(row, read(4))?,
        started_at: Some(writes.now),
        finished_at: at(row, read(5))?,
        process_after: at(row, read(6))?,
        num_resets: at(row, read(7))?,
        num_failures: i32::try_from(lease.attempt - 1).map_err(|e| sqlx::Error::ColumnDecode {
            index: "num_failures".into(),
            source: Box::new(e),
        })?,
        last_heartbeat_at: Some(writes.now),
        execution_logs: Vec::new(),
        worker_hostname: Some(writes.worker.to_owned()),
        cancel: at(row, read(8))?,
        claim_token: lease.token,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_on_the_default_table_reads_the_columns_it_does_not_write_by_standard_name() {
        let options = PgStoreOptions::new("jobs").unwrap();
        assert_eq!(
            claimed_job_select(&options).as_deref(),
            Some(
                "\"jobs\".\"kind\" AS \"kind\", \"jobs\".\"payload\" AS \"payload\", \
                 \"jobs\".\"priority\" AS \"priority\", \"jobs\".\"failure_message\" AS \"failure_message\", \
                 \"jobs\".\"queued_at\" AS \"queued_at\", \"jobs\".\"finished_at\" AS \"finished_at\", \
                 \"jobs\".\"process_after\" AS \"process_after\", \"jobs\".\"num_resets\" AS \"num_resets\", \
                 \"jobs\".\"cancel\" AS \"cancel\""
            )
        );
        let renamed = options
            .clone()
            .column(Column::QueuedAt, "enqueued \"at\"")
            .unwrap();
        assert!(claimed_job_select(&renamed)
            .unwrap()
            .contains("\"jobs\".\"enqueued \"\"at\"\"\" AS \"queued_at\""));
        // A column the record reads, or one the claim writes for it, absent:
        // the claim returns the whole row instead.
        for absent in [Column::Cancel, Column::WorkerHostname] {
            let without = options.clone().without(absent).unwrap();
            assert_eq!(claimed_job_select(&without), None, "{absent:?}");
        }
    }
}
