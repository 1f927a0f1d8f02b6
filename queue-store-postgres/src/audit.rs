//! The audit table the store keeps beside a job table (`<table>_audit`):
//! every write of an operator surface, one row each
//! ([`Admin::append_audit`](queue_core::Admin::append_audit)). Creating
//! and upgrading it, versioned like the default table.
//!
//! [`JobTable::migrate`](crate::JobTable::migrate) creates it with the
//! default table; for a table of your own, [`migrate`] (and `queue
//! migrate` with your config file). Until it exists, the surfaces warn
//! that their writes go unrecorded.

use queue_core::StoreError;
use sqlx::PgPool;

use crate::migrate::Migration;
use crate::options::PgStoreOptions;
use crate::sql::audit;

/// Creates or upgrades the audit table beside the table `options`
/// describe; returns the versions applied now. A table already at the
/// newest version is only read.
pub async fn migrate(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let table = audit::audit_table(&options.table);
    crate::migrate::apply(pool, &table, audit::migrations(&table)).await
}

/// Every version of the audit table's schema, applied or pending.
pub async fn migrations(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let table = audit::audit_table(&options.table);
    crate::migrate::status(pool, &table, audit::migrations(&table)).await
}
