//! SQL for the default jobs table: its DDL (the spec's columns plus kind,
//! payload, priority and the claim token, the indexes that keep claiming
//! fast as finished rows pile up, and the statement-level notify trigger)
//! and the insert statements of enqueue.

use super::literal;
use crate::ident::{Ident, QualifiedName};

/// The name derived from the table name (`<table>_<suffix>`), cut to
/// Postgres' 63-byte limit on a character boundary.
pub(crate) fn derived_name(table: &Ident, suffix: &str) -> String {
    let mut base = table.as_str().to_owned();
    while base.len() + suffix.len() + 1 > 63 {
        base.pop();
    }
    format!("{base}_{suffix}")
}

/// [`derived_name`], quoted.
pub(crate) fn derived(table: &Ident, suffix: &str) -> String {
    Ident::new(derived_name(table, suffix))
        .map(|i| i.quoted())
        .unwrap_or_else(|_| format!("\"{suffix}\""))
}

/// The table recording which versions of `table`'s schema are applied:
/// `<table>_migrations` beside it.
pub(crate) fn version_table(table: &QualifiedName) -> QualifiedName {
    let name =
        Ident::new(derived_name(&table.name, "migrations")).unwrap_or_else(|_| table.name.clone());
    QualifiedName::new(table.schema.clone(), name)
}

/// Whether a relation exists: `$1` its quoted, qualified name.
pub(crate) const RELATION_EXISTS: &str = "SELECT to_regclass($1) IS NOT NULL";

/// Creates the schema and the version table.
pub(crate) fn create_version_table(table: &QualifiedName) -> [String; 2] {
    [
        format!("CREATE SCHEMA IF NOT EXISTS {}", table.schema.quoted()),
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\
             \"version\" integer PRIMARY KEY, \
             \"name\" text NOT NULL, \
             \"applied_at\" timestamptz NOT NULL DEFAULT now())",
            version_table(table).quoted()
        ),
    ]
}

/// The applied versions: version, name, applied_at.
pub(crate) fn applied_versions(table: &QualifiedName) -> String {
    format!(
        "SELECT \"version\", \"name\", \"applied_at\" FROM {} ORDER BY \"version\"",
        version_table(table).quoted()
    )
}

/// Forgets every recorded version.
pub(crate) fn forget_versions(table: &QualifiedName) -> String {
    format!("DELETE FROM {}", version_table(table).quoted())
}

/// Records a version: $1 version, $2 name.
pub(crate) fn record_version(table: &QualifiedName) -> String {
    format!(
        "INSERT INTO {} (\"version\", \"name\") VALUES ($1, $2)",
        version_table(table).quoted()
    )
}

/// One version of the default table's schema: what it changes and the
/// statements that make the change, run in order in one transaction.
#[derive(Debug, Clone)]
pub(crate) struct MigrationSql {
    pub version: u32,
    pub name: &'static str,
    pub statements: Vec<String>,
    /// Empty for a version applied in one transaction. Otherwise every
    /// statement is a `CREATE INDEX CONCURRENTLY` (`IF NOT EXISTS`) of the
    /// index named here at the same place (schema-qualified, quoted): run
    /// outside a transaction, so that claims, enqueues and completions go
    /// on while it builds, each after dropping an invalid index of that
    /// name (the remains of a build that was interrupted).
    pub concurrent_indexes: Vec<String>,
    /// Whether the version changes rows in batches, outside a transaction,
    /// so that claims, enqueues and completions go on meanwhile and no
    /// lock is held for long: each statement is then run over and over,
    /// `$1` the key its last batch ended at (the first below every key),
    /// and returns `next`, the key its batch ended at, NULL once it is
    /// past the last row. A row it changed no longer matches it, so a
    /// run that was interrupted starts again from the first key and
    /// changes only what is left. On a table the run creates (empty)
    /// there is nothing to change.
    pub batched: bool,
}

/// How the default table is laid out; chosen when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One table.
    Plain,
    /// Partitioned by state: the waiting and running jobs in one partition
    /// (`<table>_live`), each finished state in its own, and those by
    /// finish time ([`crate::partitions`]), so that retention drops whole
    /// partitions. Its versions make the same changes as the plain
    /// table's, in the forms Postgres allows on a partitioned table: the
    /// unique index is the live partition's (keys are held while a job
    /// waits or runs, never for ever), there is no enqueue function (no
    /// earlier release ran on it), and indexes are built at once (a
    /// partitioned table's cannot be built concurrently; the table is new
    /// and empty when they are).
    Partitioned,
}

/// The finished states of the default table, each a partition of its
/// own in the partitioned layout.
pub(crate) const FINISHED_STATES: [&str; 3] = ["completed", "failed", "canceled"];

/// The partition of the partitioned layout that holds the waiting and
/// running jobs.
pub(crate) fn live_partition(table: &QualifiedName) -> String {
    format!("{}.{}", table.schema.quoted(), derived(&table.name, "live"))
}

