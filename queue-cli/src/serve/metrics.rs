//! `/metrics`: the process's metrics in Prometheus' text format, plus
//! gauges read from the database (jobs per state and kind, the oldest
//! waiting job's age, stalled jobs), from the figures every reader of the
//! server shares ([`Api::stats_now`]: one read at a time, at most one a
//! second).

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::Mutex;

use super::api::{Api, ApiError};

/// The process-wide Prometheus recorder (installed once; a second server
/// in the same process shares it).
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics shows only what reaches this one");
            }
            handle
        })
        .clone()
}

/// The label sets the gauges have shown.
#[derive(Default)]
pub struct Gauges {
    shown: HashSet<(String, String)>,
}

/// What `/metrics` needs.
#[derive(Clone)]
pub struct MetricsState {
    pub api: Api,
    pub handle: PrometheusHandle,
    pub gauges: Arc<Mutex<Gauges>>,
}

/// Reads the queue's figures into gauges.
async fn refresh(state: &MetricsState) -> Result<(), ApiError> {
    let mut gauges = state.gauges.lock().await;
    let stats = state.api.stats_now(false).await?;
    let mut shown = HashSet::new();
    for count in &stats.counts {
        let labels = (
            count.stored_state.clone(),
            count.kind.clone().unwrap_or_default(),
        );
        metrics::gauge!("queue_jobs", "state" => labels.0.clone(), "kind" => labels.1.clone())
            .set(count.count as f64);
        shown.insert(labels);
    }
    // A state and kind with no jobs left reads 0, not its last count.
    for (state, kind) in gauges.shown.difference(&shown) {
        metrics::gauge!("queue_jobs", "state" => state.clone(), "kind" => kind.clone()).set(0.0);
    }
    metrics::gauge!("queue_oldest_claimable_age_seconds").set(
        stats
            .oldest_claimable_age()
            .map_or(0.0, |age| age.num_milliseconds() as f64 / 1000.0),
    );
    // Not shown at all when the table cannot tell: 0 would be a claim.
    if let Some(stalled) = stats.stalled {
        metrics::gauge!("queue_stalled_jobs").set(stalled as f64);
    }
    gauges.shown.extend(shown);
    Ok(())
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<MetricsState>) -> Result<impl IntoResponse, ApiError> {
    refresh(&state).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.handle.render(),
    ))
}
