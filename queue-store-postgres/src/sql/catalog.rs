//! Start-up validation: the configured table, view, columns, types and
//! state values, checked against the live catalog. Every mismatch is a
//! `StoreError::Config` naming the object and what was expected.

use std::collections::HashMap;

use queue_core::{JobState, StoreError};
use sqlx::{PgPool, Row};

use super::{bookkeeping, TableShape};
use crate::error::store_error;
use crate::ident::{Ident, QualifiedName};
use crate::options::{Column, PgStoreOptions};

const RELATION: &str = "SELECT c.oid::int8 AS oid, c.relkind::text AS kind \
     FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
     WHERE n.nspname = $1 AND c.relname = $2";

const COLUMNS: &str =
    "SELECT a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS type, \
     t.typtype::text AS typtype, a.atttypid::int8 AS type_oid, a.attnotnull AS not_null, \
     CASE WHEN t.typcategory = 'A' THEN format_type(t.typelem, NULL) END AS element, \
     pg_get_expr(d.adbin, d.adrelid) AS default_value \
     FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
     LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
     WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// Whether the table `$1` has inheritance children (partitions are
/// children too, but a partitioned table is told by its kind).
const HAS_CHILDREN: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhparent = $1::oid)";

/// Whether the table has a trigger of this name (`$2`): the default
/// table's notify trigger.
const HAS_TRIGGER: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger \
     WHERE tgrelid = $1::oid AND tgname = $2 AND NOT tgisinternal)";

/// Whether an index of the table starts with the column named $2.
const HAS_INDEX_ON: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i \
     JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
     WHERE i.indrelid = $1::oid AND a.attname = $2)";

/// The predicates of the partial indexes of the table `$1`.
const PARTIAL_INDEX_PREDICATES: &str = "SELECT pg_get_expr(i.indpred, i.indrelid) \
     FROM pg_catalog.pg_index AS i WHERE i.indrelid = $1::oid AND i.indpred IS NOT NULL";

/// Whether the table `$1` has a valid index named `$2` (in its schema).
const HAS_VALID_INDEX_NAMED: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i \
     JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid \
     WHERE i.indrelid = $1::oid AND c.relname = $2 AND i.indisvalid)";

/// Whether an index of pg_trgm's trigram operator classes starts with
/// the column named $2: a failure text search reads it.
const HAS_TRIGRAM_INDEX_ON: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i \
     JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
     JOIN pg_catalog.pg_opclass AS o ON o.oid = i.indclass[0] \
     WHERE i.indrelid = $1::oid AND a.attname = $2 AND i.indisvalid \
     AND o.opcname IN ('gin_trgm_ops', 'gist_trgm_ops'))";

/// Whether an index's predicate leaves out the rows where the column named
/// $2 has a value (`(column IS NULL)` among its conditions, as Postgres
/// prints them): the index of jobs ready now.
const HAS_INDEX_WITHOUT: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i \
     WHERE i.indrelid = $1::oid AND i.indpred IS NOT NULL \
     AND strpos(pg_get_expr(i.indpred, i.indrelid), '(' || quote_ident($2) || ' IS NULL)') > 0)";

/// Whether the column `$3` of the table `$1`.`$2` has statistics, and
/// whether the table has a row.
pub(crate) fn statistics_present(table: &QualifiedName) -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stats \
         WHERE schemaname = $1 AND tablename = $2 AND attname = $3), \
         EXISTS (SELECT 1 FROM {t}), \
         (SELECT greatest(c.reltuples, 0)::int8 FROM pg_catalog.pg_class AS c \
          WHERE c.oid = '{t}'::regclass)",
        t = table.quoted()
    )
}

/// What an `ANALYZE` refreshes of the table: its `columns` (quoted names),
/// those a claim's plan depends on, which is quicker than every column (a
/// payload column's statistics are the dearest to compute). One `ANALYZE`
/// takes several, separated by commas.
pub(crate) fn analyze_target(table: &QualifiedName, columns: &[String]) -> String {
    format!("{} ({})", table.quoted(), columns.join(", "))
}

/// The `ANALYZE` of `targets` (quoted names, or [`analyze_target`]s) that
/// the store and the admin run in the background, to freshen estimates.
/// It skips a table whose lock it would wait for (Postgres says so in a
/// warning) rather than wait: the lock's holder may be a concurrent index
/// build of `queue migrate`, which in turn waits for every transaction
/// older than its last phase, this one included, and Postgres ends that
/// cycle by failing the build as a deadlock. A vacuum holding the lock
/// analyzes as it goes, and the next analysis asked for comes soon enough.
pub(crate) fn analyze_skipping_locked(targets: &[String]) -> String {
    format!("ANALYZE (SKIP_LOCKED) {}", targets.join(", "))
}