/// The partition of the partitioned layout that holds the jobs finished
/// in `state`, itself partitioned by finish time: its unquoted name.
pub(crate) fn finished_partition_name(table: &QualifiedName, state: &str) -> String {
    derived_name(&table.name, state)
}

/// Every version of the default table's schema, oldest first. A version,
/// once released, never changes: a later change is a new version.
pub(crate) fn migrations(
    table: &QualifiedName,
    channel: &str,
    layout: Layout,
) -> Vec<MigrationSql> {
    let indexes = |version, name, indexes| match layout {
        Layout::Plain => concurrent(version, name, indexes),
        Layout::Partitioned => at_once(version, name, indexes),
    };
    vec![
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 1,
            name: "the jobs table, its claim and processing indexes, and the notify trigger",
            statements: version_1(table, channel, layout),
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 2,
            name: "unique jobs: unique_key, unique_forever and the index that keeps keys unique",
            statements: version_2(table, layout),
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 3,
            name: "per-job options: max_attempts, expires_at and at_most_once",
            statements: version_3(table, layout),
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 4,
            name: "the enqueue function inserts a batch in one statement before it looks at taken keys",
            statements: match layout {
                Layout::Plain => version_4(table),
                Layout::Partitioned => Vec::new(),
            },
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 5,
            name: "an index of waiting jobs by the time they come due (scheduled and retrying ones)",
            statements: version_5(table),
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 6,
            name: "the claim index holds only jobs ready now; scheduled and retrying jobs are claimed through the due index \
                   (rebuilds the claim index: claims wait while it builds)",
            statements: version_6(table),
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 7,
            name: "statistics of the state and kind columns together, which the figures of a big table are estimated from",
            statements: version_7(table),
        },
        indexes(
            8,
            "indexes of finish time and expiry for the timeline, retention, purges and the expiry sweep \
             (built concurrently: claims go on while they build)",
            version_8(table),
        ),
        indexes(
            9,
            "an index of finished jobs by kind, for lists of one kind \
             (built concurrently: claims go on while it builds)",
            version_9(table),
        ),
        indexes(
            10,
            "a block range (BRIN) index of queued times and keys, for lists of a queued-time range \
             (built concurrently: claims go on while it builds)",
            version_10(table),
        ),
        indexes(
            11,
            "indexes of failed and canceled jobs by key and by state, kind and key, for lists of those states \
             (built concurrently: claims go on while they build)",
            version_11(table),
        ),
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: true,
            version: 12,
            name: "finish and due times that follow the state, set right on rows written by earlier releases \
                   (in batches: claims go on meanwhile)",
            statements: vec![version_12(table)],
        },
    ]
}

/// The versions that make a plain default table's claims in place
/// ([`JobTable::in_place_claims`](crate::JobTable::in_place_claims)),
/// after version 12; applied only to a table asked for them.
///
/// PostgreSQL updates a row in place (a heap-only tuple: no new index
/// entry, the new version on the same page) only when no index names a
/// column the update changes, in its key or in its predicate. A claim
/// changes the state, and every partial index of the plain table names
/// the state in its predicate. These versions replace them with indexes
/// on the times that follow the state (see [`TIMES_DISAGREE`]): the jobs
/// ready now are those with neither a finish nor a due time, which holds
/// the running jobs too (a claim steps over them in the heap); finished
/// jobs have a finish time and no due time. The running jobs' index and
/// those of failed and canceled jobs go, since nothing but the state
/// tells those jobs apart. A check constraint keeps every writer to the
/// rule of the times: a waiting job with a finish time and no due time
/// would be in no index a claim reads. Pages are left half empty
/// (fillfactor 50) so that a claim's new version finds room beside the
/// old one. Version 16 adds the ledger of limited kinds' claims
/// ([`super::limited`]), which stands in for the running jobs' index in
/// their counts.
pub(crate) fn in_place_versions(table: &QualifiedName) -> Vec<MigrationSql> {
    vec![
        concurrent(
            13,
            "in-place claims: indexes of the ready, due, expiring, unique-key and finished jobs on their times \
             instead of their state (built concurrently: claims go on while they build)",
            version_13(table),
        ),
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 14,
            name: "in-place claims: the indexes that name the state dropped, pages left half empty, \
                   and a check that the times follow the state (not yet validated)",
            statements: version_14(table),
        },
        MigrationSql {
            concurrent_indexes: Vec::new(),
            batched: false,
            version: 15,
            name: "in-place claims: the check that the times follow the state validated \
                   (reads the table; claims, enqueues and completions go on meanwhile)",
            statements: vec![format!(
                "ALTER TABLE {} VALIDATE CONSTRAINT {}",
                table.quoted(),
                derived(&table.name, TIMES_CHECK)
            )],
        },
        super::limited::version_16(table),
    ]
}

/// The index of the jobs ready now (and the running ones) of a table
/// whose claims are in place, [`derived_name`] of the table with it: how
/// the catalog tells that layout.
pub(crate) const READY_INDEX: &str = "ready_idx";

