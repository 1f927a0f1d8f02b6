//! The statements of the figures on a big table, which read what is cheap
//! to read and estimate the rest: the table's size and the planner's
//! statistics of its states and kinds (catalog reads, whatever the table
//! holds), and the waiting and running jobs, counted through the claim's
//! own indexes up to a cap.

use queue_core::JobState;

use super::{literal, Builder, Names, Param, Statement};
use crate::options::{Column, PgStoreOptions};

/// The statements [`crate::admin::PgAdmin`]'s stats read when estimates
/// are allowed.
#[derive(Debug, Clone)]
pub(crate) struct StatsStatements {
    /// The table's rows now: `rows` (int8), null when the table was never
    /// analyzed or is partitioned. The lesser of two counts that each run
    /// high at times: the planner's row count scaled to the table's size
    /// now, as the planner scales it (it counts the dead rows of a bulk
    /// update or a purge as rows until a vacuum), and the live rows the
    /// statistics system counts as rows are written (`n_live_tup`, which
    /// counts a session's rows twice when it analyzes the table before its
    /// counts are flushed).
    pub size: Statement,
    /// The planner's statistics of the state column: `state`, `kind` and
    /// `share` (of all rows) per value pair of the state and kind columns'
    /// extended statistics where they exist, else per state value (kind
    /// null).
    pub shares: Statement,
    /// Waiting and running jobs, up to [`Param::Limit`] of each of the
    /// three sets the claim's indexes hold (ready, scheduled or retrying,
    /// running): `set`, `state`, `kind`, `count` and `oldest` (the
    /// earliest since-time of the claimable ones among them).
    pub live: Statement,
    /// Running jobs silent since before [`Param::StalledBefore`]: `stalled`
    /// (null where nothing tells a stalled job from a busy one).
    pub stalled: Statement,
}

/// The states counted (up to the cap) rather than estimated.
pub(crate) const LIVE_STATES: [JobState; 3] =
    [JobState::Queued, JobState::Errored, JobState::Processing];

/// Which set of [`StatsStatements::live`] holds a state's jobs.
pub(crate) fn live_sets(state: JobState) -> &'static [i32] {
    match state {
        JobState::Queued | JobState::Errored => &[1, 2],
        JobState::Processing => &[3],
        _ => &[],
    }
}

impl StatsStatements {
    /// `from` is the table as the admin's statements read it (joined to
    /// its bookkeeping table if it has one), `state_type` the state
    /// column's type.
    pub(super) fn new(
        options: &PgStoreOptions,
        names: &Names,
        from: &str,
        state_type: &str,
        shape: &super::TableShape,
    ) -> StatsStatements {
        let table = options.table_name();
        let schema_name = literal(table.schema.as_str());
        let table_name = literal(table.name.as_str());
        let column = |c: Column| options.column_name(c).map(|i| literal(i.as_str()));
        let (live, stalled) = live_statements(options, names, from, state_type, shape);
        if shape.partitioned {
            let state_column = column(Column::State).unwrap_or_else(|| literal("state"));
            let kind_column = names.get(Column::Kind).and(column(Column::Kind));
            let (size, shares) =
                partitioned_statements(&literal(&table.quoted()), &state_column, kind_column);
            return StatsStatements {
                size,
                shares,
                live,
                stalled,
            };
        }
        let size = Statement {
            text: format!(
                "SELECT CASE WHEN c.reltuples < 0 OR c.relpages = 0 THEN NULL \
                 ELSE LEAST(NULLIF((SELECT s.n_live_tup FROM pg_catalog.pg_stat_user_tables AS s \
                 WHERE s.relid = c.oid), 0), CAST(c.reltuples / c.relpages \
                 * (pg_relation_size(c.oid) / CAST(current_setting('block_size') AS float8)) AS int8)) END \
                 AS \"rows\" FROM pg_catalog.pg_class AS c WHERE c.oid = to_regclass({})",
                literal(&table.quoted())
            )
            .into(),
            params: Vec::new(),
        };

        let state_column = column(Column::State).unwrap_or_else(|| literal("state"));
        // Per state and kind where both columns are the table's own and
        // extended statistics over just the two exist; else per state.
        let pairs = match (
            names.get(Column::Kind).and(column(Column::Kind)),
            names.get(Column::State),
        ) {
            (Some(kind_column), Some(_)) => Some(format!(
                "SELECT s.v[i][s.sp] AS \"state\", s.v[i][s.kp] AS \"kind\", s.f[i] AS \"share\" \
                 FROM (SELECT e.most_common_vals AS v, e.most_common_freqs AS f, \
                 array_position(e.attnames, CAST({state_column} AS name)) AS sp, \
                 array_position(e.attnames, CAST({kind_column} AS name)) AS kp \
                 FROM pg_catalog.pg_stats_ext AS e \
                 WHERE e.schemaname = {schema_name} AND e.tablename = {table_name} \
                 AND e.attnames @> ARRAY[CAST({state_column} AS name), CAST({kind_column} AS name)] \
                 AND cardinality(e.attnames) = 2 AND e.most_common_vals IS NOT NULL \
                 ORDER BY e.inherited DESC LIMIT 1) AS s, generate_subscripts(s.f, 1) AS i"
            )),
            _ => None,
        };
        let per_state = format!(
            "SELECT u.v AS \"state\", CAST(NULL AS text) AS \"kind\", u.f AS \"share\" \
             FROM (SELECT CAST(CAST(p.most_common_vals AS text) AS text[]) AS v, p.most_common_freqs AS f \
             FROM pg_catalog.pg_stats AS p \
             WHERE p.schemaname = {schema_name} AND p.tablename = {table_name} AND p.attname = {state_column} \
             ORDER BY p.inherited DESC LIMIT 1) AS s, unnest(s.v, s.f) AS u(v, f)"
        );
        let shares = Statement {
            text: match pairs {
                Some(pairs) => format!(
                    "WITH pairs AS ({pairs}) SELECT \"state\", \"kind\", \"share\" FROM pairs \
                     UNION ALL SELECT * FROM ({per_state}) AS per_state WHERE NOT EXISTS (SELECT 1 FROM pairs)"
                ),
                None => per_state,
            }
            .into(),
            params: Vec::new(),
        };

        StatsStatements {
            size,
            shares,
            live,
            stalled,
        }
    }
}

