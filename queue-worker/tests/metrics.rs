//! The worker reports `queue_jobs_processed_total{kind,outcome}`, the
//! duration histogram and the in-flight gauge, and the pruner
//! `queue_jobs_pruned_total{state}`, through the `metrics` facade.
//! (Its own test binary: it installs a process-wide recorder.)

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use common::{fast_options, start, wait_for_state};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use queue_core::{Handler, Job, JobContext, JobError, JobState, NewJob};
use queue_store_memory::MemoryStore;
use queue_worker::metrics::{JOBS_IN_FLIGHT, JOBS_PROCESSED, JOBS_PRUNED, JOB_DURATION};

/// Every metric as `name{label=value,...}` and its value.
#[derive(Default)]
struct Capture {
    values: Mutex<BTreeMap<String, Arc<Value>>>,
}

#[derive(Default)]
struct Value {
    bits: AtomicU64, // f64 bits for gauges, a count for counters and histograms
}

impl CounterFn for Value {
    fn increment(&self, value: u64) {
        self.bits.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.bits.store(value, Ordering::SeqCst);
    }
}

impl GaugeFn for Value {
    fn increment(&self, value: f64) {
        let _ = self
            .bits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                Some((f64::from_bits(b) + value).to_bits())
            });
    }
    fn decrement(&self, value: f64) {
        GaugeFn::increment(self, -value);
    }
    fn set(&self, value: f64) {
        self.bits.store(value.to_bits(), Ordering::SeqCst);
    }
}

impl HistogramFn for Value {
    fn record(&self, _value: f64) {
        self.bits.fetch_add(1, Ordering::SeqCst);
    }
}

impl Capture {
    fn slot(&self, key: &Key) -> Arc<Value> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.values.lock().unwrap().entry(name).or_default().clone()
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.values
            .lock()
            .unwrap()
            .get(name)
            .map(|v| v.bits.load(Ordering::SeqCst))
    }
}

struct Global(Arc<Capture>);

impl Recorder for Global {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.slot(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.0.slot(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.0.slot(key))
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
    let capture = Arc::new(Capture::default());
    metrics::set_global_recorder(Global(capture.clone())).expect("first recorder in this binary");

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

    assert_eq!(
        capture.get(&format!("{JOBS_PROCESSED}{{kind=email,outcome=ok}}")),
        Some(2)
    );
    assert_eq!(
        capture.get(&format!("{JOBS_PROCESSED}{{kind=resize,outcome=poison}}")),
        Some(1)
    );
    assert_eq!(
        capture.get(&format!("{JOB_DURATION}{{kind=email}}")),
        Some(2),
        "one duration per attempt"
    );
    let in_flight = capture
        .get(&format!("{JOBS_IN_FLIGHT}{{kind=email}}"))
        .map(f64::from_bits);
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
        capture.get(&format!("{JOBS_PRUNED}{{state=completed}}")),
        Some(2),
        "counted per batch, by state"
    );
}
