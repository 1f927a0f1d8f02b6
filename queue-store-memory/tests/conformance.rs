//! The store conformance suite of `queue-core`, run against the memory store.

use async_trait::async_trait;
use queue_core::testkit::conformance::Harness;
use queue_store_memory::{MemoryCondition, MemoryStore};

struct MemoryHarness;

#[async_trait]
impl Harness for MemoryHarness {
    type Store = MemoryStore;

    async fn store(&self) -> MemoryStore {
        MemoryStore::new()
    }

    fn only_kind(&self, kind: &str) -> MemoryCondition {
        MemoryCondition::kind(kind)
    }

    async fn detached_job_store(&self, store: &MemoryStore) -> MemoryStore {
        store.clone()
    }
}

queue_core::conformance_tests!(MemoryHarness);