/// The predicates (NULL: none) of the unique, valid, immediate indexes of
/// the table (`$1`) whose one key column is the column named `$2`, with no
/// expression: the indexes an `ON CONFLICT DO NOTHING` reads for it.
const UNIQUE_INDEXES_ON: &str = "SELECT pg_get_expr(i.indpred, i.indrelid) AS predicate \
     FROM pg_catalog.pg_index AS i \
     JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
     WHERE i.indrelid = $1::oid AND a.attname = $2 AND i.indisunique AND i.indisvalid \
     AND i.indimmediate AND i.indnkeyatts = 1 AND i.indexprs IS NULL";

/// The leaf partitions of the partitioned table `$1` (oid), each with its
/// partition constraint; none for a table not partitioned.
const LEAF_PARTITIONS: &str =
    "SELECT CAST(c.oid AS int8), CAST(n.nspname AS text), CAST(c.relname AS text), \
     pg_get_partition_constraintdef(t.relid) \
     FROM pg_catalog.pg_partition_tree(CAST($1::oid AS regclass)) AS t \
     JOIN pg_catalog.pg_class AS c ON c.oid = t.relid \
     JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace WHERE t.isleaf AND t.level > 0";

const ENUM_LABELS: &str =
    "SELECT enumlabel::text FROM pg_catalog.pg_enum WHERE enumtypid = $1::oid ORDER BY enumsortorder";

struct ColumnInfo {
    type_name: String,
    typtype: String,
    type_oid: i64,
    element: Option<String>,
    not_null: bool,
    /// The column's default expression, as the catalog prints it.
    default_value: Option<String>,
}

async fn relation(
    pool: &PgPool,
    name: &QualifiedName,
) -> Result<Option<(i64, String)>, StoreError> {
    let row = sqlx::query(RELATION)
        .bind(name.schema.as_str())
        .bind(name.name.as_str())
        .fetch_optional(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))?;
    Ok(row.map(|r| (r.get("oid"), r.get("kind"))))
}

/// A relation's columns by name, and their names in table order.
async fn columns(
    pool: &PgPool,
    oid: i64,
) -> Result<(HashMap<String, ColumnInfo>, Vec<String>), StoreError> {
    let rows = sqlx::query(COLUMNS)
        .bind(oid)
        .fetch_all(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))?;
    let order = rows.iter().map(|r| r.get::<String, _>("name")).collect();
    let by_name = rows
        .into_iter()
        .map(|r| {
            (
                r.get::<String, _>("name"),
                ColumnInfo {
                    type_name: r.get("type"),
                    typtype: r.get("typtype"),
                    type_oid: r.get("type_oid"),
                    element: r.get("element"),
                    not_null: r.get("not_null"),
                    default_value: r.get("default_value"),
                },
            )
        })
        .collect();
    Ok((by_name, order))
}

/// The configured archive, checked to hold every column of the table with
/// its type, and the table's columns to move; `None` without one.
async fn archive(
    pool: &PgPool,
    options: &PgStoreOptions,
    cols: &HashMap<String, ColumnInfo>,
    order: &[String],
) -> Result<Option<(String, Vec<String>)>, StoreError> {
    let Some(archive) = &options.archive else {
        return Ok(None);
    };
    let table = &options.table;
    let like = format!("create it with `CREATE TABLE {archive} (LIKE {table})`");
    let (oid, kind) = relation(pool, archive).await?.ok_or_else(|| {
        StoreError::Config(format!("archive table {archive} does not exist; {like}"))
    })?;
    if kind != "r" && kind != "p" {
        return Err(StoreError::Config(format!(
            "archive {archive} is not a table (relkind {kind:?}); {like}"
        )));
    }
    let (archived, _) = columns(pool, oid).await?;
    for name in order {
        let ours = &cols[name.as_str()].type_name;
        match archived.get(name.as_str()) {
            None => {
                return Err(StoreError::Config(format!(
                    "archive table {archive} has no column \"{name}\" ({ours}), which {table} has; add it with `ALTER TABLE {archive} ADD COLUMN \"{name}\" {ours}`"
                )))
            }
            Some(theirs) if &theirs.type_name != ours => {
                return Err(StoreError::Config(format!(
                    "archive table {archive} column \"{name}\" is {}, but {table} has {ours}; purged rows could not be moved",
                    theirs.type_name
                )))
            }
            Some(_) => {}
        }
    }
    let quoted = order
        .iter()
        .map(|name| format!("\"{}\"", name.replace('"', "\"\"")))
        .collect();
    Ok(Some((archive.quoted(), quoted)))
}

/// The table's columns in order, enum columns cast to text, or `None` if
/// it has no enum column.
fn text_select(
    options: &PgStoreOptions,
    cols: &HashMap<String, ColumnInfo>,
    order: &[String],
) -> Option<String> {
    if !cols.values().any(|c| c.typtype == "e") {
        return None;
    }
    let alias = options.alias.quoted();
    let list: Vec<String> = order
        .iter()
        .filter_map(|name| {
            let info = cols.get(name)?;
            // A name from the catalog: a valid identifier.
            let quoted = crate::ident::Ident::new(name.as_str()).ok()?.quoted();
            Some(if info.typtype == "e" {
                format!("CAST({alias}.{quoted} AS text) AS {quoted}")
            } else {
                format!("{alias}.{quoted}")
            })
        })
        .collect();
    Some(list.join(", "))
}

