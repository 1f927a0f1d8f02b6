//! Pausing and resuming kinds, in the kinds table beside the job table
//! ([`crate::kinds`]).

use queue_core::{PausedKind, StoreError};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::PgAdmin;
use crate::error::store_error;
use crate::options::Column;
use crate::record::PgKey;
use crate::sql::{default_table, kinds};

impl<K: PgKey> PgAdmin<K> {
    /// The kinds table, or why a pause cannot be kept: the table keeps no
    /// kind, or the kinds table was never created.
    async fn kinds_table(
        &self,
        conn: &mut PgConnection,
    ) -> Result<crate::QualifiedName, StoreError> {
        if !self.has(Column::Kind) {
            return Err(StoreError::Refused(format!(
                "table {} has no kind column, so it has no kinds to pause",
                self.inner.options.table
            )));
        }
        let table = kinds::kinds_table(&self.inner.options.table);
        if !self.exists(conn, &table).await? {
            return Err(StoreError::Refused(format!(
                "the kinds table {table}, where pauses are kept, does not exist: run `queue migrate` \
                 (or queue_store_postgres::kinds::migrate) to create it"
            )));
        }
        Ok(table)
    }

    /// Whether `table` (a table the store keeps beside the job table)
    /// exists.
    pub(super) async fn exists(
        &self,
        conn: &mut PgConnection,
        table: &crate::QualifiedName,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(default_table::RELATION_EXISTS)
            .bind(table.quoted())
            .fetch_one(conn)
            .await
            .map_err(|e| store_error(&format!("looking for {table}"), e))
    }

    pub(super) async fn pause_kind(&self, kind: &str, by: &str) -> Result<PausedKind, StoreError> {
        queue_core::check_pause(kind, by)?;
        let mut conn = self.connection("pausing a kind").await?;
        let table = self.kinds_table(&mut conn).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(kinds::pause(&table)))
            .bind(kind)
            .bind(by)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_error(&format!("pausing kind {kind:?}"), e))?;
        paused_kind(&row)
    }

    pub(super) async fn resume_kind(&self, kind: &str) -> Result<Option<PausedKind>, StoreError> {
        queue_core::check_kind(kind)?;
        let mut conn = self.connection("resuming a kind").await?;
        let table = self.kinds_table(&mut conn).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(kinds::resume(&table)))
            .bind(kind)
            .bind(self.inner.options.notify_channel())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| store_error(&format!("resuming kind {kind:?}"), e))?;
        row.as_ref().map(paused_kind).transpose()
    }

    /// The paused kinds, read on `conn`; none where the table keeps no kind
    /// or the kinds table does not exist.
    pub(super) async fn read_pauses(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Vec<PausedKind>, StoreError> {
        if !self.has(Column::Kind) {
            return Ok(Vec::new());
        }
        let table = kinds::kinds_table(&self.inner.options.table);
        if !self.exists(conn, &table).await? {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(sqlx::AssertSqlSafe(kinds::pauses(&table)))
            .fetch_all(conn)
            .await
            .map_err(|e| store_error("reading the paused kinds", e))?;
        rows.iter().map(paused_kind).collect()
    }

    pub(super) async fn fetch_pauses(&self) -> Result<Vec<PausedKind>, StoreError> {
        let mut conn = self.connection("reading the paused kinds").await?;
        self.read_pauses(&mut conn).await
    }

    pub(super) async fn connection(
        &self,
        context: &str,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        self.inner
            .pool
            .acquire()
            .await
            .map_err(|e| store_error(context, e))
    }
}

fn paused_kind(row: &PgRow) -> Result<PausedKind, StoreError> {
    let get = |e| store_error("reading a paused kind", e);
    Ok(PausedKind::new(
        row.try_get::<String, _>("kind").map_err(get)?,
        row.try_get("paused_at").map_err(get)?,
        row.try_get::<String, _>("paused_by").map_err(get)?,
    ))
}
