//! The bookkeeping table a store keeps beside a table that lacks columns
//! of a job's bookkeeping ([`PgStoreOptions::bookkeeping_table`]): creating
//! and upgrading it, versioned like the default table.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use queue_store_postgres::{bookkeeping, PgStoreOptions};
//!
//! let options = PgStoreOptions::new("jobs")?
//!     .column(queue_store_postgres::Column::State, "status")?
//!     .bookkeeping_table("jobs_bookkeeping")?;
//! for applied in bookkeeping::migrate(&pool, &options).await? {
//!     println!("applied version {}: {}", applied.version, applied.name);
//! }
//! # Ok(()) }
//! ```

use queue_core::StoreError;
use sqlx::PgPool;

use crate::migrate::Migration;
use crate::options::PgStoreOptions;
use crate::sql::{bookkeeping, catalog};

/// The bookkeeping table `options` name, or the error that says they name
/// none.
fn named(options: &PgStoreOptions) -> Result<&crate::QualifiedName, StoreError> {
    options.bookkeeping().ok_or_else(|| {
        StoreError::Config(format!(
            "the options for {} name no bookkeeping table (PgStoreOptions::bookkeeping_table; in a config file, bookkeeping_table)",
            options.table
        ))
    })
}

/// Creates or upgrades the bookkeeping table `options` name, its key of
/// the table's key type (the table must exist); returns the versions
/// applied now. A table already at the newest version is only read.
pub async fn migrate(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let side = named(options)?;
    let key_type = catalog::key_type(pool, options).await?;
    crate::migrate::apply(
        pool,
        side,
        bookkeeping::migrations(side, &key_type),
        crate::migrate::LockWait::default(),
    )
    .await
}

/// Every version of the bookkeeping table's schema, applied or pending.
pub async fn migrations(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let side = named(options)?;
    let key_type = catalog::key_type(pool, options).await?;
    crate::migrate::status(pool, side, bookkeeping::migrations(side, &key_type)).await
}
