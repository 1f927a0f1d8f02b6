//! Handlers that stand for no work at all, for any store: drains, tests and
//! benchmarks that exercise the queue rather than the handler.

use async_trait::async_trait;

use crate::{Handler, JobContext, JobError, Store};

/// Succeeds at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Succeeds;

#[async_trait]
impl<S: Store> Handler<S> for Succeeds {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut S::JobStore,
        _: &S::Record,
    ) -> Result<(), JobError> {
        Ok(())
    }
}

/// Runs until the worker cancels the job (a shutdown, a cancellation), then
/// ends it canceled: holds jobs in flight for as long as a test needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct UntilCancelled;

#[async_trait]
impl<S: Store> Handler<S> for UntilCancelled {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut S::JobStore,
        _: &S::Record,
    ) -> Result<(), JobError> {
        ctx.cancelled().await;
        Err(JobError::cancel("stopped on request"))
    }
}