/// The types a standard column may have (`format_type` spellings; varchar
/// with a length shows as `character varying(n)`).
fn accepted_types(column: Column) -> &'static [&'static str] {
    const TEXT: &[&str] = &["text", "character varying"];
    const TIME: &[&str] = &["timestamp with time zone"];
    const INT: &[&str] = &["smallint", "integer", "bigint"];
    match column {
        Column::Id | Column::State => &[],
        Column::FailureMessage => &["text", "character varying", "jsonb", "json"],
        Column::WorkerHostname => TEXT,
        Column::QueuedAt
        | Column::StartedAt
        | Column::FinishedAt
        | Column::ProcessAfter
        | Column::LastHeartbeatAt => TIME,
        Column::NumResets | Column::NumFailures | Column::Priority => INT,
        Column::ClaimToken => INT,
        Column::ExecutionLogs => &["json[]", "jsonb[]"],
        Column::Cancel => &["boolean"],
        Column::Kind => TEXT,
        Column::Payload => &["jsonb", "json", "text", "character varying"],
        Column::UniqueKey => TEXT,
        Column::UniqueForever | Column::AtMostOnce => &["boolean"],
        Column::MaxAttempts | Column::AttemptsLeft => INT,
        Column::ExpiresAt => TIME,
    }
}

fn type_matches(actual: &str, accepted: &[&str]) -> bool {
    accepted
        .iter()
        .any(|t| actual == *t || actual.starts_with(&format!("{t}(")))
}

/// Checks the table (and view) against `options`; `key_types` are the
/// Postgres types the store's key type decodes from. Returns the table's
/// shape and the standard columns declared absent.
/// The type of the key column of the table `options` describe
/// (`format_type`), which its bookkeeping table's key shares.
pub(crate) async fn key_type(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<String, StoreError> {
    let table = &options.table;
    let (oid, _) = relation(pool, table).await?.ok_or_else(|| {
        StoreError::Config(format!(
            "table {table} does not exist; its bookkeeping table takes its key type from it"
        ))
    })?;
    let (cols, _) = columns(pool, oid).await?;
    let key = options.column_name(Column::Id).map_or("id", |k| k.as_str());
    cols.get(key)
        .map(|info| info.type_name.clone())
        .ok_or_else(|| {
            StoreError::Config(format!(
                "table {table} has no key column \"{key}\" (configured for id)"
            ))
        })
}

/// Who the table is inspected for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum User {
    /// A store that runs jobs: a standard column the table lacks must be
    /// declared absent (or mapped), since losing it changes what a job
    /// run does.
    Worker,
    /// The admin contract: any standard column but the key and the state
    /// that is neither mapped by name nor present is simply absent, so a
    /// table is read as it is.
    Reader,
}

