//! SQL for the default jobs table: its DDL (the spec's columns plus kind,
//! payload, priority and the claim token, the indexes that keep claiming
//! fast as finished rows pile up, and the statement-level notify trigger)
//! and the insert statements of enqueue.

use super::literal;
use crate::ident::{Ident, QualifiedName};

/// An identifier derived from the table name (`<table>_<suffix>`), cut to
/// Postgres' 63-byte limit on a character boundary.
fn derived(table: &Ident, suffix: &str) -> String {
    let mut base = table.as_str().to_owned();
    while base.len() + suffix.len() + 1 > 63 {
        base.pop();
    }
    Ident::new(format!("{base}_{suffix}"))
        .map(|i| i.quoted())
        .unwrap_or_else(|_| format!("\"{suffix}\""))
}

/// The statements that create (or complete) the default table, in order.
/// Each is idempotent.
pub(crate) fn migration(table: &QualifiedName, channel: &str) -> Vec<String> {
    let t = table.quoted();
    let schema = table.schema.quoted();
    let name = &table.name;
    let function = QualifiedName::new(
        table.schema.clone(),
        Ident::new(format!("{}_notify", truncate(name.as_str(), 56)))
            .unwrap_or_else(|_| name.clone()),
    )
    .quoted();
    let trigger = derived(name, "notify");
    vec![
        format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
             \"id\" bigserial PRIMARY KEY, \
             \"kind\" text NOT NULL, \
             \"payload\" jsonb NOT NULL DEFAULT '{{}}', \
             \"priority\" integer NOT NULL DEFAULT 0, \
             \"state\" text NOT NULL DEFAULT 'queued', \
             \"failure_message\" text, \
             \"queued_at\" timestamptz NOT NULL DEFAULT now(), \
             \"started_at\" timestamptz, \
             \"finished_at\" timestamptz, \
             \"process_after\" timestamptz, \
             \"num_resets\" integer NOT NULL DEFAULT 0, \
             \"num_failures\" integer NOT NULL DEFAULT 0, \
             \"last_heartbeat_at\" timestamptz, \
             \"execution_logs\" json[], \
             \"worker_hostname\" text, \
             \"cancel\" boolean NOT NULL DEFAULT false, \
             \"claim_token\" bigint NOT NULL DEFAULT 0, \
             CONSTRAINT {check} CHECK (\"state\" IN ('queued', 'processing', 'completed', 'errored', 'failed', 'canceled'))\
             ) WITH (fillfactor = 80)",
            check = derived(name, "state_check"),
        ),
        // Claiming reads this index in claim order; finished rows are not
        // in it, so it stays small however many rows accumulate.
        format!(
            "CREATE INDEX IF NOT EXISTS {idx} ON {t} (\"priority\" DESC, \"id\") WHERE \"state\" IN ('queued', 'errored')",
            idx = derived(name, "claimable_idx")
        ),
        // Completions, heartbeats and the resetter look only at processing
        // rows, by key: whatever plan the planner picks for them, it finds
        // each row by its key instead of reading every processing row. The
        // heartbeat column is not indexed, so heartbeats are HOT updates.
        format!(
            "CREATE INDEX IF NOT EXISTS {idx} ON {t} (\"id\") WHERE \"state\" = 'processing'",
            idx = derived(name, "processing_key_idx")
        ),
        // Replaced by the index above (tables created by earlier versions).
        format!(
            "DROP INDEX IF EXISTS {schema}.{idx}",
            idx = derived(name, "processing_idx")
        ),
        format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $queue$ \
             BEGIN PERFORM pg_notify({channel}, ''); RETURN NULL; END $queue$",
            channel = literal(channel)
        ),
        format!("DROP TRIGGER IF EXISTS {trigger} ON {t}"),
        // Statement level: one notification per INSERT statement however
        // many rows it adds, delivered only when the transaction commits.
        format!("CREATE TRIGGER {trigger} AFTER INSERT ON {t} FOR EACH STATEMENT EXECUTE FUNCTION {function}()"),
    ]
}

fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Serialises concurrent migrations of the same database.
pub(crate) const MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock(7310575312817441)";

/// Inserts one job: $1 kind, $2 payload, $3 priority, $4 process_after.
pub(crate) fn insert_one(table: &QualifiedName) -> String {
    format!(
        "INSERT INTO {t} (\"kind\", \"payload\", \"priority\", \"process_after\") VALUES ($1, $2, $3, $4) RETURNING \"id\"",
        t = table.quoted()
    )
}

/// Inserts many jobs from parallel arrays in one statement.
pub(crate) fn insert_many(table: &QualifiedName) -> String {
    format!(
        "INSERT INTO {t} (\"kind\", \"payload\", \"priority\", \"process_after\") \
         SELECT * FROM unnest(CAST($1 AS text[]), CAST($2 AS jsonb[]), CAST($3 AS int4[]), CAST($4 AS timestamptz[])) \
         RETURNING \"id\"",
        t = table.quoted()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_fit_the_identifier_limit() {
        let long = Ident::new("j".repeat(63)).unwrap();
        let name = derived(&long, "claimable_idx");
        assert_eq!(name.len(), 63 + 2, "63 bytes plus the quotes: {name}");
    }

    #[test]
    fn the_channel_is_a_literal_even_with_quotes() {
        let table = QualifiedName::new(Ident::new("s").unwrap(), Ident::new("t").unwrap());
        let ddl = migration(&table, "it's");
        assert!(ddl.iter().any(|s| s.contains("pg_notify(E'it''s', '')")));
    }

    /// `decode_job` looks for each column where this list puts it first.
    #[test]
    fn the_table_creates_its_columns_in_the_order_decode_job_expects() {
        let table = QualifiedName::new(Ident::new("s").unwrap(), Ident::new("t").unwrap());
        let ddl = migration(&table, "c");
        let create = ddl
            .iter()
            .find(|s| s.starts_with("CREATE TABLE"))
            .expect("a CREATE TABLE statement");
        let positions: Vec<usize> = crate::record::DEFAULT_COLUMNS
            .iter()
            .map(|c| {
                create
                    .find(&format!("\"{c}\" "))
                    .unwrap_or_else(|| panic!("{c} is not created"))
            })
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "columns out of order: {positions:?}"
        );
        let definitions = create
            .split_once('(')
            .and_then(|(_, rest)| rest.split_once("CONSTRAINT"))
            .map(|(columns, _)| columns.split(", ").filter(|d| d.starts_with('"')).count());
        assert_eq!(
            definitions,
            Some(crate::record::DEFAULT_COLUMNS.len()),
            "{create}"
        );
    }
}
