//! The kinds table the store keeps beside a job table (`<table>_kinds`):
//! which kinds are paused, for every process that claims from the table
//! ([`Admin::pause`](queue_core::Admin::pause)). Creating and upgrading
//! it, versioned like the default table; and the paused kinds as claims
//! read them.
//!
//! [`JobTable::migrate`](crate::JobTable::migrate) creates it with the
//! default table. For a table of your own, [`migrate`] creates it (the
//! `queue migrate` command does, with your config file); until it exists,
//! pausing is refused, naming it, and claims read no pauses.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use queue_store_postgres::{kinds, PgStoreOptions};
//!
//! let options = PgStoreOptions::new("jobs")?;
//! for applied in kinds::migrate(&pool, &options).await? {
//!     println!("{}: applied version {}", applied.table, applied.version);
//! }
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use queue_core::StoreError;
use sqlx::{PgConnection, PgPool, Row};

use crate::error::store_error;
use crate::migrate::Migration;
use crate::options::{Column, PgStoreOptions};
use crate::sql::{default_table, kinds};
use crate::QualifiedName;

/// SQLSTATE undefined_column: a kinds table before the version with
/// limits.
const UNDEFINED_COLUMN: &str = "42703";

/// How long claims go on the paused and limited kinds they read last: a
/// pause or a limit holds for every worker within this time (the promise
/// is a second).
pub(crate) const PAUSES_REFRESH: Duration = Duration::from_millis(500);

/// Creates or upgrades the kinds table beside the table `options` describe;
/// returns the versions applied now. A table already at the newest version
/// is only read. Refused ([`StoreError::Config`]) for a table without the
/// kind column the options map: it has no kinds to pause.
pub async fn migrate(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let kinds = named(pool, options).await?;
    crate::migrate::apply(
        pool,
        &kinds,
        kinds::migrations(&kinds),
        crate::migrate::LockWait::default(),
    )
    .await
}

/// Every version of the kinds table's schema, applied or pending.
pub async fn migrations(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let kinds = named(pool, options).await?;
    crate::migrate::status(pool, &kinds, kinds::migrations(&kinds)).await
}

/// Whether the table `options` describe has the kind column they map, so
/// that a kinds table belongs beside it.
pub async fn has_kinds(pool: &PgPool, options: &PgStoreOptions) -> Result<bool, StoreError> {
    let Some(column) = options.column_name(Column::Kind) else {
        return Ok(false);
    };
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
         AND attname = $2 AND attnum > 0 AND NOT attisdropped)",
    )
    .bind(options.table.quoted())
    .bind(column.as_str())
    .fetch_one(pool)
    .await
    .map_err(|e| {
        store_error(
            &format!("looking for the kind column of {}", options.table),
            e,
        )
    })
}

/// The kinds table of the table `options` describe, or why it has none.
async fn named(pool: &PgPool, options: &PgStoreOptions) -> Result<QualifiedName, StoreError> {
    if !has_kinds(pool, options).await? {
        return Err(StoreError::Config(format!(
            "table {} has no kind column{}, so it has no kinds to pause and no kinds table to create",
            options.table,
            options
                .column_name(Column::Kind)
                .map(|c| format!(" {}", c.quoted()))
                .unwrap_or_default()
        )));
    }
    Ok(kinds::kinds_table(&options.table))
}

/// What claims heed, per kind: which kinds are paused, and which have
/// limits (claimed apart, each under its row's lock).
#[derive(Debug, Default)]
pub(crate) struct KindRules {
    pub(crate) paused: Vec<String>,
    pub(crate) limited: Vec<String>,
    /// The kinds the claim of everything else passes over: paused or
    /// limited (derived once per reading, not per claim).
    pub(crate) set_apart: Vec<String>,
}

/// The pauses and limits as claims see them: read from the kinds table at
/// most every [`PAUSES_REFRESH`], on the claim's own connection.
pub(crate) struct ClaimRules {
    table: QualifiedName,
    /// Pauses and limits.
    read: String,
    /// Pauses alone, for a kinds table not yet at the version with limits.
    read_paused: String,
    last: Mutex<Option<Reading>>,
}

