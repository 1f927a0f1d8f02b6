//! Typed job arguments: a job's kind and payload as one Rust type.
//!
//! Implement [`JobArgs`] for the arguments of a kind of job; enqueue them
//! with [`NewJob::from_args`], and register an [`ArgsHandler`] for the type
//! on the worker's router (`queue_worker::Router::args`), which decodes
//! the payload before the handler sees it. Untyped [`NewJob`]s with JSON
//! stay for foreign tables and dynamic uses.

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{JobError, StoreError};
use crate::handler::JobContext;
use crate::job::{JobRecord, NewJob};
use crate::store::Store;

/// The arguments of one kind of job.
///
/// ```
/// use queue_core::{JobArgs, NewJob};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail {
///     to: String,
/// }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
/// }
///
/// let job = NewJob::from_args(&SendEmail { to: "ops@example.com".into() }).unwrap();
/// assert_eq!(job.kind, "send_email");
/// assert_eq!(job.payload["to"], "ops@example.com");
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind such jobs are enqueued as and routed by.
    const KIND: &'static str;
}

impl NewJob {
    /// A job of `A::KIND` whose payload is `args` as JSON; the setters
    /// ([`NewJob::unique`], [`NewJob::priority`], ...) apply as usual.
    pub fn from_args<A: JobArgs>(args: &A) -> Result<NewJob, StoreError> {
        let payload = serde_json::to_value(args).map_err(|e| {
            StoreError::Config(format!(
                "the arguments of a {} job do not encode as JSON: {e}",
                A::KIND
            ))
        })?;
        Ok(NewJob::new(A::KIND, payload))
    }
}

/// A record whose payload typed handlers can decode. The default record
/// ([`Job`](crate::Job)) has one; a foreign table's record implements this
/// to use typed handlers.
pub trait WithPayload: JobRecord {
    /// The job's arguments, as stored.
    fn payload(&self) -> &serde_json::Value;
}

impl WithPayload for crate::Job {
    fn payload(&self) -> &serde_json::Value {
        &self.payload
    }
}

/// Decodes a record's payload as `A`; a payload of another shape fails the
/// job at once (poison) with the decoder's message.
pub fn decode_args<A: JobArgs, R: WithPayload>(record: &R) -> Result<A, JobError> {
    A::deserialize(record.payload()).map_err(|e| {
        JobError::poison(format!(
            "the payload of {} job {} does not decode as {}: {e}",
            A::KIND,
            record.id(),
            std::any::type_name::<A>()
        ))
    })
}

/// A handler for jobs of one [`JobArgs`] type: it receives the decoded
/// arguments instead of the record.
#[async_trait]
pub trait ArgsHandler<S: Store, A: JobArgs>: Send + Sync + 'static {
    /// Processes one job; see [`Handler::handle`](crate::Handler::handle).
    async fn handle(
        &self,
        ctx: &JobContext,
        job_store: &mut S::JobStore,
        args: A,
    ) -> Result<(), JobError>;
}

/// A handler for jobs of one [`JobArgs`] type that needs nothing of the
/// store: it receives the decoded arguments alone, so the same handler
/// type runs on every store (the memory store in a test, Postgres in
/// production). Register it with `queue_worker::Router::work`. A handler
/// that writes in the job's own transaction (Postgres' transactional mode)
/// implements [`ArgsHandler`] instead, which names the store.
///
/// ```
/// use async_trait::async_trait;
/// use queue_core::{JobArgs, JobContext, JobError, JobHandler};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
/// impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
///
/// struct Mailer;
/// #[async_trait]
/// impl JobHandler<SendEmail> for Mailer {
///     async fn handle(&self, _: &JobContext, email: SendEmail) -> Result<(), JobError> {
///         if email.to.is_empty() {
///             return Err(JobError::poison("no recipient"));
///         }
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait JobHandler<A: JobArgs>: Send + Sync + 'static {
    /// Processes one job; see [`Handler::handle`](crate::Handler::handle).
    async fn handle(&self, ctx: &JobContext, args: A) -> Result<(), JobError>;
}