pub(crate) async fn inspect(
    pool: &PgPool,
    options: &PgStoreOptions,
    key_types: &[&str],
    user: User,
) -> Result<(TableShape, Vec<Column>), StoreError> {
    let table = &options.table;
    let (oid, kind) = relation(pool, table).await?.ok_or_else(|| {
        StoreError::Config(format!(
            "table {table} does not exist; create it (the default table: `queue migrate`) or point the options at an existing one"
        ))
    })?;
    if kind != "r" && kind != "p" {
        return Err(StoreError::Config(format!(
            "{table} is not a table (relkind {kind:?}); the store updates rows, so it needs a table, with any view configured separately"
        )));
    }
    let (cols, order) = columns(pool, oid).await?;
    let mut failure_json = None;
    let mut absent = Vec::new();
    let mut state_type = String::new();
    let mut key_type = String::new();
    let mut log_element = "json".to_owned();
    let mut payload_type = None;
    for column in Column::ALL {
        let Some(name) = options.column_name(column) else {
            absent.push(column);
            continue;
        };
        // A store with a bookkeeping table takes the table as it is, as an
        // admin does (start-up logs each column it goes without).
        let as_it_is = user == User::Reader || options.bookkeeping.is_some();
        let optional = if as_it_is {
            !matches!(column, Column::Id | Column::State)
        } else {
            column.optional_by_default()
        };
        if optional && !options.named.contains(&column) && !cols.contains_key(name.as_str()) {
            absent.push(column);
            continue;
        }
        let info = cols.get(name.as_str()).ok_or_else(|| {
            StoreError::Config(format!(
                "table {table} has no column {name} (configured for {column}); rename it with `column(Column::{column:?}, ..)` or declare it absent with `without(Column::{column:?})`"
            ))
        })?;
        match column {
            Column::Id => {
                if !type_matches(&info.type_name, key_types) {
                    return Err(StoreError::Config(format!(
                        "key column {name} of {table} has type {}, but the store's key type decodes from {}",
                        info.type_name,
                        key_types.join(" or ")
                    )));
                }
                key_type = info.type_name.clone();
            }
            Column::State => {
                state_type = info.type_name.clone();
                if info.typtype == "e" {
                    check_enum_labels(pool, options, &info.type_name, info.type_oid).await?;
                } else if !type_matches(&info.type_name, &["text", "character varying"]) {
                    return Err(StoreError::Config(format!(
                        "state column {name} of {table} has type {}; expected text, varchar or an enum",
                        info.type_name
                    )));
                }
            }
            _ => {
                let accepted = accepted_types(column);
                if !type_matches(&info.type_name, accepted) {
                    return Err(StoreError::Config(format!(
                        "column {name} of {table} ({column}) has type {}; expected {}",
                        info.type_name,
                        accepted.join(" or ")
                    )));
                }
                if column == Column::ExecutionLogs {
                    log_element = info.element.clone().unwrap_or_else(|| "json".into());
                }
                if column == Column::Payload {
                    payload_type = Some(info.type_name.clone());
                }
                if column == Column::FailureMessage {
                    failure_json = matches!(info.type_name.as_str(), "json" | "jsonb").then(|| {
                        super::FailureJson {
                            type_name: info.type_name.clone(),
                            path: options.failure_message_path.clone(),
                        }
                    });
                }
            }
        }
    }
    if let Some(view) = &options.view {
        let (view_oid, view_kind) = relation(pool, view)
            .await?
            .ok_or_else(|| StoreError::Config(format!("view {view} does not exist")))?;
        if view_kind != "v" && view_kind != "m" && view_kind != "r" {
            return Err(StoreError::Config(format!(
                "{view} is not a view (relkind {view_kind:?})"
            )));
        }
        let (view_cols, _) = columns(pool, view_oid).await?;
        let key = options
            .column_name(Column::Id)
            .map(|i| i.as_str())
            .unwrap_or("id");
        if !view_cols.contains_key(key) {
            return Err(StoreError::Config(format!(
                "view {view} has no key column \"{key}\"; the store matches view rows to claimed rows by it, so the view must select it"
            )));
        }
    }
    let mut due_apart = false;
    if let Some(after) = options.column_name(Column::ProcessAfter) {
        if let Some(info) = cols
            .get(after.as_str())
            .filter(|_| !absent.contains(&Column::ProcessAfter))
        {
            let catalog = |sql: &'static str| async move {
                sqlx::query_scalar::<_, bool>(sql)
                    .bind(oid)
                    .bind(after.as_str())
                    .fetch_one(pool)
                    .await
                    .map_err(|e| store_error("reading the catalog", e))
            };
            let due_index = catalog(HAS_INDEX_ON).await?;
            let ready_index = catalog(HAS_INDEX_WITHOUT).await?;
            due_apart = !info.not_null && due_index && ready_index;
            if !due_index {
                tracing::warn!(
                    %table,
                    column = %after,
                    "no index starts with the process_after column: an idle worker reads every waiting row to learn when the next scheduled job comes due, and claims step over every job scheduled ahead or waiting to retry; create the two indexes of docs/existing-tables.md (\"Scheduled and retrying jobs\")"
                );
            } else if !info.not_null && !ready_index {
                tracing::warn!(
                    %table,
                    column = %after,
                    "no index leaves out the rows with a process_after (a predicate with `process_after IS NULL`): claims step over every job scheduled ahead or waiting to retry; create the index of ready jobs of docs/existing-tables.md (\"Scheduled and retrying jobs\")"
                );
            } else if info.not_null {
                tracing::info!(
                    %table,
                    column = %after,
                    "process_after is NOT NULL, so every job has a time: claims read the claim order and step over jobs scheduled ahead (docs/existing-tables.md, \"Scheduled and retrying jobs\")"
                );
            }
        }
    }
    let side = match &options.bookkeeping {
        Some(name) => side_table(pool, options, name, &key_type, &mut absent).await?,
        None => None,
    };
    if side
        .as_ref()
        .is_some_and(|s| s.carries(Column::ExecutionLogs))
    {
        log_element = "jsonb".to_owned();
    }
    if !absent.contains(&Column::MaxAttempts) && !absent.contains(&Column::AttemptsLeft) {
        return Err(StoreError::Config(format!(
            "table {table} has both a max_attempts column and an attempts_left column; a job's limit is kept one way: map one, and declare the other absent (`without(Column::..)`; in a config file, columns.max_attempts = false)"
        )));
    }
    // A job enqueued without a limit of its own starts with the countdown
    // column's default (the catalog's own text).
    let attempts_left_default = options
        .column_name(Column::AttemptsLeft)
        .filter(|_| !absent.contains(&Column::AttemptsLeft))
        .and_then(|name| cols.get(name.as_str()))
        .and_then(|info| info.default_value.clone());
    let partitioned = kind == "p";
    let inherited = !partitioned
        && sqlx::query_scalar::<_, bool>(HAS_CHILDREN)
            .bind(oid)
            .fetch_one(pool)
            .await
            .map_err(|e| store_error("reading the catalog", e))?;
    let live = if partitioned {
        live_partitions(pool, oid, options).await?
    } else {
        Vec::new()
    };
    let unique_unenforced = match options.column_name(Column::UniqueKey) {
        Some(key) if !absent.contains(&Column::UniqueKey) => {
            unique_index_problem(pool, oid, options, key.as_str(), &live).await?
        }
        _ => None,
    };
    if let Some(problem) = &unique_unenforced {
        match user {
            // Two processes enqueueing the same key (the scheduler's one
            // job per occurrence) would both insert it.
            User::Worker => return Err(StoreError::Config(problem.clone())),
            User::Reader => {
                tracing::warn!(%table, "{problem}; enqueues with a unique key are refused until then");
            }
        }
    }
    let (finished_indexed, queued_indexed) =
        missing_indexes(pool, oid, partitioned, options, &absent).await?;
    let notify_trigger: bool = sqlx::query_scalar(HAS_TRIGGER)
        .bind(oid)
        .bind(super::default_table::derived_name(&table.name, "notify"))
        .fetch_one(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))?;
    // The default table's states, in its own values, and its index of
    // finished jobs by kind: every row is finished, waiting or running,
    // and each of these is in an index.
    // A text failure column with a trigram index: a json one's message is
    // an expression such an index would have to be built on.
    let failure_indexed = match options.column_name(Column::FailureMessage) {
        Some(name) if !absent.contains(&Column::FailureMessage) && failure_json.is_none() => {
            sqlx::query_scalar(HAS_TRIGRAM_INDEX_ON)
                .bind(oid)
                .bind(name.as_str())
                .fetch_one(pool)
                .await
                .map_err(|e| store_error("reading the catalog", e))?
        }
        _ => false,
    };
    // The default table laid out for claims in place: its index of ready
    // jobs names the times, which its readers then name too.
    let in_place_claims = default_table_candidate(notify_trigger, options)
        && !absent.contains(&Column::FinishedAt)
        && !absent.contains(&Column::ProcessAfter)
        && has_valid_index(
            pool,
            oid,
            &super::default_table::derived_name(&table.name, super::default_table::READY_INDEX),
        )
        .await?;
    let limited_ledger = in_place_claims
        && relation_exists(pool, &super::limited::ledger_table(table)).await?
        && relation_exists(pool, &super::limited::counted_table(table)).await?;
    // Its index of finished jobs by kind, under either layout's name.
    let kind_index = if in_place_claims {
        super::default_table::IN_PLACE_FINISHED_KIND_INDEX
    } else {
        super::default_table::FINISHED_KIND_INDEX
    };
    let kind_split = default_table_candidate(notify_trigger, options)
        && has_valid_index(
            pool,
            oid,
            &super::default_table::derived_name(&table.name, kind_index),
        )
        .await?;
    for column in absent.iter().filter(|c| c.absence_matters()) {
        tracing::info!(table = %options.table, column = column.standard_name(), "column absent: {}", column.feature_lost());
    }
    let nullable_times = [Column::FinishedAt, Column::ProcessAfter]
        .into_iter()
        .filter(|c| !absent.contains(c))
        .filter(|c| {
            options
                .column_name(*c)
                .and_then(|name| cols.get(name.as_str()))
                .is_some_and(|info| !info.not_null)
        })
        .collect();
    Ok((
        TableShape {
            state_type,
            key_type,
            log_element,
            payload_type,
            notify_trigger,
            failure_json,
            text_select: text_select(options, &cols, &order),
            archive: archive(pool, options, &cols, &order).await?,
            due_apart,
            unique_unenforced,
            attempts_left_default,
            side,
            finished_indexed,
            kind_split,
            failure_indexed,
            queued_indexed,
            partitioned,
            live_partitions: live.into_iter().map(|(_, name)| name).collect(),
            inherited,
            nullable_times,
            in_place_claims,
            limited_ledger,
        },
        absent,
    ))
}

