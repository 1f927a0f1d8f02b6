//! [`Router`]: one handler per job kind.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use queue_core::{
    decode_args, ArgsHandler, Handler, JobArgs, JobContext, JobError, JobHandler, JobRecord,
    Outcome, Store, WithPayload,
};

/// Dispatches each job to the handler registered for its kind. Adding a kind
/// is one handler and one [`Router::route`] call.
///
/// A job whose kind has no handler fails at once with a message naming the
/// kind and the registered ones. The router's own PreDequeue hook claims
/// without conditions; wrap the router (for example in a
/// [`Budget`](crate::Budget)) to restrict claims.
///
/// ```
/// use async_trait::async_trait;
/// use queue_core::{Handler, Job, JobContext, JobError};
/// use queue_store_memory::MemoryStore;
/// use queue_worker::Router;
///
/// struct SendEmail;
/// #[async_trait]
/// impl Handler<MemoryStore> for SendEmail {
///     async fn handle(&self, _: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> { Ok(()) }
/// }
///
/// let router = Router::<MemoryStore>::new().route("email", SendEmail);
/// assert_eq!(router.kinds().collect::<Vec<_>>(), ["email"]);
/// ```
pub struct Router<S: Store> {
    handlers: BTreeMap<String, Arc<dyn Handler<S>>>,
}

impl<S: Store> Default for Router<S> {
    fn default() -> Self {
        Router {
            handlers: BTreeMap::new(),
        }
    }
}

impl<S: Store> Router<S> {
    /// A router with no kinds.
    pub fn new() -> Self {
        Router::default()
    }

    /// Registers `handler` for jobs of `kind`, replacing any earlier one.
    pub fn route(mut self, kind: impl Into<String>, handler: impl Handler<S>) -> Self {
        self.handlers.insert(kind.into(), Arc::new(handler));
        self
    }

    /// Registers `handler` for jobs of `A`'s kind ([`JobArgs::KIND`]): it
    /// receives the payload decoded as `A`. A payload that does not decode
    /// fails the job at once with the decoder's message.
    ///
    /// ```
    /// use async_trait::async_trait;
    /// use queue_core::{ArgsHandler, JobArgs, JobContext, JobError};
    /// use queue_store_memory::MemoryStore;
    /// use queue_worker::Router;
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct SendEmail { to: String }
    /// impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
    ///
    /// struct Mailer;
    /// #[async_trait]
    /// impl ArgsHandler<MemoryStore, SendEmail> for Mailer {
    ///     async fn handle(&self, _: &JobContext, _: &mut MemoryStore, email: SendEmail) -> Result<(), JobError> {
    ///         assert!(email.to.contains('@'));
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let router = Router::<MemoryStore>::new().args::<SendEmail>(Mailer);
    /// assert_eq!(router.kinds().collect::<Vec<_>>(), ["send_email"]);
    /// ```
    pub fn args<A: JobArgs>(self, handler: impl ArgsHandler<S, A>) -> Self
    where
        S::Record: WithPayload,
    {
        self.route(
            A::KIND,
            Typed {
                handler,
                args: PhantomData::<fn() -> A>,
            },
        )
    }

    /// Registers `handler`, which needs nothing of the store, for jobs of
    /// `A`'s kind: it receives the payload decoded as `A` (a payload that
    /// does not decode fails the job at once). The same handler type
    /// registers on a router of any store.
    ///
    /// ```
    /// use async_trait::async_trait;
    /// use queue_core::{Job, JobArgs, JobContext, JobError, JobHandler, Store};
    /// use queue_store_memory::MemoryStore;
    /// use queue_worker::Router;
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct SendEmail { to: String }
    /// impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
    ///
    /// struct Mailer;
    /// #[async_trait]
    /// impl JobHandler<SendEmail> for Mailer {
    ///     async fn handle(&self, _: &JobContext, email: SendEmail) -> Result<(), JobError> {
    ///         assert!(email.to.contains('@'));
    ///         Ok(())
    ///     }
    /// }
    ///
    /// /// One router for any store whose records are `Job`s.
    /// fn router<S: Store<Record = Job>>() -> Router<S> {
    ///     Router::new().work::<SendEmail>(Mailer)
    /// }
    /// let in_tests = router::<MemoryStore>();
    /// assert_eq!(in_tests.kinds().collect::<Vec<_>>(), ["send_email"]);
    /// ```
    pub fn work<A: JobArgs>(self, handler: impl JobHandler<A>) -> Self
    where
        S::Record: WithPayload,
    {
        self.args::<A>(StoreFree(handler))
    }

    /// The registered kinds, in order.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }

    fn handler_for(&self, record: &S::Record) -> Option<&Arc<dyn Handler<S>>> {
        self.handlers.get(record.kind())
    }
}

/// An [`ArgsHandler`] as a [`Handler`]: decodes the payload first.
struct Typed<H, A> {
    handler: H,
    args: PhantomData<fn() -> A>,
}

#[async_trait]
impl<S, A, H> Handler<S> for Typed<H, A>
where
    S: Store,
    S::Record: WithPayload,
    A: JobArgs,
    H: ArgsHandler<S, A>,
{
    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut S::JobStore,
        record: &S::Record,
    ) -> Result<(), JobError> {
        let args: A = decode_args(record)?;
        self.handler.handle(ctx, store, args).await
    }
}

/// A [`JobHandler`] as an [`ArgsHandler`] of any store: it leaves the
/// job's store alone.
struct StoreFree<H>(H);

#[async_trait]
impl<S, A, H> ArgsHandler<S, A> for StoreFree<H>
where
    S: Store,
    A: JobArgs,
    H: JobHandler<A>,
{
    async fn handle(&self, ctx: &JobContext, _: &mut S::JobStore, args: A) -> Result<(), JobError> {
        self.0.handle(ctx, args).await
    }
}

#[async_trait]
impl<S: Store> Handler<S> for Router<S> {
    fn kinds(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    async fn pre_handle(&self, ctx: &JobContext, record: &S::Record) {
        if let Some(handler) = self.handler_for(record) {
            handler.pre_handle(ctx, record).await;
        }
    }

    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut S::JobStore,
        record: &S::Record,
    ) -> Result<(), JobError> {
        match self.handler_for(record) {
            Some(handler) => handler.handle(ctx, store, record).await,
            None => Err(JobError::poison(format!(
                "no handler is registered for job kind {:?} (registered: {})",
                record.kind(),
                self.kinds().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    async fn post_handle(&self, ctx: &JobContext, record: &S::Record, outcome: &Outcome) {
        if let Some(handler) = self.handler_for(record) {
            handler.post_handle(ctx, record, outcome).await;
        }
    }
}