/// The size and shares of a partitioned table, from its leaf partitions'
/// own statistics, which autovacuum keeps (it never analyzes the
/// partitioned table itself): each partition's rows, as the plain table's
/// are estimated, and within it the shares of its states and of its kinds
/// (taken as independent; in a table partitioned by state each finished
/// partition holds one state). `table` is the table's quoted name as a
/// literal.
fn partitioned_statements(
    table: &str,
    state_column: &str,
    kind_column: Option<String>,
) -> (Statement, Statement) {
    let leaves = format!(
        "SELECT c.oid, n.nspname, c.relname, \
         CAST(CASE WHEN c.reltuples < 0 OR c.relpages = 0 THEN coalesce(s.n_live_tup, 0) \
         ELSE LEAST(NULLIF(s.n_live_tup, 0), c.reltuples / c.relpages \
         * (pg_relation_size(c.oid) / CAST(current_setting('block_size') AS float8))) END AS float8) AS \"rows\" \
         FROM pg_catalog.pg_partition_tree(to_regclass({table})) AS t \
         JOIN pg_catalog.pg_class AS c ON c.oid = t.relid \
         JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
         LEFT JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid WHERE t.isleaf"
    );
    let size = Statement {
        text: format!("SELECT CAST(sum(l.\"rows\") AS int8) AS \"rows\" FROM ({leaves}) AS l")
            .into(),
        params: Vec::new(),
    };
    // Materialized, and the statistics of every partition read in one
    // join: planned as nested loops over the leaves, the same read took
    // over ten times as long with a hundred partitions.
    let values = |column: &str| {
        format!(
            "SELECT st.oid, u.v, u.f FROM stats AS st, unnest(st.v, st.f) AS u(v, f) \
             WHERE st.attname = {column}"
        )
    };
    let (columns, kinds, kind, kind_share, join_kinds) = match kind_column {
        Some(kind_column) => (
            format!("{state_column}, {kind_column}"),
            format!(", kinds AS ({})", values(&kind_column)),
            "k.v",
            "coalesce(k.f, 1)",
            "LEFT JOIN kinds AS k ON k.oid = l.oid",
        ),
        None => (
            state_column.to_owned(),
            String::new(),
            "CAST(NULL AS text)",
            "1",
            "",
        ),
    };
    let shares = Statement {
        text: format!(
            "WITH leaves AS MATERIALIZED ({leaves}), \
             stats AS MATERIALIZED (SELECT l.oid, p.attname, \
             CAST(CAST(p.most_common_vals AS text) AS text[]) AS v, p.most_common_freqs AS f \
             FROM pg_catalog.pg_stats AS p JOIN leaves AS l \
             ON p.schemaname = l.nspname AND p.tablename = l.relname \
             WHERE p.attname IN ({columns}) AND NOT p.inherited), \
             states AS ({}){kinds}, \
             total AS (SELECT sum(\"rows\") AS n FROM leaves) \
             SELECT s.v AS \"state\", {kind} AS \"kind\", \
             CAST(sum(l.\"rows\" * s.f * {kind_share}) / NULLIF(max(total.n), 0) AS float8) AS \"share\" \
             FROM leaves AS l JOIN states AS s ON s.oid = l.oid {join_kinds} CROSS JOIN total \
             GROUP BY 1, 2",
            values(state_column)
        )
        .into(),
        params: Vec::new(),
    };
    (size, shares)
}

