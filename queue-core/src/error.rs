//! Errors: what a store reports ([`StoreError`]), what a handler returns
//! ([`JobError`]) and a record that cannot be read ([`DecodeError`]).

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A boxed error that keeps its source chain.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// An error from a [`Store`](crate::Store) operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend could not be reached or dropped the connection; the
    /// operation may succeed if tried again later.
    #[error(
        "the job store is unavailable ({context}); check that the database is up and reachable"
    )]
    Unavailable {
        /// What was being done.
        context: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The store's configuration does not match what it runs on (a missing
    /// table or column, a mistyped column, an unknown state value). The
    /// message names the object and what was expected.
    #[error("the job store is misconfigured: {0}")]
    Config(String),
    /// The call asked for something the store refuses, and changed
    /// nothing: bad input (a state that cannot be purged, an interval
    /// under a second, a time out of range), or something the table has no
    /// column for (a kind, a unique key, a filter). The message says which,
    /// in the store's own words.
    #[error("refused: {0}")]
    Refused(String),
    /// A read ran longer than the store's limit for one and was stopped;
    /// nothing was changed. Narrow the request (a filter, a smaller page)
    /// or raise the limit.
    #[error(
        "the job store stopped {context} after {after:?}, its limit for one read; narrow the request or raise the limit"
    )]
    TimedOut {
        /// What was being read.
        context: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// The extra conditions a PreDequeue hook gave a claim were refused (a
    /// placeholder without a bound value, or SQL the database rejects).
    /// That claim fails; the worker says so and keeps running, since the
    /// hook may give other conditions next time.
    #[error("the claim's dequeue conditions were refused: {0}")]
    Conditions(String),
    /// A transient conflict such as a serialization failure or a deadlock;
    /// retrying the operation is safe.
    #[error("transient conflict in the job store ({context}); the operation can be retried")]
    Conflict {
        /// What was being done.
        context: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// Any other backend failure.
    #[error("job store operation failed ({context})")]
    Backend {
        /// What was being done.
        context: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// This error and each cause under it, joined by `: `, for a log line
    /// that says what the database said.
    pub fn chain(&self) -> String {
        chain(self)
    }

    /// Whether trying the same operation again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. } | StoreError::Conflict { .. }
        )
    }
}

/// A claimed record that could not be decoded into the store's record type.
/// The worker fails such a job with this message instead of stopping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {id} could not be decoded: {message}")]
pub struct DecodeError {
    /// The key of the job, as text.
    pub id: String,
    /// What went wrong, naming the column or field.
    pub message: String,
}

/// How a failed attempt should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Try again, after the retry policy's backoff or the given delay.
    Retry {
        /// Overrides the retry policy's backoff for this attempt.
        after: Option<Duration>,
    },
    /// Poison: retrying cannot help; fail the job at once.
    Poison,
    /// The handler gave up because the job was cancelled.
    Cancel,
    /// Not classified by the handler: the worker applies its configured
    /// default (retry, unless configured otherwise).
    Unclassified,
}

/// The error a handler returns: a classification plus the error chain.
///
/// Any error converts into an *unclassified* `JobError`, so `?` works in
/// handlers; use [`JobError::retry`], [`JobError::poison`] or
/// [`JobError::cancel`] to classify.
///
/// ```
/// use queue_core::JobError;
///
/// fn parse(input: &str) -> Result<u32, JobError> {
///     let n: u32 = input.parse()?; // unclassified: the worker's default applies
///     if n == 0 {
///         return Err(JobError::poison("zero is never valid"));
///     }
///     Ok(n)
/// }
/// assert!(parse("0").unwrap_err().is_poison());
/// assert!(!parse("x").unwrap_err().is_poison());
/// ```
pub struct JobError {
    class: ErrorClass,
    source: BoxError,
}

impl JobError {
    /// A retryable error; the retry policy picks the delay.
    pub fn retry(error: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Retry { after: None }, error)
    }

    /// A retryable error to be tried again after `delay`.
    pub fn retry_after(error: impl Into<BoxError>, delay: Duration) -> Self {
        Self::with_class(ErrorClass::Retry { after: Some(delay) }, error)
    }

    /// A poison error: the job fails at once, whatever retries remain.
    pub fn poison(error: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Poison, error)
    }

    /// The handler stopped because the job was cancelled.
    pub fn cancel(reason: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Cancel, reason)
    }

    /// An error the worker treats with its configured default.
    pub fn unclassified(error: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Unclassified, error)
    }

    /// An error of the given class.
    pub fn with_class(class: ErrorClass, error: impl Into<BoxError>) -> Self {
        JobError {
            class,
            source: error.into(),
        }
    }

    /// How this error is to be treated.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// Whether this is a poison error.
    pub fn is_poison(&self) -> bool {
        self.class == ErrorClass::Poison
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }

    /// The underlying error, by value.
    pub fn into_source(self) -> BoxError {
        self.source
    }

    /// The error and its sources joined with `": "`, as stored in
    /// `failure_message`.
    pub fn message(&self) -> String {
        chain(&*self.source)
    }
}

/// `error` and its sources joined with `": "`.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("class", &self.class)
            .field("source", &self.source)
            .finish()
    }
}

// `JobError` deliberately does not implement `std::error::Error`, so that this
// blanket conversion (which makes `?` work in handlers) does not overlap with
// the reflexive `From<T> for T`.
impl<E> From<E> for JobError
where
    E: Into<BoxError>,
{
    fn from(error: E) -> Self {
        JobError::unclassified(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn message_keeps_the_source_chain() {
        let err = JobError::retry(Outer(std::io::Error::other("disk full")));
        assert_eq!(err.message(), "outer: disk full");
        assert_eq!(err.class(), ErrorClass::Retry { after: None });
    }

    #[test]
    fn a_store_error_chain_says_what_the_backend_said() {
        let err = StoreError::Unavailable {
            context: "claiming jobs".into(),
            source: Box::new(Outer(std::io::Error::other("connection reset"))),
        };
        assert!(
            err.chain()
                .starts_with("the job store is unavailable (claiming jobs)")
                && err.chain().ends_with(": outer: connection reset"),
            "{}",
            err.chain()
        );
    }

    #[test]
    fn question_mark_gives_an_unclassified_error() {
        fn run() -> Result<(), JobError> {
            "x".parse::<u8>()?;
            Ok(())
        }
        assert_eq!(run().unwrap_err().class(), ErrorClass::Unclassified);
    }

    #[test]
    fn only_unavailable_and_conflict_are_retryable() {
        let io = || Box::new(std::io::Error::other("x")) as BoxError;
        assert!(StoreError::Unavailable {
            context: "claim".into(),
            source: io()
        }
        .is_retryable());
        assert!(!StoreError::Config("missing column \"state\"".into()).is_retryable());
    }
}