/// Whether the table may be the default table, whose layout the catalog
/// tells by its indexes' names: it has the default table's notify
/// trigger and the default state values.
fn default_table_candidate(notify_trigger: bool, options: &PgStoreOptions) -> bool {
    notify_trigger && options.states == crate::options::StateValues::default()
}

/// Whether the table `oid` has a valid index named `name`.
/// Whether relation `name` exists.
async fn relation_exists(pool: &PgPool, name: &QualifiedName) -> Result<bool, StoreError> {
    sqlx::query_scalar(super::default_table::RELATION_EXISTS)
        .bind(name.quoted())
        .fetch_one(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))
}

async fn has_valid_index(pool: &PgPool, oid: i64, name: &str) -> Result<bool, StoreError> {
    index_question(pool, HAS_VALID_INDEX_NAMED, oid, name).await
}

/// Names each index the operator surfaces and the sweeps read that the
/// table lacks (an index starting with the finish-time column, the expiry
/// column, the kind column, the queued-time column), with the statement
/// that would create it (one that is not concurrent on a `partitioned`
/// table, which Postgres cannot build concurrently); returns whether the
/// finish-time one and the queued-time one exist.
async fn missing_indexes(
    pool: &PgPool,
    oid: i64,
    partitioned: bool,
    options: &PgStoreOptions,
    absent: &[Column],
) -> Result<(bool, bool), StoreError> {
    let table = options.table_name();
    let id = options
        .column_name(Column::Id)
        .map_or_else(|| "\"id\"".to_owned(), |i| i.quoted());
    let mut finished_indexed = false;
    let mut queued_indexed = false;
    for (column, reads, definition) in [
        (
            Column::FinishedAt,
            "the timeline, retention and purges read every finished row",
            "({c}, {id}) WHERE {c} IS NOT NULL",
        ),
        (
            Column::ExpiresAt,
            "the expiry sweep reads every waiting job",
            "({c}) WHERE {c} IS NOT NULL",
        ),
        (
            Column::Kind,
            "a list of one kind reads every row when the kind is rare",
            "({c}, {id})",
        ),
        (
            Column::QueuedAt,
            "a list of a queued-time range walks every job queued since",
            "USING brin ({c})",
        ),
    ] {
        let Some(name) = options
            .column_name(column)
            .filter(|_| !absent.contains(&column))
        else {
            continue;
        };
        let indexed = has_index_on(pool, oid, name.as_str()).await?;
        match column {
            Column::FinishedAt => finished_indexed = indexed,
            Column::QueuedAt => queued_indexed = indexed,
            _ => {}
        }
        if !indexed {
            let definition = definition
                .replace("{c}", &name.quoted())
                .replace("{id}", &id);
            let create = index_statements(table, &[definition], partitioned);
            tracing::warn!(
                %table,
                column = name.as_str(),
                "no index starts with this column: {reads}, which is slow on a big table; create one with: {create}"
            );
        }
    }
    if !absent.contains(&Column::State) && !serves_failed_lists(pool, oid, options).await? {
        let state = options
            .column_name(Column::State)
            .map_or_else(|| "\"state\"".to_owned(), |s| s.quoted());
        let values = options.state_values();
        let unsuccessful = format!(
            "{state} IN ({}, {})",
            super::literal(values.get(JobState::Failed)),
            super::literal(values.get(JobState::Canceled))
        );
        let mut definitions = vec![format!("({id}) WHERE {unsuccessful}")];
        if let Some(kind) = options
            .column_name(Column::Kind)
            .filter(|_| !absent.contains(&Column::Kind))
        {
            definitions.push(format!(
                "({state}, {}, {id}) WHERE {unsuccessful}",
                kind.quoted()
            ));
        }
        let create = index_statements(table, &definitions, partitioned);
        tracing::warn!(
            %table,
            "no index serves a list of failed or canceled jobs: a page of them walks every job \
             newer than the failures it shows (a page of one kind, every job of that kind), which \
             is slow on a big table where few jobs fail; create them with: {create}"
        );
    }
    Ok((finished_indexed, queued_indexed))
}