/// The index of finished jobs by kind of a table whose claims are in
/// place (version 9's [`FINISHED_KIND_INDEX`] on the times).
pub(crate) const IN_PLACE_FINISHED_KIND_INDEX: &str = "finished_by_kind_idx";

/// The check constraint of version 14.
const TIMES_CHECK: &str = "times_follow_state";

/// Version 13: the indexes of a table whose claims are in place, each the
/// plain table's but for its predicate, which names the times instead of
/// the state.
fn version_13(table: &QualifiedName) -> Vec<(String, String)> {
    // A job that has not finished, as its readers name it too (through
    // `TableShape::times_of`), which is what lets the planner read these
    // indexes.
    let unfinished = super::unfinished("\"finished_at\"", "\"process_after\"");
    let unique = concurrent_index(
        table,
        "unique_key_idx",
        &format!(
            "(\"unique_key\") WHERE \"unique_key\" IS NOT NULL AND (\"unique_forever\" OR {unfinished})"
        ),
    );
    vec![
        concurrent_index(
            table,
            READY_INDEX,
            &format!(
                "(\"priority\" DESC, \"id\") WHERE ({unfinished}) AND \"process_after\" IS NULL"
            ),
        ),
        concurrent_index(
            table,
            "due_at_idx",
            "(\"process_after\") WHERE \"process_after\" IS NOT NULL",
        ),
        concurrent_index(
            table,
            "expiry_idx",
            &format!("(\"expires_at\") WHERE \"expires_at\" IS NOT NULL AND ({unfinished})"),
        ),
        (
            unique.0,
            unique.1.replacen(
                "CREATE INDEX CONCURRENTLY",
                "CREATE UNIQUE INDEX CONCURRENTLY",
                1,
            ),
        ),
        concurrent_index(
            table,
            IN_PLACE_FINISHED_KIND_INDEX,
            "(\"kind\", \"id\") WHERE \"finished_at\" IS NOT NULL AND \"process_after\" IS NULL",
        ),
    ]
}

/// Version 14: the indexes whose predicates name the state dropped (each
/// replaced by version 13's, or by nothing: the running jobs' and the
/// failed and canceled jobs'), the fillfactor, and the check of the times,
/// added without reading the table (version 15 validates it).
fn version_14(table: &QualifiedName) -> Vec<String> {
    let (t, schema) = (table.quoted(), table.schema.quoted());
    let mut statements: Vec<String> = [
        "claimable_idx",
        "processing_key_idx",
        "due_idx",
        "expires_idx",
        "unique_idx",
        FINISHED_KIND_INDEX,
        "unsuccessful_idx",
        "unsuccessful_kind_idx",
    ]
    .iter()
    .map(|suffix| {
        format!(
            "DROP INDEX IF EXISTS {schema}.{}",
            derived(&table.name, suffix)
        )
    })
    .collect();
    statements.extend([
        format!("ALTER TABLE {t} SET (fillfactor = 50)"),
        format!(
            "ALTER TABLE {t} ADD CONSTRAINT {} CHECK (NOT ({TIMES_DISAGREE})) NOT VALID",
            derived(&table.name, TIMES_CHECK)
        ),
    ]);
    statements
}

/// The rows of the default table whose `finished_at` and `process_after`
/// disagree with their state
/// ([`JobState::times_agree`](queue_core::JobState::times_agree)): an SQL
/// condition on its columns.
const TIMES_DISAGREE: &str = "NOT CASE \
     WHEN \"state\" = 'processing' THEN \"finished_at\" IS NULL AND \"process_after\" IS NULL \
     WHEN \"state\" IN ('queued', 'errored') THEN \"finished_at\" IS NULL OR \"process_after\" IS NOT NULL \
     ELSE \"finished_at\" IS NOT NULL AND \"process_after\" IS NULL END";

/// How many keys a batch of version 12 reads.
const FIX_UP_BATCH: u32 = 10_000;

/// Version 12: the times of rows written before they followed the state
/// (a finished job that had been scheduled or retried kept its
/// `process_after`; a job claimed again kept its last finish), set right
/// in batches of keys ([`MigrationSql::batched`]): a finished job loses
/// its due time (and has a finish time: its start's, or its enqueue's,
/// where none was written), a running one both times, a waiting one
/// without a due time its finish. An index of due times that leaves
/// finished jobs out without naming the state needs these rows right
/// before it is built. A batch reads its keys through the primary key
/// and locks only the rows it changes, which no worker holds: finished
/// jobs, and running ones only where an earlier release claimed them.
fn version_12(table: &QualifiedName) -> String {
    let t = table.quoted();
    format!(
        "WITH batch AS (SELECT \"id\" FROM {t} WHERE \"id\" > $1 ORDER BY \"id\" LIMIT {FIX_UP_BATCH}), \
         fixed AS (UPDATE {t} SET \
         \"finished_at\" = CASE WHEN \"state\" IN ('completed', 'failed', 'canceled') \
         THEN coalesce(\"finished_at\", \"started_at\", \"queued_at\") \
         WHEN \"state\" IN ('queued', 'errored') AND \"process_after\" IS NOT NULL THEN \"finished_at\" END, \
         \"process_after\" = CASE WHEN \"state\" IN ('queued', 'errored') THEN \"process_after\" END \
         WHERE \"id\" = ANY(ARRAY(SELECT \"id\" FROM batch)) AND {TIMES_DISAGREE} RETURNING 1) \
         SELECT (SELECT max(\"id\") FROM batch) AS \"next\", (SELECT count(*) FROM fixed) AS \"fixed\""
    )
}

