//! Errors of the worker runtime.

use queue_core::StoreError;

/// Why a [`Worker`](crate::Worker) or [`Resetter`](crate::Resetter) could
/// not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// An option is out of range; the message names it and the allowed range.
    #[error("invalid worker option: {0}")]
    InvalidOptions(String),
    /// The store failed in a way retrying cannot fix (for example it is
    /// misconfigured). Transient store errors are logged and retried instead.
    /// The message says the store's error; match the variant for the error
    /// itself (it is not repeated as the `source`, so that a report of the
    /// chain says it once).
    #[error("the store failed permanently, so the worker stopped: {0}")]
    Store(StoreError),
    /// The metrics endpoint could not start (the address is taken, or a
    /// metrics recorder is already installed).
    #[error("cannot serve metrics: {0}")]
    Metrics(String),
}

impl From<StoreError> for WorkerError {
    fn from(error: StoreError) -> Self {
        WorkerError::Store(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_worker_says_why_in_its_message() {
        let stopped = WorkerError::from(StoreError::Config(
            "table \"public\".\"jobs\" has no column \"state\"".into(),
        ));
        let message = stopped.to_string();
        assert!(
            message.starts_with("the store failed permanently, so the worker stopped: ")
                && message.contains("has no column \"state\""),
            "{message}"
        );
        assert!(
            std::error::Error::source(&stopped).is_none(),
            "the cause is in the message, not repeated as the source"
        );
    }
}
