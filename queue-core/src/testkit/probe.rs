//! A claim prober: claims one job at a time beside the workers under test
//! and times every claim, so a test can show that something running at
//! the same time (a purge, a pruner) never holds claims up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{ClaimParams, Store, Transition};

/// Claims one job at a time as worker `prober` (completing each at once,
/// then pausing 5 ms) while `probing` holds, counting the jobs it took in
/// `claimed` as it goes (a caller that waits for a queue to drain counts
/// them with its workers'), and returns how long each claim took. Panics
/// if a claim or a completion fails.
pub async fn probe_claims<S: Store>(
    store: S,
    probing: Arc<AtomicBool>,
    claimed: Arc<AtomicUsize>,
) -> Vec<Duration> {
    let mut waits = Vec::new();
    while probing.load(Ordering::SeqCst) {
        let started = Instant::now();
        let jobs = store
            .claim(ClaimParams {
                limit: 1,
                worker: "prober",
                conditions: None,
                now: chrono::Utc::now(),
            })
            .await
            .expect("a claim");
        waits.push(started.elapsed());
        claimed.fetch_add(jobs.len(), Ordering::SeqCst);
        for job in jobs {
            let done = store
                .finish(
                    job.job_store,
                    &job.lease,
                    Transition::Complete,
                    chrono::Utc::now(),
                )
                .await
                .expect("a completion");
            assert!(done.is_applied(), "the prober's job completes");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waits
}
