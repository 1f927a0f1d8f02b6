//! The audit log, in the audit table beside the job table
//! ([`crate::sql::audit`]).

use queue_core::{AuditEntry, AuditParams, NewAuditEntry, StoreError};
use sqlx::Row;

use super::{beside_error, PgAdmin};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::audit;

impl<K: PgKey> PgAdmin<K> {
    pub(super) async fn append_entries(&self, entries: &[NewAuditEntry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let table = audit::audit_table(&self.inner.options.table);
        let text = |f: fn(&NewAuditEntry) -> &str| entries.iter().map(f).collect::<Vec<_>>();
        let targets: Vec<serde_json::Value> = entries.iter().map(|e| e.target.clone()).collect();
        let oks: Vec<bool> = entries.iter().map(|e| e.ok).collect();
        let mut conn = self.connection("appending to the audit log").await?;
        sqlx::query(sqlx::AssertSqlSafe(audit::append(&table)))
            .bind(text(|e| &e.actor))
            .bind(text(|e| &e.action))
            .bind(targets)
            .bind(text(|e| &e.outcome))
            .bind(oks)
            .execute(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, "audit entries", "appending to the audit log", e))?;
        Ok(())
    }

    pub(super) async fn read_audit(
        &self,
        params: &AuditParams,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let table = audit::audit_table(&self.inner.options.table);
        let mut conn = self.connection("reading the audit log").await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(audit::read(&table)))
            .bind(params.before)
            .bind(params.actor.as_deref())
            .bind(i64::try_from(params.limit.min(queue_core::MAX_AUDIT_PAGE)).unwrap_or(0))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, "audit entries", "reading the audit log", e))?;
        rows.iter()
            .map(|row| {
                let get = |e| store_error("reading the audit log", e);
                Ok(AuditEntry::new(
                    row.try_get("id").map_err(get)?,
                    row.try_get("at").map_err(get)?,
                    NewAuditEntry::new(
                        row.try_get::<String, _>("actor").map_err(get)?,
                        row.try_get::<String, _>("action").map_err(get)?,
                        row.try_get("target").map_err(get)?,
                        row.try_get("ok").map_err(get)?,
                        row.try_get::<String, _>("outcome").map_err(get)?,
                    ),
                ))
            })
            .collect()
    }
}
