//! [`Pruner`]: removes finished jobs past their retention on an interval.

use std::sync::Arc;
use std::time::Duration;

use queue_core::{
    prune, Admin, CancellationToken, Clock, PruneReport, Retention, StoreError, SystemClock,
};

use crate::error::WorkerError;
use crate::metrics;

/// How a [`Pruner`] runs.
#[derive(Debug, Clone)]
pub struct PrunerOptions {
    /// How often to look for jobs past their retention. Default 60 s.
    pub interval: Duration,
    /// How long finished jobs are kept, per state, and the batch size.
    pub retention: Retention,
    /// The clock a finished job's age is judged by.
    pub clock: Arc<dyn Clock>,
}

impl Default for PrunerOptions {
    /// Every minute, with [`Retention::default`] (which keeps everything:
    /// set the ages to prune).
    fn default() -> Self {
        PrunerOptions {
            interval: Duration::from_secs(60),
            retention: Retention::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Periodically removes finished jobs older than their state's retention
/// ([`queue_core::retention`]): in batches, each counted in the metric
/// `queue_jobs_pruned_total{state}`. Several pruners may run at once, in the
/// same process as the workers or elsewhere; each batch takes only jobs
/// old enough, whoever removes them.
pub struct Pruner<A: Admin> {
    admin: Arc<A>,
    options: PrunerOptions,
}

impl<A: Admin> Pruner<A> {
    /// A pruner over `admin` (any store); fails if an option is out of
    /// range or no state has an age.
    pub fn new(admin: impl Into<Arc<A>>, options: PrunerOptions) -> Result<Self, WorkerError> {
        if options.interval.is_zero() {
            return Err(WorkerError::InvalidOptions(
                "pruner interval must be longer than zero".into(),
            ));
        }
        options
            .retention
            .validate()
            .map_err(|e| WorkerError::InvalidOptions(e.to_string()))?;
        let r = &options.retention;
        if r.completed.is_none() && r.failed.is_none() && r.canceled.is_none() {
            return Err(WorkerError::InvalidOptions(
                "the pruner's retention keeps every state forever: set an age for completed, \
                 failed or canceled jobs"
                    .into(),
            ));
        }
        Ok(Pruner {
            admin: admin.into(),
            options,
        })
    }

    /// One pass: every job past its retention removed.
    pub async fn prune_once(&self) -> Result<PruneReport, StoreError> {
        let now = self.options.clock.now();
        let report = prune(&*self.admin, &self.options.retention, now, |state, n| {
            metrics::jobs_pruned(state, n);
        })
        .await?;
        if report.total() > 0 {
            tracing::info!(removed = ?report.removed, batches = report.batches, "finished jobs past their retention removed");
        }
        Ok(report)
    }

    /// Prunes every `interval` until `shutdown` is cancelled. Transient
    /// errors are logged and retried next interval; a permanent one stops
    /// it. A pass under way when `shutdown` comes ends after its batch.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let mut ticks = tokio::time::interval(self.options.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.cancelled() => return Ok(()),
            }
            let pass = tokio::select! {
                pass = self.prune_once() => pass,
                _ = shutdown.cancelled() => return Ok(()),
            };
            match pass {
                Ok(_) => {}
                Err(error) if error.is_retryable() => {
                    tracing::warn!(error = %error.chain(), "pruning failed; retrying next interval");
                }
                Err(error) => return Err(WorkerError::Store(error)),
            }
        }
    }
}
