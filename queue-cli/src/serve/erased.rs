//! The admin contract of any store with its keys as text: one type,
//! [`TextAdmin`], that the CLI's commands and the HTTP API both run over,
//! whatever the key column's type. [`Erased`] turns an [`Admin`] into one;
//! [`open`] builds the Postgres admin for a table's key type, the one place
//! that chooses among them.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{
    ActionReport, Admin, Enqueued, FinishedBucket, JobFilter, JobPage, JobState, JobView,
    ListParams, NewJob, NewOperation, Operation, OperationParams, OperationStep, PausedKind,
    PurgeParams, QueueStats, ResetParams, ResetReport, RetryParams, Skipped, StatsParams,
    StoreError, TakeOperation, Targets, TimelineParams,
};
use queue_store_postgres::{PgAdmin, PgKeyType, PgStoreOptions};
use sqlx::PgPool;

use crate::CliAdmin;

/// An admin contract whose keys are text.
pub type TextAdmin = dyn Admin<Id = String>;

/// The Postgres admin of the table `options` describe, whose key column is
/// of type `key`, with its keys as text.
pub async fn open(
    pool: PgPool,
    options: PgStoreOptions,
    key: PgKeyType,
) -> Result<Arc<TextAdmin>, StoreError> {
    Ok(match key {
        PgKeyType::Int4 => Erased::shared(PgAdmin::<i32>::new(pool, options).await?),
        PgKeyType::Int8 => Erased::shared(PgAdmin::<i64>::new(pool, options).await?),
        PgKeyType::Uuid => Erased::shared(PgAdmin::<uuid::Uuid>::new(pool, options).await?),
        PgKeyType::Text => Erased::shared(PgAdmin::<String>::new(pool, options).await?),
    })
}

/// An [`Admin`] whose keys are read from and written as text. A text that
/// is no key of the table names no job: `get` finds none, a write reports
/// it missing, and a page after it is refused.
pub struct Erased<A>(pub A);

impl<A> Erased<A>
where
    A: CliAdmin,
{
    /// `admin` as a shared [`TextAdmin`].
    pub fn shared(admin: A) -> Arc<TextAdmin> {
        Arc::new(Erased(admin))
    }

    /// The key `text` names; refused if it is none (a position no batch
    /// of this table could have reported).
    fn key(text: &str) -> Result<A::Id, StoreError> {
        A::Id::from_str(text)
            .map_err(|_| StoreError::Refused(format!("{text:?} is not a key of this table")))
    }

    /// The targets with keys parsed; texts that are no key come back apart
    /// (no job can have them).
    fn targets(targets: &Targets<String>) -> Result<(Targets<A::Id>, Vec<String>), StoreError> {
        Ok(match targets {
            Targets::Ids(texts) => {
                let mut keys = Vec::with_capacity(texts.len());
                let mut not_keys = Vec::new();
                for text in texts {
                    match A::Id::from_str(text) {
                        Ok(key) => keys.push(key),
                        Err(_) => not_keys.push(text.clone()),
                    }
                }
                (Targets::Ids(keys), not_keys)
            }
            Targets::Matching {
                filter,
                limit,
                after,
            } => (
                Targets::Matching {
                    filter: filter.clone(),
                    limit: *limit,
                    after: after.as_deref().map(Self::key).transpose()?,
                },
                Vec::new(),
            ),
            other => return Err(StoreError::Refused(format!("unknown targets {other:?}"))),
        })
    }
}

fn text<Id: ToString>(id: Id) -> String {
    id.to_string()
}

/// `report` with text keys, and the texts that were no key as missing.
fn report<Id: ToString>(report: ActionReport<Id>, not_keys: Vec<String>) -> ActionReport<String> {
    let mut skipped: Vec<Skipped<String>> =
        report.skipped.into_iter().map(|s| s.map_id(text)).collect();
    skipped.extend(not_keys.into_iter().map(Skipped::missing));
    ActionReport::new(report.changed, report.stop_requested, skipped).last(report.last.map(text))
}

