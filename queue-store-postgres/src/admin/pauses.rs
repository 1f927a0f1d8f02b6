//! Pausing and resuming kinds, in the kinds table beside the job table
//! ([`crate::kinds`]).

use queue_core::{PausedKind, StoreError};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::{beside_error, PgAdmin};
use crate::error::store_error;
use crate::options::Column;
use crate::record::PgKey;
use crate::sql::kinds;

impl<K: PgKey> PgAdmin<K> {
    /// The kinds table, or why a pause cannot be kept: the table keeps no
    /// kind.
    pub(super) fn kinds_table(&self) -> Result<crate::QualifiedName, StoreError> {
        if !self.has(Column::Kind) {
            return Err(StoreError::Refused(format!(
                "table {} has no kind column, so it has no kinds to pause",
                self.inner.options.table
            )));
        }
        Ok(kinds::kinds_table(&self.inner.options.table))
    }

    pub(super) async fn pause_kind(&self, kind: &str, by: &str) -> Result<PausedKind, StoreError> {
        queue_core::check_pause(kind, by)?;
        let table = self.kinds_table()?;
        let mut conn = self.connection("pausing a kind").await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(kinds::pause(&table)))
            .bind(kind)
            .bind(by)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, "pauses", &format!("pausing kind {kind:?}"), e))?;
        paused_kind(&row)
    }

    pub(super) async fn resume_kind(&self, kind: &str) -> Result<Option<PausedKind>, StoreError> {
        queue_core::check_kind(kind)?;
        let table = self.kinds_table()?;
        let mut conn = self.connection("resuming a kind").await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(kinds::resume(&table)))
            .bind(kind)
            .bind(self.inner.options.notify_channel())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, "pauses", &format!("resuming kind {kind:?}"), e))?;
        row.as_ref().map(paused_kind).transpose()
    }

    /// The paused kinds, read on `conn` (inside a read, so the kinds table
    /// is looked for first); none where the table keeps no kind or the
    /// kinds table does not exist.
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
}

fn paused_kind(row: &PgRow) -> Result<PausedKind, StoreError> {
    let get = |e| store_error("reading a paused kind", e);
    Ok(PausedKind::new(
        row.try_get::<String, _>("kind").map_err(get)?,
        row.try_get("paused_at").map_err(get)?,
        row.try_get::<String, _>("paused_by").map_err(get)?,
    ))
}