/// The statements that create an index of each of `definitions` on
/// `table`: concurrently, or on a `partitioned` table (which Postgres
/// cannot index concurrently) not, with how to keep writes going.
fn index_statements(table: &QualifiedName, definitions: &[String], partitioned: bool) -> String {
    let how = if partitioned {
        "CREATE INDEX"
    } else {
        "CREATE INDEX CONCURRENTLY"
    };
    let statements: Vec<String> = definitions
        .iter()
        .map(|definition| format!("{how} ON {table} {definition}"))
        .collect();
    let statements = statements.join("; ");
    if partitioned {
        format!(
            "{statements} (a partitioned table's indexes are not built concurrently: to keep \
             writes going, create each ON ONLY the table, then each partition's with CREATE \
             INDEX CONCURRENTLY, attached with ALTER INDEX .. ATTACH PARTITION)"
        )
    } else {
        statements
    }
}

/// Whether an index of the table `oid` starts with the column `name`.
async fn has_index_on(pool: &PgPool, oid: i64, name: &str) -> Result<bool, StoreError> {
    index_question(pool, HAS_INDEX_ON, oid, name).await
}

/// The answer of `question` (a catalog query of the table `$1` and a name
/// `$2`) about the indexes of the table `oid`.
async fn index_question(
    pool: &PgPool,
    question: &'static str,
    oid: i64,
    name: &str,
) -> Result<bool, StoreError> {
    sqlx::query_scalar(question)
        .bind(oid)
        .bind(name)
        .fetch_one(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))
}