#[async_trait]
impl<A> Admin for Erased<A>
where
    A: CliAdmin,
{
    type Id = String;

    fn stored_state(&self, state: JobState) -> String {
        self.0.stored_state(state)
    }

    fn retryable_states(&self) -> Vec<JobState> {
        self.0.retryable_states()
    }

    fn check_enqueue(&self, jobs: &[NewJob]) -> Result<(), StoreError> {
        self.0.check_enqueue(jobs)
    }

    async fn get(&self, id: &String) -> Result<Option<JobView<String>>, StoreError> {
        let Ok(key) = A::Id::from_str(id) else {
            return Ok(None);
        };
        Ok(self.0.get(&key).await?.map(|job| job.map_id(text)))
    }

    async fn list(&self, params: &ListParams<String>) -> Result<JobPage<String>, StoreError> {
        let after = match &params.after {
            Some(after) => Some(A::Id::from_str(after).map_err(|_| {
                StoreError::Refused(format!("after: {after:?} is not a key of this table"))
            })?),
            None => None,
        };
        let page = self.0.list(&params.clone().rekeyed(after)).await?;
        Ok(JobPage::new(
            page.jobs.into_iter().map(|job| job.map_id(text)).collect(),
            page.next.map(text),
        )
        .searched(page.searched))
    }

    async fn count(&self, filter: &JobFilter) -> Result<u64, StoreError> {
        self.0.count(filter).await
    }

    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        self.0.stats(params).await
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<String>>, StoreError> {
        Ok(self
            .0
            .enqueue(jobs)
            .await?
            .into_iter()
            .map(|e| Enqueued {
                id: text(e.id),
                inserted: e.inserted,
            })
            .collect())
    }

    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        self.0.finished_timeline(params).await
    }

    async fn retry(
        &self,
        targets: &Targets<String>,
        params: RetryParams,
    ) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = Self::targets(targets)?;
        Ok(report(self.0.retry(&targets, params).await?, not_keys))
    }

    async fn cancel(&self, targets: &Targets<String>) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = Self::targets(targets)?;
        Ok(report(self.0.cancel(&targets).await?, not_keys))
    }

    async fn force_fail(
        &self,
        targets: &Targets<String>,
        reason: &str,
    ) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = Self::targets(targets)?;
        Ok(report(self.0.force_fail(&targets, reason).await?, not_keys))
    }

    async fn delete(&self, targets: &Targets<String>) -> Result<ActionReport<String>, StoreError> {
        let (targets, not_keys) = Self::targets(targets)?;
        Ok(report(self.0.delete(&targets).await?, not_keys))
    }

    async fn reset(&self, params: ResetParams) -> Result<ResetReport<String>, StoreError> {
        let done = self.0.reset(params).await?;
        Ok(ResetReport {
            reset: done.reset.into_iter().map(text).collect(),
            failed: done.failed.into_iter().map(text).collect(),
        })
    }

    async fn purge(&self, params: &PurgeParams) -> Result<queue_core::PurgeReport, StoreError> {
        self.0.purge(params).await
    }

    async fn pause(&self, kind: &str, by: &str) -> Result<PausedKind, StoreError> {
        self.0.pause(kind, by).await
    }

    async fn resume(&self, kind: &str) -> Result<Option<PausedKind>, StoreError> {
        self.0.resume(kind).await
    }

    async fn paused(&self) -> Result<Vec<PausedKind>, StoreError> {
        self.0.paused().await
    }

    async fn set_limits(
        &self,
        kind: &str,
        limits: &queue_core::KindLimits,
        by: &str,
    ) -> Result<Option<queue_core::KindLimit>, StoreError> {
        self.0.set_limits(kind, limits, by).await
    }

    async fn limits(&self) -> Result<Vec<queue_core::KindLimit>, StoreError> {
        self.0.limits().await
    }

    async fn workers(
        &self,
        seen_since: DateTime<Utc>,
    ) -> Result<Vec<queue_core::WorkerInfo>, StoreError> {
        self.0.workers(seen_since).await
    }

    async fn append_audit(&self, entries: &[queue_core::NewAuditEntry]) -> Result<(), StoreError> {
        self.0.append_audit(entries).await
    }

    async fn audit(
        &self,
        params: &queue_core::AuditParams,
    ) -> Result<Vec<queue_core::AuditEntry>, StoreError> {
        self.0.audit(params).await
    }

    async fn create_operation(&self, new: &NewOperation) -> Result<Operation<String>, StoreError> {
        Ok(self.0.create_operation(new).await?.map_id(text))
    }

    async fn operation(&self, id: i64) -> Result<Option<Operation<String>>, StoreError> {
        Ok(self.0.operation(id).await?.map(|op| op.map_id(text)))
    }

    async fn operations(
        &self,
        params: &OperationParams,
    ) -> Result<Vec<Operation<String>>, StoreError> {
        Ok(self
            .0
            .operations(params)
            .await?
            .into_iter()
            .map(|op| op.map_id(text))
            .collect())
    }

    async fn take_operation(
        &self,
        take: &TakeOperation,
    ) -> Result<Option<Operation<String>>, StoreError> {
        Ok(self.0.take_operation(take).await?.map(|op| op.map_id(text)))
    }

    async fn step_operation(
        &self,
        step: &OperationStep<String>,
    ) -> Result<Option<Operation<String>>, StoreError> {
        let mut keyed = OperationStep::batch(
            step.id,
            step.runner.clone(),
            step.done,
            step.cursor.as_deref().map(Self::key).transpose()?,
        );
        if let Some(end) = step.end {
            keyed = keyed.ending(end, step.message.clone());
        }
        Ok(self
            .0
            .step_operation(&keyed)
            .await?
            .map(|op| op.map_id(text)))
    }

    async fn prune_operations(&self, older_than: std::time::Duration) -> Result<u64, StoreError> {
        self.0.prune_operations(older_than).await
    }

    async fn abort_operation(
        &self,
        id: i64,
        by: &str,
    ) -> Result<Option<queue_core::AbortOutcome<String>>, StoreError> {
        Ok(self
            .0
            .abort_operation(id, by)
            .await?
            .map(|op| op.map_id(text)))
    }
}
