//! [`WorkerOptions`]: how a [`Worker`](super::Worker) runs, and the
//! default worker name.

use std::sync::Arc;
use std::time::Duration;

use queue_core::{Clock, OutcomePolicy, SystemClock};

use crate::error::WorkerError;

/// The failure of an at-most-once job a shutting-down worker stopped: it
/// had started, so it is not handed back to run again.
pub const AT_MOST_ONCE_SHUTDOWN_MESSAGE: &str =
    "stopped by its worker's shutdown; an at-most-once job that has started is not run again";

/// How a [`Worker`] runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The worker's identity, recorded on claimed jobs. Default: host name
    /// and process id.
    pub name: String,
    /// How many jobs run at once. Default 4. A job whose outcome commits
    /// the handler's transaction (see [`Store::finish_ends_transaction`])
    /// runs until that commit, so this also bounds the job transactions
    /// open at once.
    pub num_handlers: usize,
    /// How long to wait between claims when no job is available: the
    /// backstop poll. A store notification (Postgres LISTEN/NOTIFY, the
    /// memory store's enqueue) ends the wait early, so this only bounds how
    /// late a dropped notification or a scheduled job is noticed. A store
    /// may wait less while it cannot hear notifications (the Postgres store
    /// waits at most half a second while its LISTEN connection is down).
    /// Default 5 s.
    pub poll_interval: Duration,
    /// The most jobs one claim takes. `None` (the default): `num_handlers +
    /// prefetch`, whatever those are set to. A claim asks for one of a few
    /// sizes (1 to 7, then 8, 10, 12, 14, 16, 20, 24, ...), the largest not
    /// above its free slots, so that a store can keep one prepared
    /// statement per size.
    pub claim_batch: Option<usize>,
    /// How many claims may be on their way at once. With 2 (the default)
    /// the next claim goes out while the previous one's round trip and
    /// commit are still under way, so handlers do not sit idle waiting for
    /// it. PreDequeue then may run while a claim is in flight
    /// ([`queue_core::DequeueContext::claims_in_flight`] says so). 1 claims strictly one
    /// batch at a time.
    pub concurrent_claims: usize,
    /// Jobs claimed beyond the free handler slots and held until a slot
    /// frees, so that claims come in larger batches (graphile-worker's
    /// local queue). They count as running: they are heartbeated, and at
    /// shutdown the ones not started are handed back at once. A store may
    /// tie resources to a claimed job (a transaction opened at claim time);
    /// the Postgres store opens a job's transaction only when its handler
    /// asks, so prefetched jobs hold no connection. Default 0.
    pub prefetch: usize,
    /// How many jobs whose handler is done may wait at once for their
    /// outcome to be written. A store that writes outcomes in batches (the
    /// Postgres store in lease mode) answers a finish only once its batch
    /// is written; a job's claim slot frees when its handler is done, so
    /// without a bound, claims outran the writes and finished jobs heaped
    /// up (145,000 in a drain of a million jobs at 64 handlers, each held
    /// in memory, and each in every heartbeat until its write). At this
    /// many, the next job to finish keeps its claim slot until one of them
    /// is written, so claims slow to the pace of the writes. A job whose
    /// outcome commits the handler's transaction holds its handler slot
    /// until then anyway. Default 2,048 (two of the Postgres store's
    /// batches of 1,000, so that one is always ready while the other is
    /// written).
    pub max_outcomes_in_flight: usize,
    /// How often running jobs are heartbeated (and cancellations noticed).
    /// Default 5 s; keep it well below the resetter's stalled max age.
    pub heartbeat_interval: Duration,
    /// How long one attempt may run before it is abandoned as timed out
    /// (retryable). Default 5 min; `None` for no limit.
    pub job_timeout: Option<Duration>,
    /// How long a handler asked to stop (cancelled, deleted, shutdown) may
    /// keep running before it is abandoned. Default 5 s.
    pub cancel_grace: Duration,
    /// At shutdown, how long in-flight jobs may run before they are asked to
    /// stop and handed back. Default 30 s.
    pub shutdown_timeout: Duration,
    /// Retries, backoff, and the treatment of unclassified errors and panics.
    pub outcome_policy: OutcomePolicy,
    /// The clock for `now` values given to the store.
    pub clock: Arc<dyn Clock>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            name: default_worker_name(),
            num_handlers: 4,
            poll_interval: Duration::from_secs(5),
            claim_batch: None,
            concurrent_claims: 2,
            prefetch: 0,
            max_outcomes_in_flight: 2048,
            heartbeat_interval: Duration::from_secs(5),
            job_timeout: Some(Duration::from_secs(300)),
            cancel_grace: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(30),
            outcome_policy: OutcomePolicy::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

impl WorkerOptions {
    /// Sets `num_handlers`.
    pub fn handlers(mut self, n: usize) -> Self {
        self.num_handlers = n;
        self
    }

    /// Sets `prefetch`.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// The most jobs one claim takes: `claim_batch`, or by default
    /// `num_handlers + prefetch`, however the options were built.
    ///
    /// ```
    /// use queue_worker::WorkerOptions;
    /// let literal = WorkerOptions { num_handlers: 32, ..Default::default() };
    /// assert_eq!(literal.claim_batch_size(), 32);
    /// let built = WorkerOptions::default().prefetch(8).handlers(16);
    /// assert_eq!(built.claim_batch_size(), 24);
    /// let fixed = WorkerOptions { claim_batch: Some(10), ..built };
    /// assert_eq!(fixed.claim_batch_size(), 10);
    /// ```
    pub fn claim_batch_size(&self) -> usize {
        self.claim_batch
            .unwrap_or(self.num_handlers + self.prefetch)
    }

    pub(super) fn validate(&self) -> Result<(), WorkerError> {
        let fail = |m: &str| Err(WorkerError::InvalidOptions(m.to_owned()));
        if self.name.is_empty() {
            return fail("name must not be empty");
        }
        if self.num_handlers == 0 {
            return fail("num_handlers must be at least 1");
        }
        if self.claim_batch == Some(0) {
            return fail("claim_batch must be at least 1");
        }
        if self.max_outcomes_in_flight == 0 {
            return fail("max_outcomes_in_flight must be at least 1");
        }
        if self.concurrent_claims == 0 {
            return fail("concurrent_claims must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return fail("poll_interval must be longer than zero");
        }
        if self.heartbeat_interval.is_zero() {
            return fail("heartbeat_interval must be longer than zero");
        }
        if self.job_timeout.is_some_and(|t| t.is_zero()) {
            return fail("job_timeout must be longer than zero (or None for no limit)");
        }
        Ok(())
    }
}

/// `host-pid`, from the system's host name (or `$HOSTNAME`).
pub fn default_worker_name() -> String {
    format!("{}-{}", host_name(), std::process::id())
}

/// The system's host name (or `$HOSTNAME`, or `localhost`).
pub(crate) fn host_name() -> String {
    Some(
        gethostname::gethostname()
            .to_string_lossy()
            .trim()
            .to_owned(),
    )
    .filter(|h| !h.is_empty())
    .or_else(|| std::env::var("HOSTNAME").ok())
    .unwrap_or_else(|| "localhost".to_owned())
}
