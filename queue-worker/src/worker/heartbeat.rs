//! The heartbeat loop: keeps running jobs alive, and stops those an
//! operator cancelled or that are gone.

use std::sync::Arc;

use queue_core::{CancellationToken, Lease, Store};

use super::job::StopReason;
use super::Shared;

/// Heartbeats running jobs and stops those cancelled or gone.
pub(super) async fn heartbeat_loop<S: Store, H>(
    shared: Arc<Shared<S, H>>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(shared.options.heartbeat_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let leases: Vec<Lease<S::Id>> = shared
            .running()
            .values()
            .map(|(lease, _)| lease.clone())
            .collect();
        if leases.is_empty() {
            continue;
        }
        let now = shared.options.clock.now();
        match shared.store.heartbeat(&leases, now).await {
            Ok(report) => {
                let running = shared.running();
                for (ids, reason) in [
                    (&report.cancel_requested, StopReason::Canceled),
                    (&report.gone, StopReason::Lost),
                ] {
                    for id in ids {
                        if let Some((_, control)) = running.get(id) {
                            tracing::info!(%id, ?reason, "stopping job");
                            control.stop(reason);
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(error = %error.chain(), jobs = leases.len(), "heartbeat failed; retrying next interval")
            }
        }
    }
}
