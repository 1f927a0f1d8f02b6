//! The kinds table: what the store keeps per kind across every process
//! (which kinds are paused, since when and by whom; each kind's limits and
//! its rate limit's token bucket), beside the job table as
//! `<table>_kinds`, versioned like the default table.
//!
//! Its DDL, and the statements that pause, resume, set limits and read
//! them.
//! Times are the database's own (`now()`): a pause is the store's record,
//! not a caller's claim about the time.

use super::default_table::{derived, derived_name, MigrationSql};
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
        concurrent_indexes: Vec::new(),
        batched: false,
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
    }, MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 2,
        name: "limits per kind: how many run at once, how many start per second, and the rate's token bucket",
        statements: vec![format!(
            "ALTER TABLE {k} \
             ADD COLUMN \"max_running\" integer CHECK (\"max_running\" > 0), \
             ADD COLUMN \"per_second\" double precision CHECK (\"per_second\" > 0), \
             ADD COLUMN \"burst\" integer CHECK (\"burst\" > 0), \
             ADD COLUMN \"limits_set_at\" timestamptz, \
             ADD COLUMN \"limits_set_by\" text, \
             ADD COLUMN \"tokens\" double precision, \
             ADD COLUMN \"tokens_at\" timestamptz"
        )],
    }, MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 3,
        name: "a notification when pauses or limits change, so that workers go on what they read until one comes",
        statements: changes_trigger(kinds).to_vec(),
    }]
}

/// The trigger that tells listening workers the rules changed (channel
/// [`changes_channel`]'s), and its function.
fn changes_trigger(kinds: &QualifiedName) -> [String; 3] {
    let function = format!(
        "{}.{}",
        kinds.schema.quoted(),
        derived(&kinds.name, "changed")
    );
    let trigger = derived(&kinds.name, CHANGES_TRIGGER);
    [
        // The channel names the table by its oid: it fits any table name
        // (channels are cut at 63 bytes), and the trigger needs no rewrite
        // if the table is renamed.
        format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS \
             $queue$BEGIN PERFORM pg_notify('queue_kinds_' || TG_RELID::text, ''); RETURN NULL; END$queue$"
        ),
        format!("DROP TRIGGER IF EXISTS {trigger} ON {}", kinds.quoted()),
        // Statement level: one notification per statement, sent at commit.
        // Not on a bucket's tokens (`spend`): they change at every claim of
        // a rate-limited kind, and claims read them under the row's lock.
        format!(
            "CREATE TRIGGER {trigger} AFTER INSERT OR DELETE OR TRUNCATE OR \
             UPDATE OF \"kind\", \"paused_at\", \"max_running\", \"per_second\" ON {} \
             FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
            kinds.quoted()
        ),
    ]
}

/// The suffix of the name of the trigger that notifies changes of the
/// rules (`<kinds table>_changes`).
const CHANGES_TRIGGER: &str = "changes";

/// The channel on which changes of the rules in the kinds table `$1`
/// (quoted, qualified) are notified: `channel`; no row before the version
/// with the trigger.
pub(crate) const CHANGES_CHANNEL: &str =
    "SELECT 'queue_kinds_' || t.tgrelid::oid::text AS channel \
     FROM pg_catalog.pg_trigger t WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2 \
     AND t.tgenabled <> 'D'";

/// The name of the trigger of [`CHANGES_CHANNEL`] (`$2`).
pub(crate) fn changes_trigger_name(kinds: &QualifiedName) -> String {
    derived_name(&kinds.name, CHANGES_TRIGGER)
}

/// What claims heed, for each kind paused or limited: `kind`, `paused`,
/// `limited`.
pub(crate) fn rules(kinds: &QualifiedName) -> String {
    format!(
        "SELECT \"kind\", \"paused_at\" IS NOT NULL AS \"paused\", \
         (\"max_running\" IS NOT NULL OR \"per_second\" IS NOT NULL) AS \"limited\" FROM {} \
         WHERE \"paused_at\" IS NOT NULL OR \"max_running\" IS NOT NULL OR \"per_second\" IS NOT NULL",
        kinds.quoted()
    )
}

/// The columns of a kind's limits.
const LIMITS: &str =
    "\"kind\", \"max_running\", \"per_second\", \"burst\", \"limits_set_at\", \"limits_set_by\"";

/// The kinds with limits, by kind.
pub(crate) fn limits(kinds: &QualifiedName) -> String {
    format!(
        "SELECT {LIMITS} FROM {} WHERE \"max_running\" IS NOT NULL OR \"per_second\" IS NOT NULL \
         ORDER BY \"kind\"",
        kinds.quoted()
    )
}

/// Sets kind `$1`'s limits (`$2` max running, `$3` per second, `$4` burst;
/// all null: cleared) by `$5`, with a full bucket, and wakes the workers
/// listening on channel `$6`; returns the limits.
pub(crate) fn set_limits(kinds: &QualifiedName) -> String {
    format!(
        "WITH set AS (INSERT INTO {} AS k (\"kind\", \"max_running\", \"per_second\", \"burst\", \
         \"limits_set_at\", \"limits_set_by\") \
         VALUES ($1, $2, $3, $4, CASE WHEN $2::int4 IS NULL AND $3::float8 IS NULL THEN NULL ELSE now() END, \
         CASE WHEN $2::int4 IS NULL AND $3::float8 IS NULL THEN NULL ELSE $5::text END) \
         ON CONFLICT (\"kind\") DO UPDATE SET \"max_running\" = EXCLUDED.\"max_running\", \
         \"per_second\" = EXCLUDED.\"per_second\", \"burst\" = EXCLUDED.\"burst\", \
         \"limits_set_at\" = EXCLUDED.\"limits_set_at\", \"limits_set_by\" = EXCLUDED.\"limits_set_by\", \
         \"tokens\" = NULL, \"tokens_at\" = NULL \
         RETURNING {LIMITS}) \
         SELECT set.*, (SELECT 1 FROM pg_notify($6, '')) AS \"__queue_notified\" FROM set",
        kinds.quoted()
    )
}

/// Kind `$1`'s limits and bucket, its row locked until the claim that
/// reads them commits (claims of the kind take turns): `max_running`,
/// `per_second`, `burst`, `tokens`, `tokens_at`, `limits_set_at`; no row
/// if the kind is paused or has no limits now.
pub(crate) fn lock_limits(kinds: &QualifiedName) -> String {
    format!(
        "SELECT \"max_running\", \"per_second\", \"burst\", \"tokens\", \"tokens_at\", \"limits_set_at\" FROM {} \
         WHERE \"kind\" = $1 AND \"paused_at\" IS NULL \
         AND (\"max_running\" IS NOT NULL OR \"per_second\" IS NOT NULL) FOR NO KEY UPDATE",
        kinds.quoted()
    )
}

/// Kind `$1`'s bucket after a claim: `$2` tokens as of `$3`.
pub(crate) fn spend(kinds: &QualifiedName) -> String {
    format!(
        "UPDATE {} SET \"tokens\" = $2, \"tokens_at\" = $3 WHERE \"kind\" = $1",
        kinds.quoted()
    )
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