/// Version 11: failed and canceled jobs by key, and by state, kind and
/// key. A list of failed jobs reads them here, newest first (those of a
/// kind with few failures through the second), instead of walking every
/// finished job (of the kind) for the few that failed: with a million
/// completed jobs of the drain's kind and none failed, a page of its
/// failed jobs read all million, and eight dashboard tabs asking for it
/// every second held a lease drain to a quarter of its speed. Only those
/// two states are in them, rare next to completed jobs: a job that
/// completes writes no entry.
fn version_11(table: &QualifiedName) -> Vec<(String, String)> {
    let unsuccessful = "WHERE \"state\" IN ('failed', 'canceled')";
    vec![
        concurrent_index(
            table,
            "unsuccessful_idx",
            &format!("(\"id\") {unsuccessful}"),
        ),
        concurrent_index(
            table,
            "unsuccessful_kind_idx",
            &format!("(\"state\", \"kind\", \"id\") {unsuccessful}"),
        ),
    ]
}

/// A version made of concurrent index builds (`(qualified name, CREATE)`
/// each, as [`concurrent_index`] gives them).
fn concurrent(version: u32, name: &'static str, indexes: Vec<(String, String)>) -> MigrationSql {
    let (concurrent_indexes, statements) = indexes.into_iter().unzip();
    MigrationSql {
        concurrent_indexes,
        batched: false,
        version,
        name,
        statements,
    }
}

/// A version of index builds run at once, in the version's transaction:
/// the partitioned layout's form of [`concurrent`].
fn at_once(version: u32, name: &'static str, indexes: Vec<(String, String)>) -> MigrationSql {
    MigrationSql {
        concurrent_indexes: Vec::new(),
        batched: false,
        version,
        name,
        statements: indexes
            .into_iter()
            .map(|(_, create)| create.replacen("CREATE INDEX CONCURRENTLY ", "CREATE INDEX ", 1))
            .collect(),
    }
}

/// The index `<table>_<suffix>` of `table` with `definition` (what
/// follows the table's name), built concurrently: its qualified name and
/// its `CREATE INDEX CONCURRENTLY IF NOT EXISTS`.
fn concurrent_index(table: &QualifiedName, suffix: &str, definition: &str) -> (String, String) {
    let name = derived(&table.name, suffix);
    (
        format!("{}.{name}", table.schema.quoted()),
        format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {} {definition}",
            table.quoted()
        ),
    )
}

/// Version 10: a BRIN index of queued times and keys, a few hundred
/// kilobytes for ten million jobs. A list of a queued-time range reads it
/// in windows of keys (`sql::admin`'s `ListRead::Windows`): the blocks
/// whose jobs were queued in the range and hold keys in the window,
/// instead of walking every job queued since. Jobs are stored about in
/// the order they were queued, which is what a block range index needs;
/// the multi-range summaries of queued times
/// (`minmax_multi`) stay narrow when rows land out of order in space an
/// old purge freed. A BRIN index keeps no entry per row: a write changes
/// it only when its row falls outside its block range's summary, and not
/// at all in the newest blocks, which are not summarized yet.
fn version_10(table: &QualifiedName) -> Vec<(String, String)> {
    vec![concurrent_index(
        table,
        "queued_brin_idx",
        "USING brin (\"queued_at\" timestamptz_minmax_multi_ops, \"id\")",
    )]
}

/// The index of version 9, [`derived_name`] of the table with it.
pub(crate) const FINISHED_KIND_INDEX: &str = "finished_kind_idx";

/// Version 9: finished jobs by kind, then key. A list of one kind reads
/// its finished jobs here and its waiting and running ones through the
/// claim's indexes (`sql::admin`, [`TableShape::kind_split`](super::TableShape::kind_split)),
/// so a rare kind's page no longer walks the table. Only finished rows
/// are in it: a job writes one entry, when it finishes, where an index of
/// every row would take three (enqueue, claim, completion; see version 8).
fn version_9(table: &QualifiedName) -> Vec<(String, String)> {
    vec![concurrent_index(
        table,
        FINISHED_KIND_INDEX,
        "(\"kind\", \"id\") WHERE \"state\" IN ('completed', 'failed', 'canceled')",
    )]
}

