//! [`Budget`]: the worker-budget pattern of the dbworker spec, as a handler
//! decorator.
//!
//! A worker running several jobs must not exceed its resource capacity. When
//! each job's cost can be estimated from its record, the budget:
//!
//! 1. in PreDequeue, claims nothing when no headroom is left or another
//!    claim is still on its way (its jobs' costs are not known yet), and
//!    otherwise claims one job at a time with extra conditions admitting only
//!    jobs that fit the remaining headroom;
//! 2. in PreHandle (which the worker runs before its next claim), takes the
//!    job's cost from the headroom;
//! 3. in PostHandle, gives it back.
//!
//! A job costing more than the whole capacity is never claimed by this
//! worker.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use queue_core::{
    BoxError, Dequeue, DequeueContext, Handler, JobContext, JobError, Outcome, Store,
};

type CostFn<R> = Box<dyn Fn(&R) -> u64 + Send + Sync>;
type FitsFn<C> = Box<dyn Fn(u64) -> C + Send + Sync>;

/// Wraps a handler so the summed cost of the jobs it runs at once stays
/// within `capacity`.
///
/// ```
/// use queue_core::Job;
/// use queue_store_memory::{MemoryCondition, MemoryStore};
/// use queue_worker::{Budget, Router};
///
/// fn cost(job: &Job) -> u64 {
///     job.payload["cost"].as_u64().unwrap_or(1)
/// }
/// let budget = Budget::<MemoryStore, _>::new(
///     Router::new(),
///     10,
///     cost,
///     |headroom| MemoryCondition::new(move |job| cost(job) <= headroom),
/// );
/// assert_eq!(budget.headroom(), 10);
/// ```
pub struct Budget<S: Store, H> {
    inner: H,
    capacity: u64,
    in_use: Mutex<u64>,
    cost: CostFn<S::Record>,
    fits: FitsFn<S::Conditions>,
}

impl<S: Store, H: Handler<S>> Budget<S, H> {
    /// Wraps `inner` with a budget of `capacity`. `cost` estimates a job's
    /// cost from its record; `fits(headroom)` builds the store conditions
    /// admitting only jobs costing at most `headroom`. These conditions
    /// replace any the inner handler's PreDequeue would return.
    pub fn new(
        inner: H,
        capacity: u64,
        cost: impl Fn(&S::Record) -> u64 + Send + Sync + 'static,
        fits: impl Fn(u64) -> S::Conditions + Send + Sync + 'static,
    ) -> Self {
        Budget {
            inner,
            capacity,
            in_use: Mutex::new(0),
            cost: Box::new(cost),
            fits: Box::new(fits),
        }
    }

    /// The capacity not taken by running jobs.
    pub fn headroom(&self) -> u64 {
        self.capacity.saturating_sub(*self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.in_use.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl<S: Store, H: Handler<S>> Handler<S> for Budget<S, H> {
    fn kinds(&self) -> Vec<String> {
        self.inner.kinds()
    }

    async fn pre_dequeue(
        &self,
        ctx: &DequeueContext<'_>,
    ) -> Result<Dequeue<S::Conditions>, BoxError> {
        let headroom = self.headroom();
        if headroom == 0 || ctx.claims_in_flight > 0 {
            return Ok(Dequeue::NotNow);
        }
        Ok(match self.inner.pre_dequeue(ctx).await? {
            Dequeue::NotNow => Dequeue::NotNow,
            Dequeue::Go { .. } => Dequeue::with_conditions((self.fits)(headroom)).limit(1),
            other => other,
        })
    }

    async fn pre_handle(&self, ctx: &JobContext, record: &S::Record) {
        let cost = (self.cost)(record);
        {
            let mut in_use = self.lock();
            *in_use = in_use.saturating_add(cost);
        }
        self.inner.pre_handle(ctx, record).await;
    }

    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut S::JobStore,
        record: &S::Record,
    ) -> Result<(), JobError> {
        self.inner.handle(ctx, store, record).await
    }

    async fn post_handle(&self, ctx: &JobContext, record: &S::Record, outcome: &Outcome) {
        self.inner.post_handle(ctx, record, outcome).await;
        let cost = (self.cost)(record);
        let mut in_use = self.lock();
        *in_use = in_use.saturating_sub(cost);
    }
}
