//! The store's own sweeps, run through the admin: expiring jobs not
//! started in time, and resetting stalled ones.

use chrono::{DateTime, Utc};
use queue_core::resetter::{AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
use queue_core::{Delivery, ResetParams, ResetReport, StoreError, EXPIRED_MESSAGE};
use sqlx::Row;

use super::PgAdmin;
use crate::bind::{query, state, Value};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::{Param, Statement};
use crate::stash::OnLiveConnection;

/// How many bookkeeping rows of gone jobs one reset tick deletes at most.
const SWEEP_BATCH: i64 = 1000;

impl<K: PgKey> PgAdmin<K> {
    /// Fails up to `limit` waiting jobs that expired at `now`
    /// ([`Store::expire`](queue_core::Store::expire)); none without an
    /// expiry column.
    pub(crate) async fn expire(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<K>, StoreError> {
        let Some(statement) = &self.inner.sql.expire else {
            return Ok(Vec::new());
        };
        let context = "failing expired jobs";
        let mut tries = OnLiveConnection::new(&self.inner.pool, context);
        let rows = loop {
            let mut conn = tries.connection().await?;
            let expire = query::<K>(statement, |p| match p {
                Param::Now => Some(Value::Time(self.to_db(now))),
                Param::Limit => Some(Value::Int(i64::try_from(limit).unwrap_or(i64::MAX))),
                Param::Message => Some(Value::Text(EXPIRED_MESSAGE.to_owned())),
                Param::State(s) => Some(state::<K>(&self.inner.options.states, s)),
                _ => None,
            })?;
            let done = expire
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        rows.iter()
            .map(|row| {
                row.try_get(0)
                    .map_err(|e| store_error("failing expired jobs", e))
            })
            .collect()
    }

    pub(super) fn reset_statement(&self) -> Result<&Statement, StoreError> {
        self.inner.sql.reset.as_ref().ok_or_else(|| {
            StoreError::Config(format!(
                "table {} has neither last_heartbeat_at nor started_at, so stalled jobs cannot be recognised",
                self.inner.options.table
            ))
        })
    }

    /// Deletes the bookkeeping rows whose job is gone or completed, a
    /// batch at a time (the rows of jobs deleted or finished outside the
    /// store); nothing without a bookkeeping table.
    async fn sweep_bookkeeping(&self) -> Result<(), StoreError> {
        let Some(statement) = &self.inner.sql.sweep_bookkeeping else {
            return Ok(());
        };
        let states = &self.inner.options.states;
        let sweep = query::<K>(statement, |p| match p {
            Param::State(s) => Some(state::<K>(states, s)),
            Param::Limit => Some(Value::Int(SWEEP_BATCH)),
            _ => None,
        })?;
        sweep
            .execute(&self.inner.pool)
            .await
            .map_err(|e| store_error("deleting the bookkeeping rows of jobs that are gone", e))?;
        Ok(())
    }

    pub(super) async fn reset_stalled(
        &self,
        params: ResetParams,
    ) -> Result<ResetReport<K>, StoreError> {
        let statement = self.reset_statement()?;
        let states = &self.inner.options.states;
        // Stalls are judged on the database's clock, which heartbeats are
        // written on: a resetter whose clock runs ahead resets no healthy
        // job early.
        self.inner.offset.refresh(&self.inner.pool).await?;
        let context = "resetting stalled jobs";
        let mut tries = OnLiveConnection::new(&self.inner.pool, context);
        let rows = loop {
            let mut conn = tries.connection().await?;
            let reset = query(statement, |p| match p {
                Param::State(s) => Some(state::<K>(states, s)),
                Param::StalledBefore => Some(Value::Time(self.to_db(params.stalled_before))),
                Param::MaxResets => Some(Value::Int4(
                    i32::try_from(params.max_resets).unwrap_or(i32::MAX),
                )),
                Param::AtMostOnce => Some(Value::Bool(params.delivery == Delivery::AtMostOnce)),
                Param::MaxResetsMessage => Some(Value::Text(MAX_RESETS_MESSAGE.to_owned())),
                Param::AtMostOnceMessage => Some(Value::Text(AT_MOST_ONCE_MESSAGE.to_owned())),
                Param::Now => Some(Value::Time(self.to_db(params.now))),
                _ => None,
            })?;
            let done = reset
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        self.sweep_bookkeeping().await?;
        let mut report = ResetReport::default();
        for row in &rows {
            let id: K = row
                .try_get("id")
                .map_err(|e| store_error("resetting stalled jobs", e))?;
            let failed: bool = row
                .try_get("failed")
                .map_err(|e| store_error("resetting stalled jobs", e))?;
            if failed {
                report.failed.push(id);
            } else {
                report.reset.push(id);
            }
        }
        Ok(report)
    }
}
