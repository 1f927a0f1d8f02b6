//! The store conformance suite of `queue-core`, run against the memory store.

use async_trait::async_trait;
use queue_core::testkit::conformance::{Harness, Snapshot};
use queue_core::NewJob;
use queue_store_memory::{JobFilter, MemoryStore};

struct MemoryHarness;

#[async_trait]
impl Harness for MemoryHarness {
    type Store = MemoryStore;

    async fn store(&self) -> MemoryStore {
        MemoryStore::new()
    }

    async fn enqueue(&self, store: &MemoryStore, job: NewJob) -> i64 {
        store.enqueue(job)
    }

    async fn inspect(&self, store: &MemoryStore, id: &i64) -> Option<Snapshot> {
        store.get(*id).map(Snapshot::from)
    }

    async fn cancel(&self, store: &MemoryStore, id: &i64) {
        store.cancel(*id);
    }

    async fn delete(&self, store: &MemoryStore, id: &i64) {
        store.delete(*id);
    }

    fn only_kind(&self, kind: &str) -> JobFilter {
        JobFilter::kind(kind)
    }

    async fn detached_job_store(&self, store: &MemoryStore) -> MemoryStore {
        store.clone()
    }
}

queue_core::conformance_tests!(MemoryHarness);