/// One reading of the kinds table.
#[derive(Clone)]
struct Reading {
    at: Instant,
    /// Whether the kinds table existed: once it does, the next reading
    /// reads it without asking again.
    exists: bool,
    /// Whether it has the limits' columns, as last found; asked again a
    /// minute after it had not (`queue migrate` may add them meanwhile).
    limits: bool,
    limits_seen: Instant,
    rules: Arc<KindRules>,
}

impl ClaimRules {
    /// The rules of the kinds table beside `table`.
    pub(crate) fn new(table: &QualifiedName) -> Self {
        let kinds = kinds::kinds_table(table);
        ClaimRules {
            read: kinds::rules(&kinds),
            read_paused: kinds::paused_kinds(&kinds),
            table: kinds,
            last: Mutex::new(None),
        }
    }

    /// The rules in force now (as of at most [`PAUSES_REFRESH`] ago); none
    /// while the kinds table does not exist.
    pub(crate) async fn current(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Arc<KindRules>, StoreError> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(reading) = &last {
            if reading.at.elapsed() < PAUSES_REFRESH {
                return Ok(reading.rules.clone());
            }
        }
        let context = || format!("reading the paused and limited kinds from {}", self.table);
        let mut exists = last.as_ref().is_some_and(|r| r.exists);
        let mut limits = last
            .as_ref()
            .is_none_or(|r| r.limits || r.limits_seen.elapsed() > Duration::from_secs(60));
        let mut limits_seen = last.as_ref().map_or_else(Instant::now, |r| r.limits_seen);
        if !exists {
            exists = sqlx::query_scalar(default_table::RELATION_EXISTS)
                .bind(self.table.quoted())
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| store_error(&context(), e))?;
        }
        let mut rules = KindRules::default();
        if exists {
            let read = if limits {
                &self.read
            } else {
                &self.read_paused
            };
            match sqlx::query(sqlx::AssertSqlSafe(read.as_str()))
                .fetch_all(&mut *conn)
                .await
            {
                Ok(rows) => {
                    for row in rows {
                        let get = |e| store_error(&context(), e);
                        let kind: String = row.try_get("kind").map_err(get)?;
                        let (paused, limited) = if limits {
                            (
                                row.try_get("paused").map_err(get)?,
                                row.try_get("limited").map_err(get)?,
                            )
                        } else {
                            (true, false)
                        };
                        if paused {
                            rules.paused.push(kind.clone());
                        }
                        if limited {
                            rules.limited.push(kind);
                        }
                    }
                }
                // Dropped since it was seen: no rules, and ask again next
                // time.
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(crate::admin::UNDEFINED_TABLE) =>
                {
                    exists = false;
                }
                // Not yet at the version with limits (queue migrate adds
                // them): pauses alone.
                Err(sqlx::Error::Database(e))
                    if limits && e.code().as_deref() == Some(UNDEFINED_COLUMN) =>
                {
                    limits = false;
                    limits_seen = Instant::now();
                    let paused: Vec<String> =
                        sqlx::query_scalar(sqlx::AssertSqlSafe(self.read_paused.as_str()))
                            .fetch_all(&mut *conn)
                            .await
                            .map_err(|e| store_error(&context(), e))?;
                    rules.paused = paused;
                }
                Err(e) => return Err(store_error(&context(), e)),
            }
        }
        rules.set_apart = rules.paused.clone();
        rules.set_apart.extend(
            rules
                .limited
                .iter()
                .filter(|k| !rules.paused.contains(k))
                .cloned(),
        );
        let reading = Reading {
            at: Instant::now(),
            exists,
            limits,
            limits_seen,
            rules: Arc::new(rules),
        };
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(reading.clone());
        Ok(reading.rules)
    }

    /// Forgets the last reading: the next claim reads the table again (a
    /// pause or resume by this process holds for its own claims at once).
    pub(crate) fn forget(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}