/// The capped count of waiting and running jobs, and the stalled count.
fn live_statements(
    options: &PgStoreOptions,
    names: &Names,
    from: &str,
    st: &str,
    shape: &super::TableShape,
) -> (Statement, Statement) {
    let state = names.must(Column::State);
    let id = names.must(Column::Id);
    let values = |states: &[JobState]| {
        states
            .iter()
            .flat_map(|s| options.stored_values(*s))
            .map(|v| format!("CAST({} AS {st})", literal(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let waiting = format!(
        "{state} IN ({}){}",
        values(&[JobState::Queued, JobState::Errored]),
        shape.times_of(names, &[JobState::Queued, JobState::Errored])
    );
    let processing = format!(
        "{state} IN ({}){}",
        values(&[JobState::Processing]),
        shape.times_of(names, &[JobState::Processing])
    );
    let kind = names
        .at(Column::Kind)
        .map(|k| format!("CAST({k} AS text)"))
        .unwrap_or_else(|| "CAST(NULL AS text)".to_owned());
    let since = claimable_since(names).unwrap_or_else(|| "CAST(NULL AS timestamptz)".to_owned());
    // Each set in the order of the index that holds it on the default
    // table (the claim's order, the due time, the key), so that its scan
    // stops at the cap instead of sorting every match.
    let claim_order = super::claim_order(options, names.at(Column::Priority), &id);
    let mut b = Builder::default();
    let cap = b.p(Param::Limit);
    let set = |n: i32, condition: &str, since: &str, due: &str, order: &str| {
        format!(
            "(SELECT {n} AS \"set\", CAST({state} AS text) AS \"state\", {kind} AS \"kind\", \
             {since} AS \"since\", {due} AS \"due\" FROM {from} WHERE {condition} ORDER BY {order} LIMIT {cap})"
        )
    };
    let sets = match names.at(Column::ProcessAfter) {
        Some(after) => {
            let now = b.p(Param::Now);
            vec![
                set(
                    1,
                    &format!("{waiting} AND {after} IS NULL"),
                    &since,
                    "true",
                    &claim_order,
                ),
                set(
                    2,
                    &format!("{waiting} AND {after} IS NOT NULL"),
                    &since,
                    &format!("{after} <= {now}"),
                    &after,
                ),
                set(3, &processing, "CAST(NULL AS timestamptz)", "false", &id),
            ]
        }
        None => vec![
            set(1, &waiting, &since, "true", &claim_order),
            set(3, &processing, "CAST(NULL AS timestamptz)", "false", &id),
        ],
    };
    b.push(&format!(
        "SELECT \"set\", \"state\", \"kind\", count(*) AS \"count\", \
         min(\"since\") FILTER (WHERE \"due\") AS \"oldest\" FROM ({}) AS live GROUP BY 1, 2, 3",
        sets.join(" UNION ALL ")
    ));
    let live = b.build();

    let mut b = Builder::default();
    let stalled = stalled_count(&mut b, names, from, &processing);
    b.push(&format!("SELECT {stalled} AS \"stalled\""));
    (live, b.build())
}

/// Since when a waiting job has been claimable: the later of its enqueue
/// time and its `process_after`, of those the table has; `None` with
/// neither.
pub(super) fn claimable_since(names: &Names) -> Option<String> {
    let since: Vec<String> = [Column::QueuedAt, Column::ProcessAfter]
        .iter()
        .filter_map(|c| names.at(*c))
        .collect();
    (!since.is_empty()).then(|| format!("greatest({})", since.join(", ")))
}

/// `(SELECT count(*) ..)` of the running jobs (`processing`, a condition)
/// silent since before [`Param::StalledBefore`], by their last heartbeat
/// or else their start; a null count where the table keeps neither, since
/// nothing then tells a stalled job from a busy one.
pub(super) fn stalled_count(
    b: &mut Builder,
    names: &Names,
    from: &str,
    processing: &str,
) -> String {
    match names
        .at(Column::LastHeartbeatAt)
        .or_else(|| names.at(Column::StartedAt))
    {
        Some(since) => format!(
            "(SELECT count(*) FROM {from} WHERE {processing} AND ({since} IS NULL OR {since} < {}))",
            b.p(Param::StalledBefore)
        ),
        None => "CAST(NULL AS int8)".to_owned(),
    }
}
