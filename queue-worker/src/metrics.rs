//! The metrics the runtime reports through the `metrics` facade.
//!
//! Install any `metrics` recorder (Prometheus exporter, StatsD, ...) to
//! collect them; without one they cost next to nothing.

use std::time::Duration;

use queue_core::Outcome;

/// Counter of finished attempts, labelled `kind` and `outcome` (`ok`,
/// `retry`, `failed`, `poison`, `canceled`, `released`, `interrupted`, `lost`).
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

pub(crate) fn job_started(kind: &str) {
    metrics::gauge!(JOBS_IN_FLIGHT, "kind" => kind.to_owned()).increment(1.0);
}

pub(crate) fn job_finished(kind: &str, outcome: &Outcome, duration: Duration) {
    metrics::gauge!(JOBS_IN_FLIGHT, "kind" => kind.to_owned()).decrement(1.0);
    metrics::counter!(JOBS_PROCESSED, "kind" => kind.to_owned(), "outcome" => outcome.label())
        .increment(1);
    metrics::histogram!(JOB_DURATION, "kind" => kind.to_owned()).record(duration.as_secs_f64());
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