/// Whether an index of the table `oid` finds failed and canceled jobs
/// without reading the others: one that starts with the state column, or
/// a partial one whose predicate holds for a failed and a canceled row and
/// not for a completed or a waiting one.
async fn serves_failed_lists(
    pool: &PgPool,
    oid: i64,
    options: &PgStoreOptions,
) -> Result<bool, StoreError> {
    let Some(state) = options.column_name(Column::State) else {
        return Ok(false);
    };
    if has_index_on(pool, oid, state.as_str()).await? {
        return Ok(true);
    }
    let predicates: Vec<String> = sqlx::query_scalar(PARTIAL_INDEX_PREDICATES)
        .bind(oid)
        .fetch_all(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))?;
    for predicate in predicates {
        let mut only_unsuccessful = true;
        for (held, wanted) in [
            (JobState::Failed, true),
            (JobState::Canceled, true),
            (JobState::Completed, false),
            (JobState::Queued, false),
        ] {
            if holds_in_state(pool, options, None, &predicate, held).await? != wanted {
                only_unsuccessful = false;
                break;
            }
        }
        if only_unsuccessful {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The bookkeeping table `name`, checked against the catalog (it exists,
/// its key has the table's key type, its columns their types), carrying
/// the bookkeeping columns the table lacks: those leave `absent`. `None`
/// when the table lacks none.
async fn side_table(
    pool: &PgPool,
    options: &PgStoreOptions,
    name: &QualifiedName,
    key_type: &str,
    absent: &mut Vec<Column>,
) -> Result<Option<bookkeeping::Side>, StoreError> {
    let table = &options.table;
    let (oid, _) = relation(pool, name).await?.ok_or_else(|| {
        StoreError::Config(format!(
            "the bookkeeping table {name} of {table} does not exist; create it with `queue migrate` (or queue_store_postgres::bookkeeping::migrate)"
        ))
    })?;
    let (cols, _) = columns(pool, oid).await?;
    let key = bookkeeping::KEY.trim_matches('"');
    let expected = std::iter::once((key, key_type)).chain(bookkeeping::EXPECTED_TYPES);
    for (column, ty) in expected {
        match cols.get(column) {
            Some(info) if info.type_name == ty => {}
            Some(info) => {
                return Err(StoreError::Config(format!(
                    "column {column} of the bookkeeping table {name} has type {}, expected {ty} (the key of {table} has type {key_type}); drop the bookkeeping table while no job runs and run `queue migrate` again",
                    info.type_name
                )))
            }
            None => {
                return Err(StoreError::Config(format!(
                    "the bookkeeping table {name} has no column {column}; is it a table of the store's? Run `queue migrate` to bring it up to date"
                )))
            }
        }
    }
    let carried: Vec<Column> = bookkeeping::COLUMNS
        .into_iter()
        .filter(|c| absent.contains(c))
        .collect();
    if carried.is_empty() {
        tracing::info!(%table, bookkeeping = %name, "the table has every bookkeeping column; the bookkeeping table is not used");
        return Ok(None);
    }
    absent.retain(|c| !carried.contains(c));
    tracing::info!(
        %table,
        bookkeeping = %name,
        columns = %carried.iter().map(|c| c.standard_name()).collect::<Vec<_>>().join(", "),
        "the bookkeeping table carries the columns the table lacks"
    );
    Ok(Some(bookkeeping::Side {
        table: name.quoted(),
        columns: carried,
    }))
}

/// Whether `condition` (an index predicate or a partition constraint of
/// the table, the catalog's own text) holds for a row in each waiting or
/// running state, with the text column `key`, if named, set.
async fn holds_while_live(
    pool: &PgPool,
    options: &PgStoreOptions,
    key: Option<&str>,
    condition: &str,
) -> Result<bool, StoreError> {
    for held_state in [JobState::Queued, JobState::Errored, JobState::Processing] {
        if !holds_in_state(pool, options, key, condition, held_state).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `condition` (the catalog's own text) holds for a row of the
/// table in `state`, with the text column `key`, if named, set, and every
/// other column NULL.
async fn holds_in_state(
    pool: &PgPool,
    options: &PgStoreOptions,
    key: Option<&str>,
    condition: &str,
    held_state: JobState,
) -> Result<bool, StoreError> {
    let state = options
        .column_name(Column::State)
        .map_or("state", |s| s.as_str());
    let mut row = serde_json::json!({
        state: options.state_values().get(held_state),
    });
    if let Some(key) = key {
        row[key] = serde_json::json!("k");
    }
    // The condition is the catalog's own text (it calls only immutable
    // functions), never user input.
    let sql = format!(
        "SELECT coalesce(({condition}), false) FROM \
         (SELECT (jsonb_populate_record(NULL::{}, $1)).*) AS \"__queue_row\"",
        options.table.quoted()
    );
    // Not cached on the connection: the table's row type is in the plan,
    // and a table dropped and created again under the same name has a new
    // one ("cache lookup failed for type").
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(sqlx::types::Json(row))
        .persistent(false)
        .fetch_one(pool)
        .await
        .map_err(|e| store_error("evaluating an index's predicate", e))
}

/// The leaf partitions of the partitioned table `oid` that hold every
/// waiting and running job (in a table partitioned by state, its live
/// partition): their oids and names. None for a table not partitioned.
async fn live_partitions(
    pool: &PgPool,
    oid: i64,
    options: &PgStoreOptions,
) -> Result<Vec<(i64, QualifiedName)>, StoreError> {
    let leaves: Vec<(i64, String, String, Option<String>)> = sqlx::query_as(LEAF_PARTITIONS)
        .bind(oid)
        .fetch_all(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))?;
    let mut live = Vec::new();
    for (leaf, schema, name, constraint) in leaves {
        let Some(constraint) = constraint else {
            continue;
        };
        if holds_while_live(pool, options, None, &constraint).await? {
            live.push((
                leaf,
                QualifiedName::new(Ident::new(schema)?, Ident::new(name)?),
            ));
        }
    }
    Ok(live)
}

/// Why the table's unique-key column does not keep keys unique (`None`
/// when it does), with the statement that would: an enqueue's
/// `ON CONFLICT DO NOTHING` fires only on a unique index, so without one
/// covering the waiting and running jobs, duplicates go in silently.
///
/// An index counts when its one key column is the unique-key column and
/// its predicate, if any, holds for a keyed row in each of the queued,
/// errored and processing states: the predicate is evaluated by the
/// database on such a row of the table's own type (every other column
/// NULL), so any form of it is judged by what it does. On a partitioned
/// table, the indexes of the partitions in `live` (those holding every
/// waiting and running job) count too: Postgres keeps a partitioned
/// table's indexes unique only within each partition.
async fn unique_index_problem(
    pool: &PgPool,
    oid: i64,
    options: &PgStoreOptions,
    key: &str,
    live: &[(i64, QualifiedName)],
) -> Result<Option<String>, StoreError> {
    let table = &options.table;
    let held = [JobState::Queued, JobState::Errored, JobState::Processing];
    let state = options
        .column_name(Column::State)
        .map_or("state", |s| s.as_str());
    let holders = std::iter::once(oid).chain(live.iter().map(|(leaf, _)| *leaf));
    let mut predicates: Vec<Option<String>> = Vec::new();
    for holder in holders {
        let found: Vec<Option<String>> = sqlx::query_scalar(UNIQUE_INDEXES_ON)
            .bind(holder)
            .bind(key)
            .fetch_all(pool)
            .await
            .map_err(|e| store_error("reading the catalog", e))?;
        predicates.extend(found);
    }
    for predicate in &predicates {
        let Some(predicate) = predicate else {
            // No predicate: a key is held for as long as its row exists.
            return Ok(None);
        };
        if holds_while_live(pool, options, Some(key), predicate).await? {
            return Ok(None);
        }
    }
    let key_quoted = crate::ident::Ident::new(key)
        .map(|k| k.quoted())
        .unwrap_or_else(|_| key.to_owned());
    let state_quoted = crate::ident::Ident::new(state)
        .map(|s| s.quoted())
        .unwrap_or_else(|_| state.to_owned());
    let mut values: Vec<String> = held
        .iter()
        .map(|s| super::literal(options.state_values().get(*s)))
        .collect();
    values.dedup();
    let forever = options
        .column_name(Column::UniqueForever)
        .map(|f| format!(" OR {}", f.quoted()))
        .unwrap_or_default();
    let found = if predicates.is_empty() {
        "no unique index on it".to_owned()
    } else {
        "its unique indexes leave out waiting or running jobs".to_owned()
    };
    Ok(Some(format!(
        "the unique-key column {key_quoted} of {table} is not kept unique ({found}), so two enqueues of one key would both insert it; create the index: \
         CREATE UNIQUE INDEX CONCURRENTLY ON {} ({key_quoted}) WHERE {key_quoted} IS NOT NULL AND ({state_quoted} IN ({}){forever})",
        table.quoted(),
        values.join(", ")
    )))
}

async fn check_enum_labels(
    pool: &PgPool,
    options: &PgStoreOptions,
    type_name: &str,
    type_oid: i64,
) -> Result<(), StoreError> {
    let labels: Vec<String> = sqlx::query_scalar(ENUM_LABELS)
        .bind(type_oid)
        .fetch_all(pool)
        .await
        .map_err(|e| store_error("reading the catalog", e))?;
    for state in JobState::ALL {
        let value = options.state_values().get(state);
        if !labels.iter().any(|l| l == value) {
            return Err(StoreError::Config(format!(
                "the state enum {type_name} has no value {value:?} (configured for {state}); its values are {}; map the state with `state_value(JobState::{state:?}, ..)`",
                labels.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    if let Some(expired) = &options.expired_value {
        if !labels.iter().any(|l| l == expired) {
            return Err(StoreError::Config(format!(
                "the state enum {type_name} has no value {expired:?} (configured for expired jobs); its values are {}",
                labels.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Ok(())
}
