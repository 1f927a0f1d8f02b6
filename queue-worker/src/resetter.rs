//! [`Resetter`]: runs the store's reset of stalled jobs on an interval.

use std::sync::Arc;
use std::time::Duration;

use queue_core::{
    CancellationToken, Clock, Delivery, ResetParams, ResetReport, Store, StoreError, SystemClock,
};

use crate::error::WorkerError;
use crate::metrics;

/// Expired jobs ended per statement.
pub const EXPIRE_BATCH: usize = 1000;

/// How a [`Resetter`] runs.
#[derive(Debug, Clone)]
pub struct ResetterOptions {
    /// How often to look for stalled jobs. Default 30 s.
    pub interval: Duration,
    /// A processing job whose last heartbeat is older than this is stalled.
    /// Default 60 s; keep it several heartbeat intervals long.
    pub stalled_max_age: Duration,
    /// Resets a job may have before it fails instead. Default 3.
    pub max_resets: u32,
    /// Whether stalled jobs run again (at least once) or fail (at most once).
    pub delivery: Delivery,
    /// The clock a heartbeat's age is judged by.
    pub clock: Arc<dyn Clock>,
}

impl Default for ResetterOptions {
    fn default() -> Self {
        ResetterOptions {
            interval: Duration::from_secs(30),
            stalled_max_age: Duration::from_secs(60),
            max_resets: 3,
            delivery: Delivery::AtLeastOnce,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Periodically moves stalled jobs back to the queue (or fails them); see
/// the contract in [`queue_core::resetter`]. Several resetters may run at
/// once, in the same process as the workers or elsewhere.
pub struct Resetter<S: Store> {
    store: Arc<S>,
    options: ResetterOptions,
}

impl<S: Store> Resetter<S> {
    /// A resetter over `store`; fails if an option is out of range.
    pub fn new(store: impl Into<Arc<S>>, options: ResetterOptions) -> Result<Self, WorkerError> {
        if options.interval.is_zero() {
            return Err(WorkerError::InvalidOptions(
                "resetter interval must be longer than zero".into(),
            ));
        }
        if options.stalled_max_age.is_zero() {
            return Err(WorkerError::InvalidOptions(
                "stalled_max_age must be longer than zero (and longer than the heartbeat interval)"
                    .into(),
            ));
        }
        let store = store.into();
        if options.delivery == Delivery::AtLeastOnce && !store.counts_resets() {
            return Err(WorkerError::InvalidOptions(
                "the store counts no resets (the table has no num_resets column), so max_resets \
                 cannot bound them and a job whose worker keeps dying would run forever: keep the \
                 count in the store's bookkeeping table (PgStoreOptions::bookkeeping_table), add \
                 and map a num_resets integer column, or reset at most once \
                 (ResetterOptions::delivery = Delivery::AtMostOnce)"
                    .into(),
            ));
        }
        Ok(Resetter { store, options })
    }

    /// One reset pass, and the sweep of expired jobs.
    pub async fn reset_once(&self) -> Result<ResetReport<S::Id>, StoreError> {
        let now = self.options.clock.now();
        let max_age = chrono::Duration::from_std(self.options.stalled_max_age)
            .unwrap_or(chrono::Duration::MAX);
        let stalled_before = now
            .checked_sub_signed(max_age)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let report = self
            .store
            .reset_stalled(ResetParams {
                stalled_before,
                max_resets: self.options.max_resets,
                delivery: self.options.delivery,
                now,
            })
            .await?;
        metrics::jobs_reset(report.reset.len(), report.failed.len());
        if !report.reset.is_empty() || !report.failed.is_empty() {
            tracing::info!(reset = ?report.reset, failed = ?report.failed, "stalled jobs handled");
        }
        self.expire_once(now).await?;
        Ok(report)
    }

    /// Ends the jobs that expired before they started, in batches of
    /// [`EXPIRE_BATCH`], at most ten per pass (the rest next pass).
    async fn expire_once(&self, now: chrono::DateTime<chrono::Utc>) -> Result<(), StoreError> {
        for _ in 0..10 {
            let expired = self.store.expire(now, EXPIRE_BATCH).await?;
            if !expired.is_empty() {
                tracing::info!(
                    count = expired.len(),
                    "expired jobs failed before they started"
                );
            }
            if expired.len() < EXPIRE_BATCH {
                break;
            }
        }
        Ok(())
    }

    /// Resets every `interval` until `shutdown` is cancelled. Transient
    /// errors are logged and retried next interval; a permanent one stops it.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let mut ticks = tokio::time::interval(self.options.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.cancelled() => return Ok(()),
            }
            match self.reset_once().await {
                Ok(_) => {}
                Err(error) if error.is_retryable() => {
                    tracing::warn!(error = %error.chain(), "reset failed; retrying next interval");
                }
                Err(error) => return Err(WorkerError::Store(error)),
            }
        }
    }
}
