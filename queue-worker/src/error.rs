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
    #[error("the store failed permanently, so the worker stopped")]
    Store(#[from] StoreError),
    /// The metrics endpoint could not start (the address is taken, or a
    /// metrics recorder is already installed).
    #[error("cannot serve metrics: {0}")]
    Metrics(String),
}
