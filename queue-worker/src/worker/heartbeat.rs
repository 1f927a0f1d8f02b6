//! The heartbeat loop: keeps running jobs alive, and stops those an
//! operator cancelled or that are gone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use queue_core::{CancellationToken, Handler, Lease, Store, WorkerBeat};

use super::job::StopReason;
use super::options::host_name;
use super::Shared;

/// Heartbeats running jobs and stops those cancelled or gone.
pub(super) async fn heartbeat_loop<S: Store, H: Handler<S>>(
    shared: Arc<Shared<S, H>>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(shared.options.heartbeat_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started_at = shared.options.clock.now();
    let kinds = shared.handler.kinds();
    let mut beat_failed = false;
    loop {
        // The first tick is at once: the worker is in the registry from
        // its start.
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => {
                // Stopped on purpose (after the drain): out of the
                // registry now, not after the stalled age. Bounded, so that
                // a database that is down does not hold the shutdown up.
                let leave = shared.store.leave(&shared.name);
                match tokio::time::timeout(std::time::Duration::from_secs(2), leave).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(error = %error.chain(), "the worker registry kept this worker; it ages out")
                    }
                    Err(_) => tracing::debug!("the worker registry did not answer in 2 s; this worker ages out"),
                }
                return;
            }
        }
        let in_flight = u32::try_from(shared.running().len()).unwrap_or(u32::MAX);
        let beat = WorkerBeat::new(shared.name.to_string(), host_name(), std::process::id())
            .kinds(kinds.clone())
            .load(
                u32::try_from(shared.options.num_handlers).unwrap_or(u32::MAX),
                in_flight,
            )
            .started_at(started_at);
        match shared.store.beat(&beat).await {
            Ok(()) => beat_failed = false,
            // Said once per run of failures: the registry is for operators,
            // and the jobs go on without it.
            Err(error) if !beat_failed => {
                beat_failed = true;
                tracing::warn!(error = %error.chain(), "the worker registry did not take this worker's beat; its jobs go on")
            }
            Err(_) => {}
        }
        // Jobs whose handler is done are left out: their outcome is on its
        // way, and a heartbeat would only hold its write up.
        let leases: Vec<Lease<S::Id>> = shared
            .running()
            .values()
            .filter(|(_, control)| !control.handled.load(Ordering::Acquire))
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
                        // The report speaks of the attempts asked about: a
                        // job whose attempt ended while the heartbeat was
                        // out, and that was claimed again, runs a new
                        // attempt the report knows nothing of.
                        let asked = leases.iter().find(|l| &l.id == id).map(|l| l.token);
                        if let Some((lease, control)) = running.get(id) {
                            if Some(lease.token) == asked {
                                tracing::info!(%id, ?reason, "stopping job");
                                control.stop(reason);
                            }
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
