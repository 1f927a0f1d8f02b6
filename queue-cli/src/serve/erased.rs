//! The admin contract with its key type erased to text, so that the HTTP
//! handlers are plain functions (which the OpenAPI generator can describe)
//! serving a table of any key type.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{
    ActionReport, Enqueued, FinishedBucket, JobPage, JobState, JobView, ListParams, NewJob,
    QueueStats, RetryParams, Skipped, StatsParams, StoreError, Targets, TimelineParams,
};

use crate::CliAdmin;

/// [`Admin`] with keys as text.
#[async_trait]
pub trait TextAdmin: Send + Sync + 'static {
    /// See [`Admin::stored_state`].
    fn stored_state(&self, state: JobState) -> String;
    /// See [`Admin::get`]; a text that is no key of the table is no job.
    async fn get(&self, id: &str) -> Result<Option<JobView<String>>, StoreError>;
    /// See [`Admin::list`]; `after` must be a key of the table.
    async fn list(&self, params: ListParams<String>) -> Result<JobPage<String>, KeyOr>;
    /// See [`Admin::stats`].
    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError>;
    /// See [`Admin::finished_timeline`].
    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError>;
    /// See [`Admin::enqueue`].
    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<String>>, StoreError>;
    /// See [`Admin::retry`]; texts that are no key are reported missing.
    async fn retry(
        &self,
        targets: Targets<String>,
        params: RetryParams,
        now: DateTime<Utc>,
    ) -> Result<ActionReport<String>, StoreError>;
    /// See [`Admin::cancel`].
    async fn cancel(
        &self,
        targets: Targets<String>,
        now: DateTime<Utc>,
    ) -> Result<ActionReport<String>, StoreError>;
    /// See [`Admin::delete`].
    async fn delete(&self, targets: Targets<String>) -> Result<ActionReport<String>, StoreError>;
}

/// A failure of a call that takes a key from the caller.
#[derive(Debug)]
pub enum KeyOr {
    /// The text is not a key of this table.
    BadKey(String),
    /// The store failed.
    Store(StoreError),
}

impl From<StoreError> for KeyOr {
    fn from(error: StoreError) -> Self {
        KeyOr::Store(error)
    }
}

/// An [`Admin`] seen through [`TextAdmin`].
pub struct Erased<A>(pub A);

impl<A> Erased<A>
where
    A: CliAdmin,
{
    /// `self` as a shared [`TextAdmin`].
    pub fn shared(admin: A) -> Arc<dyn TextAdmin> {
        Arc::new(Erased(admin))
    }
}

fn view<Id: ToString>(job: JobView<Id>) -> JobView<String> {
    job.map_id(|id| id.to_string())
}

fn report<Id: ToString>(report: ActionReport<Id>, not_keys: Vec<String>) -> ActionReport<String> {
    let mut skipped: Vec<Skipped<String>> = report
        .skipped
        .into_iter()
        .map(|s| s.map_id(|id| id.to_string()))
        .collect();
    skipped.extend(not_keys.into_iter().map(Skipped::missing));
    ActionReport {
        changed: report.changed,
        stop_requested: report.stop_requested,
        skipped,
    }
}

impl<A> Erased<A>
where
    A: CliAdmin,
{
    /// The targets with keys parsed; texts that are no key come back apart
    /// (no job can have them).
    fn targets(&self, targets: Targets<String>) -> (Targets<A::Id>, Vec<String>) {
        match targets {
            Targets::Ids(texts) => {
                let mut keys = Vec::with_capacity(texts.len());
                let mut not_keys = Vec::new();
                for text in texts {
                    match A::Id::from_str(&text) {
                        Ok(key) => keys.push(key),
                        Err(_) => not_keys.push(text),
                    }
                }
                (Targets::Ids(keys), not_keys)
            }
            Targets::Matching { filter, limit } => {
                (Targets::Matching { filter, limit }, Vec::new())
            }
        }
    }
}

#[async_trait]
impl<A> TextAdmin for Erased<A>
where
    A: CliAdmin,
{
    fn stored_state(&self, state: JobState) -> String {
        self.0.stored_state(state)
    }

    async fn get(&self, id: &str) -> Result<Option<JobView<String>>, StoreError> {
        let Ok(key) = A::Id::from_str(id) else {
            return Ok(None);
        };
        Ok(self.0.get(&key).await?.map(view))
    }

    async fn list(&self, params: ListParams<String>) -> Result<JobPage<String>, KeyOr> {
        let after = match &params.after {
            Some(text) => Some(A::Id::from_str(text).map_err(|_| KeyOr::BadKey(text.clone()))?),
            None => None,
        };
        let page = self
            .0
            .list(&ListParams {
                filter: params.filter,
                order: params.order,
                limit: params.limit,
                after,
            })
            .await?;
        Ok(JobPage {
            jobs: page.jobs.into_iter().map(view).collect(),
            next: page.next.map(|id| id.to_string()),
        })
    }

    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        self.0.stats(params).await
    }

    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        self.0.finished_timeline(params).await
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<String>>, StoreError> {
        Ok(self
            .0
            .enqueue(jobs)
            .await?
            .into_iter()
            .map(|e| Enqueued {
                id: e.id.to_string(),
                inserted: e.inserted,
            })
            .collect())
    }

    async fn retry(
        &self,
        targets: Targets<String>,
        params: RetryParams,
        now: DateTime<Utc>,
    ) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = self.targets(targets);
        Ok(report(self.0.retry(&targets, params, now).await?, not_keys))
    }

    async fn cancel(
        &self,
        targets: Targets<String>,
        now: DateTime<Utc>,
    ) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = self.targets(targets);
        Ok(report(self.0.cancel(&targets, now).await?, not_keys))
    }

    async fn delete(&self, targets: Targets<String>) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = self.targets(targets);
        Ok(report(self.0.delete(&targets).await?, not_keys))
    }
}
