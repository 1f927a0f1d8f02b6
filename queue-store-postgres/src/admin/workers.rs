//! The worker registry, in the workers table beside the job table
//! ([`crate::sql::workers`]).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use queue_core::{StoreError, WorkerBeat, WorkerInfo};
use sqlx::Row;

use super::{beside_error, missing_table, PgAdmin};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::workers;

/// What the workers table holds, as its missing-table error says.
const WHAT: &str = "the live workers";

/// How long a beat goes on the last finding that the workers table is
/// missing before it tries again (so that a missing table costs the
/// server's log one error a minute, not one a beat).
const RECHECK_MISSING: Duration = Duration::from_secs(60);

impl<K: PgKey> PgAdmin<K> {
    /// Why a beat cannot be recorded, if a beat found the workers table
    /// missing within the last minute: the beat then sends nothing.
    pub(crate) fn workers_table_missing(&self) -> Option<StoreError> {
        let table = workers::workers_table(&self.inner.options.table);
        self.inner
            .workers_missing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < RECHECK_MISSING)
            .then(|| missing_table(&table, WHAT))
    }

    /// The error of a registry statement; one that found the workers table
    /// missing is remembered ([`PgAdmin::workers_table_missing`]).
    fn registry_error(
        &self,
        table: &crate::QualifiedName,
        context: &str,
        e: sqlx::Error,
    ) -> StoreError {
        let error = beside_error(table, WHAT, context, e);
        if matches!(error, StoreError::Refused(_)) {
            *self
                .inner
                .workers_missing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        }
        error
    }

    /// Records `beat` on `conn` (the store's: a connection that died is
    /// closed quietly and the beat sent again on another).
    pub(crate) async fn record_beat_on(
        &self,
        conn: &mut sqlx::PgConnection,
        beat: &WorkerBeat,
    ) -> Result<(), StoreError> {
        let table = workers::workers_table(&self.inner.options.table);
        sqlx::query(sqlx::AssertSqlSafe(workers::beat(&table)))
            .bind(&beat.name)
            .bind(&beat.host)
            .bind(i64::from(beat.pid))
            .bind(&beat.kinds)
            .bind(i64::from(beat.handlers))
            .bind(i64::from(beat.in_flight))
            .bind(beat.started_at)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.registry_error(&table, "recording a worker's beat", e))?;
        Ok(())
    }

    /// Removes worker `name` on `conn` (the store's, as for a beat).
    pub(crate) async fn remove_worker_on(
        &self,
        conn: &mut sqlx::PgConnection,
        name: &str,
    ) -> Result<(), StoreError> {
        let table = workers::workers_table(&self.inner.options.table);
        sqlx::query(sqlx::AssertSqlSafe(workers::leave(&table)))
            .bind(name)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.registry_error(&table, "removing a worker from the registry", e))?;
        Ok(())
    }

    pub(super) async fn live_workers(
        &self,
        seen_since: DateTime<Utc>,
    ) -> Result<Vec<WorkerInfo>, StoreError> {
        let table = workers::workers_table(&self.inner.options.table);
        let mut conn = self.connection("reading the workers").await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(workers::read(&table)))
            .bind(seen_since)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, WHAT, "reading the workers", e))?;
        rows.iter()
            .map(|row| {
                let get = |e| store_error("reading the workers", e);
                let count = |name: &str| -> Result<u32, StoreError> {
                    let n: i64 = row.try_get(name).map_err(get)?;
                    Ok(u32::try_from(n).unwrap_or(u32::MAX))
                };
                let beat = WorkerBeat::new(
                    row.try_get::<String, _>("name").map_err(get)?,
                    row.try_get::<String, _>("host").map_err(get)?,
                    count("pid")?,
                )
                .kinds(row.try_get("kinds").map_err(get)?)
                .load(count("handlers")?, count("in_flight")?)
                .started_at(row.try_get("started_at").map_err(get)?);
                Ok(WorkerInfo::new(
                    beat,
                    row.try_get("last_seen_at").map_err(get)?,
                ))
            })
            .collect()
    }
}