/// Version 8: the indexes the operator surfaces and the store's sweeps
/// read on a big table, each built concurrently (`(qualified name,
/// CREATE)`):
///
/// - finished jobs by finish time, then key: the timeline's last hour,
///   and retention and purges, which walk old finished jobs in this order
///   from where their last batch stopped;
/// - waiting jobs with an expiry, by expiry: the expiry sweep reads the
///   expired ones alone (jobs without an expiry are not in it).
///
/// Each costs the writes that touch its rows: a completion writes one
/// entry more. An index of jobs by kind is left out: every job would write
/// three entries in it (enqueue, claim, completion), which cost a 100,000
/// job lease drain 12-17 % here.
fn version_8(table: &QualifiedName) -> Vec<(String, String)> {
    vec![
        concurrent_index(
            table,
            "finished_idx",
            "(\"finished_at\", \"id\") WHERE \"finished_at\" IS NOT NULL",
        ),
        concurrent_index(
            table,
            "expires_idx",
            "(\"expires_at\") WHERE \"state\" IN ('queued', 'errored') AND \"expires_at\" IS NOT NULL",
        ),
    ]
}

/// Version 7: extended statistics (most common values) over the state and
/// kind columns together. On a table past
/// [`exact_counts_below`](crate::PgStoreOptions::exact_counts_below), the
/// figures estimate finished jobs per state and kind from them: a catalog
/// read instead of a count of millions of rows. The planner gathers them
/// at each `ANALYZE`; one is run here on a table with rows, so the figures
/// need not wait for autovacuum's (it samples the table, and locks out
/// only other maintenance while it runs). An empty table is left to
/// autovacuum, as the store leaves it at start-up.
fn version_7(table: &QualifiedName) -> Vec<String> {
    vec![
        format!(
            "CREATE STATISTICS IF NOT EXISTS {}.{} (mcv) ON \"state\", \"kind\" FROM {}",
            table.schema.quoted(),
            derived(&table.name, "state_kind_stats"),
            table.quoted()
        ),
        format!(
            "DO $$ BEGIN IF EXISTS (SELECT 1 FROM {t}) THEN ANALYZE {t}; END IF; END $$",
            t = table.quoted()
        ),
    ]
}

/// Version 6: the claim index leaves out the jobs that wait for a time
/// (a `process_after`: scheduled ones, and errored ones waiting for their
/// retry). A claim reads it for the jobs ready now and version 5's index
/// for the jobs whose time has come (`sql::claim`), so a million jobs
/// scheduled ahead no longer sit in the claim order for every claim to
/// step over. Dropped and built again in the migration's transaction, so
/// no claim ever runs without a claim index.
fn version_6(table: &QualifiedName) -> Vec<String> {
    let idx = derived(&table.name, "claimable_idx");
    vec![
        format!("DROP INDEX IF EXISTS {}.{idx}", table.schema.quoted()),
        format!(
            "CREATE INDEX IF NOT EXISTS {idx} ON {t} (\"priority\" DESC, \"id\") \
             WHERE \"state\" IN ('queued', 'errored') AND \"process_after\" IS NULL",
            t = table.quoted()
        ),
    ]
}

/// Version 5: the waiting jobs that have a `process_after` (scheduled, or
/// errored and waiting for their retry), by that time. An idle worker asks
/// for the earliest one to sleep until it comes due (one index probe
/// however many wait); jobs enqueued to run now are not in it, so plain
/// enqueues pay nothing for it.
fn version_5(table: &QualifiedName) -> Vec<String> {
    vec![format!(
        "CREATE INDEX IF NOT EXISTS {idx} ON {t} (\"process_after\") \
         WHERE \"state\" IN ('queued', 'errored') AND \"process_after\" IS NOT NULL",
        idx = derived(&table.name, "due_idx"),
        t = table.quoted()
    )]
}

