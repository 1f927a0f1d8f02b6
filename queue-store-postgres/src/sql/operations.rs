//! The operations table: bulk operations by filter, one row each, beside
//! the job table as `<table>_operations`, versioned like the default
//! table. Its DDL and the statements that record, take, step, abort and
//! read operations. Every change of state is guarded by the state it
//! leaves, and timed by the database's clock.

use queue_core::OperationState;

use super::default_table::{derived_name, MigrationSql};
use crate::ident::{Ident, QualifiedName};

/// The operations table of `table`: `<table>_operations` in the same
/// schema.
pub(crate) fn operations_table(table: &QualifiedName) -> QualifiedName {
    let name =
        Ident::new(derived_name(&table.name, "operations")).unwrap_or_else(|_| table.name.clone());
    QualifiedName::new(table.schema.clone(), name)
}

/// Every version of the operations table's schema, oldest first.
pub(crate) fn migrations(operations: &QualifiedName) -> Vec<MigrationSql> {
    let states: Vec<String> = OperationState::ALL
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    let ops = operations.quoted();
    vec![MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 1,
        name: "the operations table: bulk operations by filter, their progress and who ran them",
        statements: vec![
            format!("CREATE SCHEMA IF NOT EXISTS {}", operations.schema.quoted()),
            format!(
                "CREATE TABLE {ops} (\
                 \"id\" bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 \"action\" jsonb NOT NULL, \
                 \"filter\" jsonb NOT NULL, \
                 \"by\" text NOT NULL, \
                 \"state\" text NOT NULL DEFAULT 'pending' CHECK (\"state\" IN ({})), \
                 \"total\" bigint NOT NULL CHECK (\"total\" >= 0), \
                 \"done\" bigint NOT NULL DEFAULT 0, \
                 \"batch\" integer NOT NULL CHECK (\"batch\" > 0), \
                 \"runner\" text, \
                 \"cursor\" text, \
                 \"message\" text, \
                 \"created_at\" timestamptz NOT NULL DEFAULT now(), \
                 \"started_at\" timestamptz, \
                 \"updated_at\" timestamptz NOT NULL DEFAULT now(), \
                 \"finished_at\" timestamptz)",
                states.join(", ")
            ),
            // Runners look for work every second: only the few operations
            // not yet ended are read.
            format!(
                "CREATE INDEX {} ON {ops} (\"id\") WHERE \"state\" IN ('pending', 'running', 'interrupted')",
                Ident::new(derived_name(&operations.name, "open"))
                    .map(|i| i.quoted())
                    .unwrap_or_else(|_| "\"queue_operations_open\"".into())
            ),
        ],
    }]
}

/// The select list of an operation; the cursor cast back to the key type
/// `kt`.
fn columns(kt: &str) -> String {
    format!(
        "\"id\", \"action\", \"filter\", \"by\", \"state\", \"total\", \"done\", \"batch\", \
         \"runner\", CAST(\"cursor\" AS {kt}) AS \"cursor\", \"message\", \"created_at\", \
         \"started_at\", \"updated_at\", \"finished_at\""
    )
}

/// Records an operation, pending: `$1` action, `$2` filter, `$3` by, `$4`
/// total, `$5` batch.
pub(crate) fn create(ops: &QualifiedName, kt: &str) -> String {
    format!(
        "INSERT INTO {} (\"action\", \"filter\", \"by\", \"total\", \"batch\") \
         VALUES ($1, $2, $3, $4, $5) RETURNING {}",
        ops.quoted(),
        columns(kt)
    )
}

/// Operation `$1`.
pub(crate) fn get(ops: &QualifiedName, kt: &str) -> String {
    format!(
        "SELECT {} FROM {} WHERE \"id\" = $1",
        columns(kt),
        ops.quoted()
    )
}

/// Operations newest first: before id `$1` (if not null), in states `$2`
/// (if not null), at most `$3`.
pub(crate) fn list(ops: &QualifiedName, kt: &str) -> String {
    format!(
        "SELECT {} FROM {} WHERE ($1::int8 IS NULL OR \"id\" < $1) \
         AND ($2::text[] IS NULL OR \"state\" = ANY($2)) ORDER BY \"id\" DESC LIMIT $3",
        columns(kt),
        ops.quoted()
    )
}

/// Gives runner `$1` an operation: `$2` alone if not null (pending,
/// interrupted, or running with a runner silent for `$3` seconds), else the
/// oldest pending one or running one with a silent runner. The row is
/// locked skipping rows another runner is taking, and the state checked
/// again as the row is changed.
pub(crate) fn take(ops: &QualifiedName, kt: &str) -> String {
    let takeable = "(\"state\" = 'pending' \
         OR (\"state\" = 'running' AND \"updated_at\" < now() - make_interval(secs => $3)) \
         OR ($2::int8 IS NOT NULL AND \"state\" = 'interrupted'))";
    let o = ops.quoted();
    format!(
        "UPDATE {o} SET \"state\" = 'running', \"runner\" = $1, \
         \"started_at\" = coalesce(\"started_at\", now()), \"updated_at\" = now(), \"message\" = NULL \
         WHERE \"id\" = (SELECT \"id\" FROM {o} WHERE ($2::int8 IS NULL OR \"id\" = $2) AND {takeable} \
         ORDER BY \"id\" LIMIT 1 FOR UPDATE SKIP LOCKED) AND {takeable} RETURNING {}",
        columns(kt)
    )
}

/// Records a batch of operation `$1` by runner `$2` while it holds it
/// (running, or aborted since): `$3` more done, cursor `$4` (kept if
/// null), and, if `$5` is not null and the operation still running, its
/// new state `$5` with message `$6`.
pub(crate) fn step(ops: &QualifiedName, kt: &str) -> String {
    let ending = "\"state\" = 'running' AND $5::text IS NOT NULL";
    format!(
        "UPDATE {} SET \"done\" = \"done\" + $3, \
         \"cursor\" = coalesce(CAST(CAST($4 AS {kt}) AS text), \"cursor\"), \"updated_at\" = now(), \
         \"state\" = CASE WHEN {ending} THEN $5 ELSE \"state\" END, \
         \"message\" = CASE WHEN {ending} THEN $6 ELSE \"message\" END, \
         \"finished_at\" = CASE WHEN {ending} AND $5 IN ('done', 'aborted', 'failed') THEN now() \
         ELSE \"finished_at\" END \
         WHERE \"id\" = $1 AND \"runner\" = $2 AND \"state\" IN ('running', 'aborted') RETURNING {}",
        ops.quoted(),
        columns(kt)
    )
}

/// Removes the operations that ended more than `$1` seconds ago.
pub(crate) fn prune(ops: &QualifiedName) -> String {
    format!(
        "DELETE FROM {} WHERE \"state\" IN ('done', 'aborted', 'failed') \
         AND \"finished_at\" < now() - make_interval(secs => $1)",
        ops.quoted()
    )
}

/// Aborts operation `$1` if it has not ended, with message `$2`.
pub(crate) fn abort(ops: &QualifiedName, kt: &str) -> String {
    format!(
        "UPDATE {} SET \"state\" = 'aborted', \"message\" = $2, \"finished_at\" = now(), \
         \"updated_at\" = now() WHERE \"id\" = $1 AND \"state\" IN ('pending', 'running', 'interrupted') \
         RETURNING {}",
        ops.quoted(),
        columns(kt)
    )
}
