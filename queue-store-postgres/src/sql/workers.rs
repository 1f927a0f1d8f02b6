//! The workers table: the registry of live worker processes, one row per
//! worker name, beside the job table as `<table>_workers`, versioned like
//! the default table. Its DDL and the statements that beat into it and
//! read it.

use super::default_table::{derived_name, MigrationSql};
use crate::ident::{Ident, QualifiedName};

/// The workers table of `table`: `<table>_workers` in the same schema.
pub(crate) fn workers_table(table: &QualifiedName) -> QualifiedName {
    let name =
        Ident::new(derived_name(&table.name, "workers")).unwrap_or_else(|_| table.name.clone());
    QualifiedName::new(table.schema.clone(), name)
}

/// Every version of the workers table's schema, oldest first.
pub(crate) fn migrations(workers: &QualifiedName) -> Vec<MigrationSql> {
    vec![MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 1,
        name: "the workers table: each live worker's host, pid, kinds, load and last beat",
        statements: vec![
            format!("CREATE SCHEMA IF NOT EXISTS {}", workers.schema.quoted()),
            format!(
                "CREATE TABLE {} (\
                 \"name\" text PRIMARY KEY, \
                 \"host\" text NOT NULL, \
                 \"pid\" bigint NOT NULL, \
                 \"kinds\" text[] NOT NULL, \
                 \"handlers\" bigint NOT NULL, \
                 \"in_flight\" bigint NOT NULL, \
                 \"started_at\" timestamptz NOT NULL, \
                 \"last_seen_at\" timestamptz NOT NULL)",
                workers.quoted()
            ),
        ],
    }]
}

/// Records a beat at the database's time: `$1` name, `$2` host, `$3` pid,
/// `$4` kinds, `$5` handlers, `$6` in flight, `$7` started at; and drops
/// the rows of other workers silent for an hour.
pub(crate) fn beat(workers: &QualifiedName) -> String {
    let w = workers.quoted();
    format!(
        "WITH gone AS (DELETE FROM {w} WHERE \"last_seen_at\" < now() - interval '1 hour' \
         AND \"name\" <> $1) \
         INSERT INTO {w} AS w (\"name\", \"host\", \"pid\", \"kinds\", \"handlers\", \"in_flight\", \
         \"started_at\", \"last_seen_at\") VALUES ($1, $2, $3, $4, $5, $6, $7, now()) \
         ON CONFLICT (\"name\") DO UPDATE SET \"host\" = EXCLUDED.\"host\", \"pid\" = EXCLUDED.\"pid\", \
         \"kinds\" = EXCLUDED.\"kinds\", \"handlers\" = EXCLUDED.\"handlers\", \
         \"in_flight\" = EXCLUDED.\"in_flight\", \"started_at\" = EXCLUDED.\"started_at\", \
         \"last_seen_at\" = now()"
    )
}

/// The workers seen at or after `$1`, by name.
pub(crate) fn read(workers: &QualifiedName) -> String {
    format!(
        "SELECT \"name\", \"host\", \"pid\", \"kinds\", \"handlers\", \"in_flight\", \"started_at\", \
         \"last_seen_at\" FROM {} WHERE \"last_seen_at\" >= $1 ORDER BY \"name\"",
        workers.quoted()
    )
}

/// Removes worker `$1`.
pub(crate) fn leave(workers: &QualifiedName) -> String {
    format!("DELETE FROM {} WHERE \"name\" = $1", workers.quoted())
}