/// Version 4: version 3's enqueue function, set-based. One `INSERT ..
/// SELECT` takes the whole batch (each job whose key is free); only the
/// jobs it skipped (a key already held, or taken by an earlier job of the
/// batch) go one by one to find the holder, or to take a key that came
/// free meanwhile. Version 3 inserted every job by itself: about a fifth
/// of a plain batch's rate.
fn version_4(table: &QualifiedName) -> Vec<String> {
    let t = table.quoted();
    let f = unique_function(table);
    let body = format!(
        "#variable_conflict use_column
DECLARE
  n int := coalesce(array_length(p_kinds, 1), 0);
  ids bigint[] := array_fill(NULL::bigint, ARRAY[n]);
  added boolean[] := array_fill(false, ARRAY[n]);
  rec record; k int; tries int; found bigint;
BEGIN
  FOR rec IN
    WITH input AS (
      SELECT * FROM unnest(p_kinds, p_payloads, p_priorities, p_afters, p_keys, p_forevers, p_max_attempts,
        p_expires, p_at_most_once) WITH ORDINALITY
        AS u(kind, payload, priority, process_after, unique_key, unique_forever, max_attempts, expires_at,
          at_most_once, pos)),
    inserted AS (
      INSERT INTO {t} AS j (\"kind\", \"payload\", \"priority\", \"process_after\", \"unique_key\", \"unique_forever\",
          \"max_attempts\", \"expires_at\", \"at_most_once\")
        SELECT kind, payload, priority, process_after, unique_key, coalesce(unique_forever, false), max_attempts,
          expires_at, coalesce(at_most_once, false) FROM input ORDER BY pos
        ON CONFLICT DO NOTHING RETURNING j.\"id\" AS new_id, j.\"unique_key\" AS new_key),
    keyless_in AS (SELECT pos, row_number() OVER (ORDER BY pos) AS r FROM input WHERE unique_key IS NULL),
    keyless_out AS (SELECT new_id, row_number() OVER () AS r FROM inserted WHERE new_key IS NULL),
    keyed AS (
      SELECT DISTINCT ON (i.unique_key) i.pos, x.new_id FROM input AS i JOIN inserted AS x ON x.new_key = i.unique_key
      ORDER BY i.unique_key, i.pos)
    SELECT CAST(ki.pos AS int) AS at, ko.new_id FROM keyless_in AS ki JOIN keyless_out AS ko ON ko.r = ki.r
    UNION ALL
    SELECT CAST(pos AS int), new_id FROM keyed
  LOOP
    ids[rec.at] := rec.new_id;
    added[rec.at] := true;
  END LOOP;
  FOR k IN 1 .. n LOOP
    tries := 0;
    WHILE ids[k] IS NULL LOOP
      found := NULL;
      INSERT INTO {t} AS j (\"kind\", \"payload\", \"priority\", \"process_after\", \"unique_key\", \"unique_forever\",
          \"max_attempts\", \"expires_at\", \"at_most_once\")
        VALUES (p_kinds[k], p_payloads[k], p_priorities[k], p_afters[k], p_keys[k], coalesce(p_forevers[k], false),
          p_max_attempts[k], p_expires[k], coalesce(p_at_most_once[k], false))
        ON CONFLICT DO NOTHING RETURNING j.\"id\" INTO found;
      IF found IS NOT NULL THEN
        ids[k] := found; added[k] := true; EXIT;
      END IF;
      SELECT h.\"id\" INTO found FROM {t} AS h WHERE h.\"unique_key\" = p_keys[k]
        AND (h.\"unique_forever\" OR h.\"state\" IN ('queued', 'processing', 'errored')) LIMIT 1;
      IF found IS NOT NULL THEN
        ids[k] := found; EXIT;
      END IF;
{GIVE_UP}
    END LOOP;
    \"id\" := ids[k]; \"unique_key\" := p_keys[k]; \"inserted\" := added[k]; RETURN NEXT;
  END LOOP;
END"
    );
    vec![create_unique_function(&f, &body)]
}

/// Version 3: a job's own attempt limit, expiry and at-most-once flag, and
/// the enqueue function taking them (replacing version 2's).
fn version_3(table: &QualifiedName, layout: Layout) -> Vec<String> {
    let t = table.quoted();
    let f = unique_function(table);
    let body = unique_function_body(
        &t,
        ",\n          \"max_attempts\", \"expires_at\", \"at_most_once\"",
        ",\n          p_max_attempts[k], p_expires[k], coalesce(p_at_most_once[k], false)",
    );
    let columns = vec![
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS \"max_attempts\" integer"),
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS \"expires_at\" timestamptz"),
        format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS \"at_most_once\" boolean NOT NULL DEFAULT false"
        ),
    ];
    if layout == Layout::Partitioned {
        return columns;
    }
    let mut statements = columns;
    statements.extend([
        format!(
            "DROP FUNCTION IF EXISTS {f}(text[], jsonb[], int4[], timestamptz[], text[], bool[])"
        ),
        create_unique_function(&f, &body),
    ]);
    statements
}

/// The statement that creates the unique enqueue function `f` of versions
/// 3 and 4, with `body`.
fn create_unique_function(f: &str, body: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {f}(p_kinds text[], p_payloads jsonb[], p_priorities int4[], \
         p_afters timestamptz[], p_keys text[], p_forevers bool[], p_max_attempts int4[], \
         p_expires timestamptz[], p_at_most_once bool[]) \
         RETURNS TABLE (\"id\" bigint, \"unique_key\" text, \"inserted\" boolean) \
         LANGUAGE plpgsql VOLATILE AS {}",
        dollar_quoted(body)
    )
}

/// How the unique enqueue functions of versions 2 to 4 give up on a key
/// whose holder stayed out of sight: after 10 tries, with an error the
/// caller may retry (serialization failure).
const GIVE_UP: &str = "      tries := tries + 1;
      IF tries >= 10 THEN
        RAISE EXCEPTION 'the job holding unique key % stayed out of sight; enqueue it again', p_keys[k]
          USING ERRCODE = '40001';
      END IF;";

/// The body of the unique enqueue function of versions 2 and 3: version 3
/// inserts `columns` more, from `values`. Each statement in it takes a
/// fresh snapshot, so a holder that committed after the call began is
/// seen on the next try.
fn unique_function_body(t: &str, columns: &str, values: &str) -> String {
    format!(
        "#variable_conflict use_column
DECLARE k int; tries int; found bigint;
BEGIN
  FOR k IN 1 .. coalesce(array_length(p_kinds, 1), 0) LOOP
    tries := 0;
    LOOP
      found := NULL;
      INSERT INTO {t} AS j (\"kind\", \"payload\", \"priority\", \"process_after\", \"unique_key\", \"unique_forever\"{columns})
        VALUES (p_kinds[k], p_payloads[k], p_priorities[k], p_afters[k], p_keys[k], coalesce(p_forevers[k], false){values})
        ON CONFLICT DO NOTHING RETURNING j.\"id\" INTO found;
      IF found IS NOT NULL THEN
        \"id\" := found; \"unique_key\" := p_keys[k]; \"inserted\" := true; RETURN NEXT; EXIT;
      END IF;
      SELECT h.\"id\" INTO found FROM {t} AS h WHERE h.\"unique_key\" = p_keys[k]
        AND (h.\"unique_forever\" OR h.\"state\" IN ('queued', 'processing', 'errored')) LIMIT 1;
      IF found IS NOT NULL THEN
        \"id\" := found; \"unique_key\" := p_keys[k]; \"inserted\" := false; RETURN NEXT; EXIT;
      END IF;
{GIVE_UP}
    END LOOP;
  END LOOP;
END"
    )
}

/// The function that enqueued jobs with unique keys up to this release:
/// `<table>_enqueue_unique` beside the table. Enqueues now run the
/// statements every table's enqueue runs ([`super::enqueue`]); the
/// function stays for processes of earlier releases still running
/// beside them.
fn unique_function(table: &QualifiedName) -> String {
    QualifiedName::new(
        table.schema.clone(),
        Ident::new(format!(
            "{}_enqueue_unique",
            truncate(table.name.as_str(), 48)
        ))
        .unwrap_or_else(|_| table.name.clone()),
    )
    .quoted()
}

/// Version 2: unique keys. A key is held by a job while it waits or runs,
/// or for as long as it exists with `unique_forever`; the partial unique
/// index enforces exactly that, and an enqueue's `ON CONFLICT DO NOTHING`
/// reads it. Adding nullable and constant-default columns rewrites
/// nothing; the index is built over a column that is still empty.
///
/// The enqueue is a function so that it is one statement on any executor
/// (the caller's transaction included) and yet never misses the job
/// holding a key: each statement in it takes a fresh snapshot, so a holder
/// that committed after the call began is seen on the next try, and a key
/// freed meanwhile is taken.
fn version_2(table: &QualifiedName, layout: Layout) -> Vec<String> {
    let t = table.quoted();
    let body = unique_function_body(&t, "", "");
    let columns = [
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS \"unique_key\" text"),
        format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS \"unique_forever\" boolean NOT NULL DEFAULT false"
        ),
    ];
    let index = |on: &str| {
        format!(
            "CREATE UNIQUE INDEX IF NOT EXISTS {} ON {on} (\"unique_key\") \
             WHERE \"unique_key\" IS NOT NULL AND (\"unique_forever\" OR \"state\" IN ('queued', 'processing', 'errored'))",
            derived(&table.name, "unique_idx")
        )
    };
    if layout == Layout::Partitioned {
        // Postgres keeps an index of a partitioned table unique only within
        // each partition; every waiting and running job is in the live one.
        // A key held for ever would need one index over every partition.
        let [key, forever] = columns;
        return vec![
            key,
            forever,
            format!(
                "ALTER TABLE {t} ADD CONSTRAINT {} CHECK (NOT \"unique_forever\")",
                derived(&table.name, "keys_held_while_live")
            ),
            index(&live_partition(table)),
        ];
    }
    let [key, forever] = columns;
    vec![
        key,
        forever,
        index(&t),
        format!(
            "CREATE OR REPLACE FUNCTION {f}(p_kinds text[], p_payloads jsonb[], p_priorities int4[], \
             p_afters timestamptz[], p_keys text[], p_forevers bool[]) \
             RETURNS TABLE (\"id\" bigint, \"unique_key\" text, \"inserted\" boolean) \
             LANGUAGE plpgsql VOLATILE AS {}",
            dollar_quoted(&body),
            f = unique_function(table)
        ),
    ]
}

/// Version 1: the table as it stood before migrations were versioned.
/// Each statement is idempotent, so a table created by an earlier release
/// (with no version table) is recorded at version 1 unchanged.
fn version_1(table: &QualifiedName, channel: &str, layout: Layout) -> Vec<String> {
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
    let columns = format!(
        "\"id\" bigserial{key}, \
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
         CONSTRAINT {check} CHECK (\"state\" IN ('queued', 'processing', 'completed', 'errored', 'failed', 'canceled'))",
        // A partitioned table's key would have to hold the partition
        // columns; each partition keys its own rows instead.
        key = match layout {
            Layout::Plain => " PRIMARY KEY",
            Layout::Partitioned => "",
        },
        check = derived(name, "state_check"),
    );
    let mut statements = vec![format!("CREATE SCHEMA IF NOT EXISTS {schema}")];
    match layout {
        Layout::Plain => statements.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} ({columns}) WITH (fillfactor = 80)"
        )),
        Layout::Partitioned => {
            statements.push(format!(
                "CREATE TABLE IF NOT EXISTS {t} ({columns}) PARTITION BY LIST (\"state\")"
            ));
            statements.push(format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {t} (PRIMARY KEY (\"id\")) \
                 FOR VALUES IN ('queued', 'processing', 'errored') WITH (fillfactor = 80)",
                live_partition(table)
            ));
            for state in FINISHED_STATES {
                let parent = derived(name, state);
                statements.extend([
                    format!(
                        "CREATE TABLE IF NOT EXISTS {schema}.{parent} PARTITION OF {t} \
                         FOR VALUES IN ({}) PARTITION BY RANGE (\"finished_at\")",
                        literal(state)
                    ),
                    // Rows no partition of a time range holds yet (one
                    // finished at a time no range was made for) wait here;
                    // the partition made for their range later takes them.
                    format!(
                        "CREATE TABLE IF NOT EXISTS {schema}.{} PARTITION OF {schema}.{parent} DEFAULT",
                        derived(name, &format!("{state}_default"))
                    ),
                    // A job found by its key in any partition.
                    format!(
                        "CREATE INDEX IF NOT EXISTS {} ON {schema}.{parent} (\"id\")",
                        derived(name, &format!("{state}_id_idx"))
                    ),
                ]);
            }
        }
    }
    statements.extend([
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
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS {}",
            dollar_quoted(&format!(
                "BEGIN PERFORM pg_notify({}, ''); RETURN NULL; END",
                literal(channel)
            ))
        ),
        // Statement level: one notification per INSERT statement however
        // many rows it adds, delivered only when the transaction commits.
        // Created only where missing: creating a trigger locks the table
        // against every reader and writer.
        format!(
            "DO {}",
            dollar_quoted(&format!(
                "BEGIN IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger \
                 WHERE tgrelid = {regclass}::regclass AND tgname = {trigger_name}) THEN \
                 CREATE TRIGGER {trigger} AFTER INSERT ON {t} FOR EACH STATEMENT EXECUTE FUNCTION {function}(); \
                 END IF; END",
                regclass = literal(&t),
                trigger_name = literal(&derived_name(name, "notify")),
            ))
        ),
    ]);
    statements
}

