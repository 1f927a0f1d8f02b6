//! The audit table: every operator's write, one row each, beside the job
//! table as `<table>_audit`, versioned like the default table. Its DDL and
//! the statements that append to it and read it.

use super::default_table::{derived_name, MigrationSql};
use crate::ident::{Ident, QualifiedName};

/// The audit table of `table`: `<table>_audit` in the same schema.
pub(crate) fn audit_table(table: &QualifiedName) -> QualifiedName {
    let name =
        Ident::new(derived_name(&table.name, "audit")).unwrap_or_else(|_| table.name.clone());
    QualifiedName::new(table.schema.clone(), name)
}

/// Every version of the audit table's schema, oldest first.
pub(crate) fn migrations(audit: &QualifiedName) -> Vec<MigrationSql> {
    vec![MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 1,
        name: "the audit table: who did what to which jobs, when, and how it ended",
        statements: vec![
            format!("CREATE SCHEMA IF NOT EXISTS {}", audit.schema.quoted()),
            format!(
                "CREATE TABLE {} (\
                 \"id\" bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 \"at\" timestamptz NOT NULL DEFAULT now(), \
                 \"actor\" text NOT NULL, \
                 \"action\" text NOT NULL, \
                 \"target\" jsonb NOT NULL, \
                 \"outcome\" text NOT NULL, \
                 \"ok\" boolean NOT NULL)",
                audit.quoted()
            ),
        ],
    }]
}

/// Appends entries in the order given, one per element of the arrays:
/// `$1` actors, `$2` actions, `$3` targets, `$4`
/// outcomes, `$5` oks. Its commit does not wait for the WAL flush: the
/// write an entry records committed before it, and a second flush per
/// request cost single-job enqueues over HTTP a fifth of their rate.
pub(crate) fn append(audit: &QualifiedName) -> String {
    format!(
        "INSERT INTO {} (\"actor\", \"action\", \"target\", \"outcome\", \"ok\") \
         SELECT e.actor, e.action, e.target, e.outcome, e.ok \
         FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::text[], $5::bool[]) WITH ORDINALITY \
         AS e(actor, action, target, outcome, ok, n) \
         WHERE {} ORDER BY n",
        audit.quoted(),
        super::SYNCHRONOUS_COMMIT_OFF
    )
}

/// Entries newest first: before id `$1` (if not null), of actor `$2` (if
/// not null), at most `$3`.
pub(crate) fn read(audit: &QualifiedName) -> String {
    format!(
        "SELECT \"id\", \"at\", \"actor\", \"action\", \"target\", \"outcome\", \"ok\" FROM {} \
         WHERE ($1::int8 IS NULL OR \"id\" < $1) AND ($2::text IS NULL OR \"actor\" = $2) \
         ORDER BY \"id\" DESC LIMIT $3",
        audit.quoted()
    )
}
