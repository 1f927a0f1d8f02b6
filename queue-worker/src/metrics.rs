//! The metrics the runtime reports through the `metrics` facade.
//!
//! Install any `metrics` recorder (Prometheus exporter, StatsD, ...) to
//! collect them, before the worker starts: a worker registers the metrics
//! of a job's kind with the recorder installed when it runs the first job
//! of that kind, and keeps the handles. Without a recorder they cost next
//! to nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use queue_core::Outcome;

/// Counter of finished attempts, labelled `kind` and `outcome`
/// ([`Outcome::label`]: `completed`, `retried`, `failed`, `poisoned`,
/// `canceled`, `released`, `interrupted`, `lost`).
pub const JOBS_PROCESSED: &str = "queue_jobs_processed_total";
/// Histogram of handler durations in seconds, labelled `kind`.
pub const JOB_DURATION: &str = "queue_job_duration_seconds";
/// Gauge of jobs being handled now, labelled `kind`.
pub const JOBS_IN_FLIGHT: &str = "queue_jobs_in_flight";
/// Counter of stalled jobs the resetter handled, labelled `action`
/// (`reset` or `failed`).
pub const JOBS_RESET: &str = "queue_jobs_reset_total";
/// Counter of finished jobs the pruner removed, labelled `state`.
pub const JOBS_PRUNED: &str = "queue_jobs_pruned_total";

/// Serves every metric of this process (the worker's, the store's and the
/// application's own) in Prometheus' text format over HTTP at `addr`, such
/// as `0.0.0.0:9100`: one line in `main`, inside a Tokio runtime, before
/// the worker starts (feature `prometheus`).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), queue_worker::WorkerError> {
/// queue_worker::metrics::serve_prometheus(([0, 0, 0, 0], 9100).into())?;
/// # Ok(()) }
/// ```
#[cfg(feature = "prometheus")]
pub fn serve_prometheus(addr: std::net::SocketAddr) -> Result<(), crate::WorkerError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| crate::WorkerError::Metrics(format!("{addr}: {e}")))
}

/// The outcome labels a kind's counters are kept for, in one order.
const OUTCOMES: [&str; 8] = [
    "completed",
    "retried",
    "failed",
    "poisoned",
    "canceled",
    "released",
    "interrupted",
    "lost",
];

/// The most kinds a worker keeps handles for; the jobs of any more kinds
/// have their metrics looked up each time.
const MOST_KINDS: usize = 1_000;

/// The metric handles of one job kind, registered once. Each job used to
/// build four keys (a copy of its kind and a list of labels each) and have
/// the recorder find them, which allocated on every job whether or not a
/// recorder was installed.
pub(crate) struct KindMetrics {
    kind: String,
    in_flight: Gauge,
    duration: Histogram,
    /// One per label of [`OUTCOMES`], registered with its first outcome, so
    /// that a kind's counters are those of the outcomes it had.
    processed: [OnceLock<Counter>; OUTCOMES.len()],
}

impl KindMetrics {
    fn new(kind: &str) -> Self {
        KindMetrics {
            kind: kind.to_owned(),
            in_flight: metrics::gauge!(JOBS_IN_FLIGHT, "kind" => kind.to_owned()),
            duration: metrics::histogram!(JOB_DURATION, "kind" => kind.to_owned()),
            processed: Default::default(),
        }
    }

    /// A job of the kind has a handler.
    pub(crate) fn started(&self) {
        self.in_flight.increment(1.0);
    }

    /// A job of the kind ended with `outcome` after `duration`.
    pub(crate) fn finished(&self, outcome: &Outcome, duration: Duration) {
        self.in_flight.decrement(1.0);
        let label = outcome.label();
        let register =
            || metrics::counter!(JOBS_PROCESSED, "kind" => self.kind.clone(), "outcome" => label);
        match OUTCOMES.iter().position(|o| *o == label) {
            Some(i) => self.processed[i].get_or_init(register).increment(1),
            None => register().increment(1),
        }
        self.duration.record(duration.as_secs_f64());
    }
}

/// A worker's [`KindMetrics`], by kind.
#[derive(Default)]
pub(crate) struct Metrics {
    kinds: Mutex<HashMap<String, Arc<KindMetrics>>>,
}

impl Metrics {
    /// The handles of `kind`, registered if this worker has not run one of
    /// its jobs yet.
    pub(crate) fn of(&self, kind: &str) -> Arc<KindMetrics> {
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(handles) = kinds.get(kind) {
            return handles.clone();
        }
        let handles = Arc::new(KindMetrics::new(kind));
        if kinds.len() < MOST_KINDS {
            kinds.insert(kind.to_owned(), handles.clone());
        }
        handles
    }
}

pub(crate) fn undecodable(outcome: &Outcome) {
    metrics::counter!(JOBS_PROCESSED, "kind" => "undecodable", "outcome" => outcome.label())
        .increment(1);
}

pub(crate) fn jobs_pruned(state: queue_core::JobState, removed: u64) {
    metrics::counter!(JOBS_PRUNED, "state" => state.as_str()).increment(removed);
}

pub(crate) fn jobs_reset(reset: usize, failed: usize) {
    metrics::counter!(JOBS_RESET, "action" => "reset").increment(reset as u64);
    metrics::counter!(JOBS_RESET, "action" => "failed").increment(failed as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind's handles are registered with its first job and reused after;
    /// past [`MOST_KINDS`] kinds, a kind's handles are looked up each time
    /// instead of kept, so that a worker fed ever new kinds does not grow.
    #[test]
    fn a_kind_is_registered_once_and_kinds_past_the_bound_are_not_kept() {
        let metrics = Metrics::default();
        let first = metrics.of("email");
        assert!(Arc::ptr_eq(&first, &metrics.of("email")));
        for i in 1..MOST_KINDS {
            metrics.of(&format!("kind {i}"));
        }
        let past = metrics.of("one too many");
        assert!(!Arc::ptr_eq(&past, &metrics.of("one too many")));
        let kept = metrics.kinds.lock().map(|k| k.len()).unwrap_or(0);
        assert_eq!(kept, MOST_KINDS);
        assert!(Arc::ptr_eq(&first, &metrics.of("email")));
    }
}