/// `body` between dollar quotes whose tag the body does not contain (a
/// table or channel name may contain any tag we would pick otherwise).
fn dollar_quoted(body: &str) -> String {
    let mut n = 0;
    loop {
        let tag = format!("$queue{n}$");
        if !body.contains(&tag) {
            return format!("{tag}{body}{tag}");
        }
        n += 1;
    }
}

fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Serialises concurrent migrations of the same database: taken for the
/// session (concurrent index builds run outside a transaction), tried
/// rather than waited for, so that a migration waiting for it holds no
/// snapshot another's index build would wait for in turn.
pub(crate) const MIGRATION_LOCK: &str = "SELECT pg_try_advisory_lock(7310575312817441)";
/// Releases [`MIGRATION_LOCK`].
pub(crate) const MIGRATION_UNLOCK: &str = "SELECT pg_advisory_unlock(7310575312817441)";
/// Whether the index `$1` (quoted, qualified) exists and is invalid: the
/// remains of a concurrent build that was interrupted.
pub(crate) const INVALID_INDEX: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index \
     WHERE indexrelid = to_regclass($1) AND NOT indisvalid)";

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
    fn a_dollar_quote_never_meets_its_tag_in_the_body() {
        assert_eq!(dollar_quoted("x"), "$queue0$x$queue0$");
        assert_eq!(
            dollar_quoted("a $queue0$ b"),
            "$queue1$a $queue0$ b$queue1$"
        );
    }

    #[test]
    fn the_channel_is_a_literal_even_with_quotes() {
        let table = QualifiedName::new(Ident::new("s").unwrap(), Ident::new("t").unwrap());
        let ddl = version_1(&table, "it's", Layout::Plain);
        assert!(ddl.iter().any(|s| s.contains("pg_notify(E'it''s', '')")));
    }

    /// `decode_job` looks for each column where this list puts it first.
    #[test]
    fn the_table_creates_its_columns_in_the_order_decode_job_expects() {
        let table = QualifiedName::new(Ident::new("s").unwrap(), Ident::new("t").unwrap());
        let ddl = version_1(&table, "c", Layout::Plain);
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
