//! [`WorkerReport`]: what a worker did before it stopped.

/// What a worker did before it stopped: attempts by outcome label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Attempts by outcome label (`completed`, `retried`, `failed`,
    /// `poisoned`, `canceled`, `released`, `interrupted`, `lost`).
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
}

impl WorkerReport {
    /// How many attempts ended with `label`.
    pub fn count(&self, label: &str) -> u64 {
        self.outcomes.get(label).copied().unwrap_or(0)
    }

    /// All attempts.
    pub fn total(&self) -> u64 {
        self.outcomes.values().sum()
    }
}
