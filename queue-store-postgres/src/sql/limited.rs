//! The ledger of limited kinds' claims, on a table whose claims are in
//! place ([`JobTable::in_place_claims`](crate::JobTable::in_place_claims)).
//!
//! A kind with a limit on its running jobs counts them before each claim.
//! The plain table's index of running jobs makes that count cost what the
//! kind runs; a table whose claims are in place has no such index (an
//! index naming the state would stop the claims being heap-only updates),
//! so the count would read the whole backlog. The ledger
//! (`<table>_limited_claims`) instead records each job a limited kind's
//! claim takes, with its claim token, inside the claim's transaction.
//! Nothing removes an entry when its job ends: the next count of the kind
//! deletes the entries whose job no longer runs under that token (found
//! by key), so a count reads the kind's running jobs and those that ended
//! since the last one.
//!
//! Only a limited kind's claim writes the ledger. Jobs of a kind that ran
//! before its limit was set, or that a worker claimed in the moments
//! before it read the new rule, are in no entry: so for
//! [`RULE_SETTLES`] after a limit is set, each claim of the kind counts
//! its running jobs in the table itself and enters them; the first claim
//! after that does so once more and notes it (`<table>_limited_counted`),
//! and later ones count the ledger.

use super::default_table::{derived_name, MigrationSql};
use crate::ident::{Ident, QualifiedName};

/// How long after a kind's limit is set its claims count its running jobs
/// in the table itself: well past the second a worker may take to read
/// the new rule ([`crate::kinds::PAUSES_HOLD`]) and finish a claim
/// begun before it.
pub(crate) const RULE_SETTLES: &str = "5 seconds";

/// A table beside `table` named `<table>_<suffix>`.
fn beside(table: &QualifiedName, suffix: &str) -> QualifiedName {
    let name = Ident::new(derived_name(&table.name, suffix)).unwrap_or_else(|_| table.name.clone());
    QualifiedName::new(table.schema.clone(), name)
}

/// The ledger of `table`: `<table>_limited_claims`.
pub(crate) fn ledger_table(table: &QualifiedName) -> QualifiedName {
    beside(table, "limited_claims")
}

/// When each limited kind's running jobs were last counted in `table`
/// itself: `<table>_limited_counted`.
pub(crate) fn counted_table(table: &QualifiedName) -> QualifiedName {
    beside(table, "limited_counted")
}

/// Version 16 of a table whose claims are in place: the ledger and the
/// record of counts, created empty (every limited kind's first claim
/// counts in the table).
pub(crate) fn version_16(table: &QualifiedName) -> MigrationSql {
    MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version: 16,
        name: "in-place claims: a ledger of the jobs limited kinds' claims take, \
               which their counts of running jobs read instead of the backlog",
        statements: vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\"kind\" text NOT NULL, \"id\" bigint NOT NULL, \
                 \"claim_token\" bigint NOT NULL, PRIMARY KEY (\"kind\", \"id\", \"claim_token\"))",
                ledger_table(table).quoted()
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\"kind\" text PRIMARY KEY, \
                 \"counted_at\" timestamptz NOT NULL)",
                counted_table(table).quoted()
            ),
        ],
    }
}

/// The statements of a limited kind's claim on a table with a ledger.
/// Each binds the kind as `$1`, and runs in the claim's transaction,
/// after the kind's row in the kinds table is locked: claims of one kind
/// take turns, so none of them races another's entries.
#[derive(Debug, Clone)]
pub(crate) struct LedgerStatements {
    /// Whether the ledger can be counted for the kind: `current`, true
    /// once its running jobs were counted in the table after
    /// [`RULE_SETTLES`] from the limit's setting (`$2`).
    pub current: String,
    /// Enters the kind's running jobs from the table itself and notes the
    /// count's time; returns `running`.
    pub count_table: String,
    /// Deletes the kind's entries whose job no longer runs under its
    /// token, and returns `running`, the entries left.
    pub count_ledger: String,
    /// Enters jobs just claimed: `$2` keys, `$3` tokens.
    pub enter: String,
}

impl LedgerStatements {
    /// The statements for `table`, the default table (its names and
    /// state values) laid out for claims in place.
    pub(crate) fn new(table: &QualifiedName) -> LedgerStatements {
        let t = table.quoted();
        let ledger = ledger_table(table).quoted();
        let counted = counted_table(table).quoted();
        // A running job, as the layout's index of ready (and running)
        // jobs holds it.
        let running = format!(
            "j.\"state\" = 'processing' AND ({}) AND j.\"process_after\" IS NULL",
            super::unfinished("j.\"finished_at\"", "j.\"process_after\"")
        );
        LedgerStatements {
            current: format!(
                "SELECT coalesce((SELECT c.\"counted_at\" >= CAST($2 AS timestamptz) + interval '{RULE_SETTLES}' \
                 FROM {counted} AS c WHERE c.\"kind\" = $1), false) AS \"current\""
            ),
            count_table: format!(
                "WITH found AS (SELECT j.\"id\", j.\"claim_token\" FROM {t} AS j \
                 WHERE j.\"kind\" = $1 AND {running}), \
                 entered AS (INSERT INTO {ledger} (\"kind\", \"id\", \"claim_token\") \
                 SELECT $1, f.\"id\", f.\"claim_token\" FROM found AS f ON CONFLICT DO NOTHING), \
                 noted AS (INSERT INTO {counted} AS c (\"kind\", \"counted_at\") VALUES ($1, now()) \
                 ON CONFLICT (\"kind\") DO UPDATE SET \"counted_at\" = EXCLUDED.\"counted_at\") \
                 SELECT count(*) AS \"running\" FROM found"
            ),
            // The statement's parts share one snapshot: the count reads
            // the entries as they were before the delete, less those it
            // deleted.
            count_ledger: format!(
                "WITH gone AS (DELETE FROM {ledger} AS l WHERE l.\"kind\" = $1 AND NOT EXISTS \
                 (SELECT 1 FROM {t} AS j WHERE j.\"id\" = l.\"id\" \
                 AND j.\"claim_token\" = l.\"claim_token\" AND {running}) RETURNING 1) \
                 SELECT (SELECT count(*) FROM {ledger} AS l WHERE l.\"kind\" = $1) \
                 - (SELECT count(*) FROM gone) AS \"running\""
            ),
            enter: format!(
                "INSERT INTO {ledger} (\"kind\", \"id\", \"claim_token\") \
                 SELECT $1, u.\"id\", u.\"token\" FROM unnest(CAST($2 AS int8[]), CAST($3 AS int8[])) \
                 AS u(\"id\", \"token\") ON CONFLICT DO NOTHING"
            ),
        }
    }
}
