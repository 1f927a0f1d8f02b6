//! The kinds table: what the store keeps per kind across every process
//! (which kinds are paused, since when and by whom), beside the job table
//! as `<table>_kinds`, versioned like the default table.
//!
//! Its DDL, and the statements that pause, resume and read the pauses.
//! Times are the database's own (`now()`): a pause is the store's record,
//! not a caller's claim about the time.

use super::default_table::{derived_name, MigrationSql};
use crate::ident::{Ident, QualifiedName};

/// The kinds table of `table`: `<table>_kinds` in the same schema.
pub(crate) fn kinds_table(table: &QualifiedName) -> QualifiedName {
    let name =
        Ident::new(derived_name(&table.name, "kinds")).unwrap_or_else(|_| table.name.clone());
    QualifiedName::new(table.schema.clone(), name)
}

/// Every version of the kinds table's schema, oldest first.
pub(crate) fn migrations(kinds: &QualifiedName) -> Vec<MigrationSql> {
    let k = kinds.quoted();
    vec![MigrationSql {
        version: 1,
        name: "the kinds table: which kinds are paused, since when and by whom",
        statements: vec![
            format!("CREATE SCHEMA IF NOT EXISTS {}", kinds.schema.quoted()),
            // A row stays when its kind is resumed: the kind's settings to
            // come (limits) live on it too.
            format!(
                "CREATE TABLE {k} (\
                 \"kind\" text PRIMARY KEY, \
                 \"paused_at\" timestamptz, \
                 \"paused_by\" text, \
                 CHECK ((\"paused_at\" IS NULL) = (\"paused_by\" IS NULL)))"
            ),
        ],
    }]
}

/// The paused kinds alone, for claims: `kind`.
pub(crate) fn paused_kinds(kinds: &QualifiedName) -> String {
    format!(
        "SELECT \"kind\" FROM {} WHERE \"paused_at\" IS NOT NULL",
        kinds.quoted()
    )
}

/// The pauses: `kind`, `paused_at`, `paused_by`, by kind.
pub(crate) fn pauses(kinds: &QualifiedName) -> String {
    format!(
        "SELECT \"kind\", \"paused_at\", \"paused_by\" FROM {} \
         WHERE \"paused_at\" IS NOT NULL ORDER BY \"kind\"",
        kinds.quoted()
    )
}

/// Pauses kind `$1` for `$2` now, or keeps the pause in force; returns it.
pub(crate) fn pause(kinds: &QualifiedName) -> String {
    format!(
        "INSERT INTO {} AS k (\"kind\", \"paused_at\", \"paused_by\") VALUES ($1, now(), $2) \
         ON CONFLICT (\"kind\") DO UPDATE SET \
         \"paused_at\" = coalesce(k.\"paused_at\", EXCLUDED.\"paused_at\"), \
         \"paused_by\" = coalesce(k.\"paused_by\", EXCLUDED.\"paused_by\") \
         RETURNING \"kind\", \"paused_at\", \"paused_by\"",
        kinds.quoted()
    )
}

/// Resumes kind `$1` if it is paused, and wakes the workers listening on
/// channel `$2`; returns the pause it ended (no row: none).
pub(crate) fn resume(kinds: &QualifiedName) -> String {
    let k = kinds.quoted();
    format!(
        "WITH ended AS (SELECT \"kind\", \"paused_at\", \"paused_by\" FROM {k} \
         WHERE \"kind\" = $1 AND \"paused_at\" IS NOT NULL FOR UPDATE), \
         cleared AS (UPDATE {k} AS k SET \"paused_at\" = NULL, \"paused_by\" = NULL \
         FROM ended WHERE k.\"kind\" = ended.\"kind\") \
         SELECT ended.\"kind\", ended.\"paused_at\", ended.\"paused_by\", \
         (SELECT 1 FROM pg_notify($2, '')) AS \"__queue_notified\" FROM ended"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> QualifiedName {
        QualifiedName::new(
            Ident::new("app").expect("valid"),
            Ident::new("jobs").expect("valid"),
        )
    }

    #[test]
    fn the_kinds_table_sits_beside_the_job_table() {
        assert_eq!(kinds_table(&table()).quoted(), "\"app\".\"jobs_kinds\"");
        let long = QualifiedName::new(
            Ident::new("app").expect("valid"),
            Ident::new("j".repeat(63)).expect("valid"),
        );
        assert_eq!(
            kinds_table(&long).name.as_str().len(),
            63,
            "cut to the limit"
        );
    }

    #[test]
    fn a_pause_is_kept_and_a_resume_wakes_workers() {
        let kinds = kinds_table(&table());
        assert!(pause(&kinds).contains("coalesce(k.\"paused_at\", EXCLUDED.\"paused_at\")"));
        assert!(resume(&kinds).contains("pg_notify($2, '')"));
        assert!(
            migrations(&kinds)[0].statements[1].starts_with("CREATE TABLE \"app\".\"jobs_kinds\"")
        );
    }
}
