//! Limits per kind, in the kinds table beside the job table
//! ([`crate::kinds`]); claims enforce them ([`crate::PgStore`]).

use queue_core::{KindLimit, KindLimits, StoreError};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{beside_error, PgAdmin};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::kinds;

impl<K: PgKey> PgAdmin<K> {
    pub(super) async fn set_kind_limits(
        &self,
        kind: &str,
        limits: &KindLimits,
        by: &str,
    ) -> Result<Option<KindLimit>, StoreError> {
        limits.check_for(kind, by)?;
        let table = self.kinds_table()?;
        let context = format!("setting the limits of kind {kind:?}");
        let mut conn = self.connection(&context).await?;
        let max = limits
            .max_running
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let burst = limits.burst.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let row = sqlx::query(sqlx::AssertSqlSafe(kinds::set_limits(&table)))
            .bind(kind)
            .bind(max)
            .bind(limits.per_second)
            .bind(burst)
            .bind(by)
            .bind(self.inner.options.notify_channel())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| limits_error(&table, &context, e))?;
        let limit = kind_limit(&row, &context)?;
        Ok(limit.filter(|l| l.limits.any()))
    }

    /// The kinds' limits; none where the table keeps no kind, or its kinds
    /// table does not exist or predates limits (as no pause is read there).
    pub(super) async fn read_limits(&self) -> Result<Vec<KindLimit>, StoreError> {
        let Ok(table) = self.kinds_table() else {
            return Ok(Vec::new());
        };
        let context = "reading the kinds' limits";
        let mut conn = self.connection(context).await?;
        let rows = match sqlx::query(sqlx::AssertSqlSafe(kinds::limits(&table)))
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some(super::UNDEFINED_TABLE | "42703")) =>
            {
                return Ok(Vec::new())
            }
            Err(e) => return Err(limits_error(&table, context, e)),
        };
        let mut limits = Vec::with_capacity(rows.len());
        for row in &rows {
            limits.extend(kind_limit(row, context)?);
        }
        Ok(limits)
    }
}

/// A kind's limits from its row; `None` if it has none.
fn kind_limit(row: &PgRow, context: &str) -> Result<Option<KindLimit>, StoreError> {
    let get = |e| store_error(context, e);
    let kind: String = row.try_get("kind").map_err(get)?;
    let max_running: Option<i32> = row.try_get("max_running").map_err(get)?;
    let per_second: Option<f64> = row.try_get("per_second").map_err(get)?;
    let burst: Option<i32> = row.try_get("burst").map_err(get)?;
    let (Some(at), Some(by)) = (
        row.try_get("limits_set_at").map_err(get)?,
        row.try_get::<Option<String>, _>("limits_set_by")
            .map_err(get)?,
    ) else {
        return Ok(None);
    };
    let limits = kind_limits(max_running, per_second, burst);
    Ok(Some(KindLimit::new(kind, limits, at, by)))
}

/// A kind's limits from its row's columns (`max_running`, `per_second`,
/// `burst`): the one reading, for claims and for the admin contract.
pub(crate) fn kind_limits(
    max_running: Option<i32>,
    per_second: Option<f64>,
    burst: Option<i32>,
) -> KindLimits {
    let mut limits = KindLimits::default();
    if let Some(max) = max_running {
        limits = limits.max_running(u32::try_from(max).unwrap_or(1));
    }
    if let Some(rate) = per_second {
        limits = limits.per_second(rate, burst.and_then(|b| u32::try_from(b).ok()));
    }
    limits
}

/// A limits statement's error: the kinds table missing, or at a version
/// before limits, says to run `queue migrate`.
fn limits_error(table: &crate::QualifiedName, context: &str, error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("42703") => {
            StoreError::Refused(format!(
                "the kinds table {table} predates limits per kind: run `queue migrate` \
                 (or queue_store_postgres::migrate_beside) to upgrade it"
            ))
        }
        _ => beside_error(table, "pauses and limits", context, error),
    }
}
