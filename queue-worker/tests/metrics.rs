//! The worker reports `queue_jobs_processed_total{kind,outcome}`, the
//! duration histogram and the in-flight gauge, and the pruner
//! `queue_jobs_pruned_total{state}`, through the `metrics` facade.
//! (Its own test binary: it installs a process-wide recorder.)

mod common;

use async_trait::async_trait;
use common::{fast_options, start, wait_for_state};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use queue_core::{Handler, Job, JobContext, JobError, JobState, NewJob};
use queue_store_memory::MemoryStore;
use queue_worker::metrics::{JOBS_IN_FLIGHT, JOBS_PROCESSED, JOBS_PRUNED, JOB_DURATION};

/// What one snapshot of the recorder held (a snapshot drains what it
/// reads, so a test takes one and asks it everything).
type Snapshot = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of metric `name` with exactly `labels`, if recorded.
fn value<'s>(
    snapshot: &'s Snapshot,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'s DebugValue> {
    snapshot
        .iter()
        .find(|(key, ..)| {
            let key = key.key();
            let mut have: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let mut want = labels.to_vec();
            have.sort();
            want.sort();
            key.name() == name && have == want
        })
        .map(|(_, _, _, value)| value)
}

fn counter(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    match value(snapshot, name, labels) {
        Some(DebugValue::Counter(n)) => Some(*n),
        _ => None,
    }
}

struct ByKind;

#[async_trait]
impl Handler<MemoryStore> for ByKind {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        match job.kind.as_str() {
            "email" => Ok(()),
            _ => Err(JobError::poison("bad")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processed_and_pruned_jobs_are_counted() {
    let recorder = DebuggingRecorder::new();
    let metrics = recorder.snapshotter();
    recorder.install().expect("first recorder in this binary");

    let store = MemoryStore::new();
    let ids = store.enqueue_many([
        NewJob::new("email", serde_json::json!(1)),
        NewJob::new("email", serde_json::json!(2)),
        NewJob::new("resize", serde_json::json!(3)),
    ]);
    let running = start(&store, ByKind, fast_options());
    wait_for_state(&store, ids[0], JobState::Completed).await;
    wait_for_state(&store, ids[1], JobState::Completed).await;
    wait_for_state(&store, ids[2], JobState::Failed).await;
    running.stop().await;

    let snapshot = metrics.snapshot().into_vec();
    assert_eq!(
        counter(
            &snapshot,
            JOBS_PROCESSED,
            &[("kind", "email"), ("outcome", "completed")]
        ),
        Some(2)
    );
    assert_eq!(
        counter(
            &snapshot,
            JOBS_PROCESSED,
            &[("kind", "resize"), ("outcome", "poisoned")]
        ),
        Some(1)
    );
    let durations = match value(&snapshot, JOB_DURATION, &[("kind", "email")]) {
        Some(DebugValue::Histogram(values)) => values.len(),
        other => panic!("no duration histogram: {other:?}"),
    };
    assert_eq!(durations, 2, "one duration per attempt");
    let in_flight = match value(&snapshot, JOBS_IN_FLIGHT, &[("kind", "email")]) {
        Some(DebugValue::Gauge(v)) => Some(v.into_inner()),
        _ => None,
    };
    assert_eq!(in_flight, Some(0.0), "the in-flight gauge returns to zero");

    // The two completed jobs are past a retention of zero; the failed one
    // is kept (no age for failed jobs).
    let pruner = queue_worker::Pruner::new(
        store.clone(),
        queue_worker::PrunerOptions {
            retention: queue_core::Retention {
                completed: Some(std::time::Duration::ZERO),
                batch: 1,
                ..queue_core::Retention::default()
            },
            ..queue_worker::PrunerOptions::default()
        },
    )
    .expect("valid options");
    let report = pruner.prune_once().await.expect("a pass");
    assert_eq!(report.total(), 2);
    assert_eq!(
        counter(
            &metrics.snapshot().into_vec(),
            JOBS_PRUNED,
            &[("state", "completed")]
        ),
        Some(2),
        "counted per batch, by state"
    );
}
