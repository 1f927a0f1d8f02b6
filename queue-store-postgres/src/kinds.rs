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
use sqlx::{PgConnection, PgPool};

use crate::error::store_error;
use crate::migrate::Migration;
use crate::options::{Column, PgStoreOptions};
use crate::sql::{default_table, kinds};
use crate::QualifiedName;

/// How long claims go on the paused kinds they read last: a pause holds
/// for every worker within this time (the pause's promise is a second).
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
    crate::migrate::apply(pool, &kinds, kinds::migrations(&kinds)).await
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

/// The paused kinds as claims see them: read from the kinds table at most
/// every [`PAUSES_REFRESH`], on the claim's own connection.
pub(crate) struct PausedKinds {
    table: QualifiedName,
    read: String,
    last: Mutex<Option<Reading>>,
}

/// One reading of the kinds table.
#[derive(Clone)]
struct Reading {
    at: Instant,
    /// Whether the kinds table existed: once it does, the next reading
    /// reads it without asking again.
    exists: bool,
    paused: Arc<Vec<String>>,
}

impl PausedKinds {
    /// The pauses of the kinds table beside `table`.
    pub(crate) fn new(table: &QualifiedName) -> Self {
        let kinds = kinds::kinds_table(table);
        PausedKinds {
            read: kinds::paused_kinds(&kinds),
            table: kinds,
            last: Mutex::new(None),
        }
    }

    /// The kinds paused now (as of at most [`PAUSES_REFRESH`] ago); none
    /// while the kinds table does not exist.
    pub(crate) async fn current(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Arc<Vec<String>>, StoreError> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(reading) = &last {
            if reading.at.elapsed() < PAUSES_REFRESH {
                return Ok(reading.paused.clone());
            }
        }
        let context = || format!("reading the paused kinds from {}", self.table);
        let mut exists = last.as_ref().is_some_and(|r| r.exists);
        if !exists {
            exists = sqlx::query_scalar(default_table::RELATION_EXISTS)
                .bind(self.table.quoted())
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| store_error(&context(), e))?;
        }
        let paused = if exists {
            match sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(self.read.as_str()))
                .fetch_all(&mut *conn)
                .await
            {
                Ok(paused) => paused,
                // Dropped since it was seen: no pauses, and ask again next
                // time.
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(crate::admin::UNDEFINED_TABLE) =>
                {
                    exists = false;
                    Vec::new()
                }
                Err(e) => return Err(store_error(&context(), e)),
            }
        } else {
            Vec::new()
        };
        let reading = Reading {
            at: Instant::now(),
            exists,
            paused: Arc::new(paused),
        };
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(reading.clone());
        Ok(reading.paused)
    }

    /// Forgets the last reading: the next claim reads the table again (a
    /// pause or resume by this process holds for its own claims at once).
    pub(crate) fn forget(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}
