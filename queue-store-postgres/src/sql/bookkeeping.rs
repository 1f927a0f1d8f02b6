//! The bookkeeping table: what a mapped table lacks of a job's bookkeeping
//! (claim token, claim time, heartbeat, reset and failure counts, worker,
//! cancel flag, execution log), kept by the store beside it, one row per
//! job key while the job runs or carries counts a retry must keep.
//!
//! Its DDL (versioned like the default table), and the names the store's
//! statements use for it: the statements join it as [`SIDE`], so that a
//! bookkeeping column reads `"__queue_side"."column"` wherever it lives.

use super::default_table::MigrationSql;
use crate::ident::QualifiedName;
use crate::options::Column;

/// The alias every statement gives the bookkeeping table (or the rows a
/// statement just wrote to it).
pub(crate) const SIDE: &str = "\"__queue_side\"";

/// The key column of the bookkeeping table.
pub(crate) const KEY: &str = "\"job_key\"";

/// What every change of a claim token adds: a random step (up to 2^30),
/// so that a claim made again after one the server forgot in a crash gets
/// a token of its own.
pub(crate) const TOKEN_STEP: &str = "1 + floor(random() * 1073741824)::int8";

/// `table AS alias`, with the bookkeeping table `side` joined as [`SIDE`]
/// when the store keeps one (`id`: `alias."key"`): what a statement
/// reading bookkeeping columns selects from.
pub(crate) fn from_table(table: &str, alias: &str, id: &str, side: Option<&Side>) -> String {
    let join = side.map(|s| s.left_join(id)).unwrap_or_default();
    format!("{table} AS {alias}{join}")
}

/// The standard columns the bookkeeping table can carry, each under its
/// standard name.
pub(crate) const COLUMNS: [Column; 8] = [
    Column::ClaimToken,
    Column::StartedAt,
    Column::LastHeartbeatAt,
    Column::NumResets,
    Column::NumFailures,
    Column::WorkerHostname,
    Column::Cancel,
    Column::ExecutionLogs,
];

/// The bookkeeping table of a store: where it is, and which standard
/// columns it carries for the table (those the table lacks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Side {
    /// Quoted and schema-qualified.
    pub table: String,
    /// The columns it carries.
    pub columns: Vec<Column>,
}

impl Side {
    /// Whether it carries `column`.
    pub fn carries(&self, column: Column) -> bool {
        self.columns.contains(&column)
    }

    /// `LEFT JOIN side AS "__queue_side" ON key = id`: for a statement that
    /// reads the table as `alias` (`id`: `alias."key"`).
    pub fn left_join(&self, id: &str) -> String {
        format!(" LEFT JOIN {} AS {SIDE} ON {SIDE}.{KEY} = {id}", self.table)
    }
}

/// Every version of a bookkeeping table's schema, oldest first; `key_type`
/// is the mapped table's key type (`format_type`), which its key shares.
pub(crate) fn migrations(side: &QualifiedName, key_type: &str) -> Vec<MigrationSql> {
    let t = side.quoted();
    vec![MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 1,
        name: "the bookkeeping table: claim token, claim time, heartbeat, counts, worker, cancel flag and log per job key",
        statements: vec![
            format!("CREATE SCHEMA IF NOT EXISTS {}", side.schema.quoted()),
            // Rows come and go with every job: a lower fill factor keeps
            // heartbeats and count updates HOT.
            format!(
                "CREATE TABLE {t} (\
                 {KEY} {key_type} PRIMARY KEY, \
                 \"claim_token\" bigint NOT NULL DEFAULT 0, \
                 \"started_at\" timestamptz, \
                 \"last_heartbeat_at\" timestamptz, \
                 \"num_resets\" integer NOT NULL DEFAULT 0, \
                 \"num_failures\" integer NOT NULL DEFAULT 0, \
                 \"worker_hostname\" text, \
                 \"cancel\" boolean NOT NULL DEFAULT false, \
                 \"execution_logs\" jsonb[] NOT NULL DEFAULT '{{}}') \
                 WITH (fillfactor = 80)"
            ),
        ],
    }]
}

/// The side table's columns and types, as the catalog spells them, that
/// start-up checks it for.
pub(crate) const EXPECTED_TYPES: [(&str, &str); 8] = [
    ("claim_token", "bigint"),
    ("started_at", "timestamp with time zone"),
    ("last_heartbeat_at", "timestamp with time zone"),
    ("num_resets", "integer"),
    ("num_failures", "integer"),
    ("worker_hostname", "text"),
    ("cancel", "boolean"),
    ("execution_logs", "jsonb[]"),
];
