//! Bulk operations by filter as tracked background work: a retry, cancel,
//! fail, delete or purge of every job matching a filter becomes an
//! [`Operation`] the store keeps (what, which filter, how many, how far,
//! who, when), and a runner ([`run_operation`]) carries it out in short
//! batches, recording its progress after each.
//!
//! Because the store keeps the operation, any process can follow it, abort
//! it ([`Admin::abort_operation`](crate::Admin::abort_operation)) or carry
//! it on: a runner that stops beating (its process killed) is taken for
//! dead after a while, and the next runner to look
//! ([`Admin::take_operation`](crate::Admin::take_operation)) resumes the
//! operation from its recorded position.
//!
//! ```
//! use queue_core::{JobFilter, JobState, NewOperation, OperationAction};
//! let retry_failed_emails = NewOperation::new(
//!     OperationAction::Retry { reset_attempts: false },
//!     JobFilter::default().states([JobState::Failed]).kinds(["email"]),
//!     "alice",
//!     12_000,
//! );
//! assert_eq!(retry_failed_emails.batch, queue_core::DEFAULT_OPERATION_BATCH);
//! ```

mod runner;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::admin::JobFilter;
use crate::error::StoreError;
use crate::job::JobState;

pub use runner::{run_operation, RunOptions, StopAs};

/// Jobs changed per batch unless the operation says otherwise (a purge's:
/// [`DEFAULT_PURGE_BATCH`]).
pub const DEFAULT_OPERATION_BATCH: u32 = 1000;

/// Jobs a purge deletes per batch unless it says otherwise. Finished jobs
/// hold no lock a claim waits for, so a bigger batch costs the workers no
/// more than a small one, and the purge's pauses come five times rarer:
/// beside a 16-handler lease drain, 1,000,000 old jobs were purged at
/// about 113,000 rows/s in batches of 5,000 against 54,000 in batches of
/// 1,000, with the claims' p99 no higher (7.0-11.4 ms against
/// 10.3-10.5 ms; `cargo xtask bench --only bulk`, docs/benchmarks.md).
pub const DEFAULT_PURGE_BATCH: u32 = 5000;

/// The most jobs one batch of an operation changes.
pub const MAX_OPERATION_BATCH: u32 = 10_000;

/// The most operations one read returns.
pub const MAX_OPERATION_PAGE: usize = 200;

/// The longest reason a force-fail operation takes, in bytes.
pub const MAX_REASON_LEN: usize = 10_000;

/// The pause a background runner (`queue serve`'s) leaves between an
/// operation's batches: room for the workers' claims. Measured by `cargo
/// xtask bench --only bulk`.
pub const BACKGROUND_PACE: Duration = Duration::from_millis(5);

/// The further pause a background runner leaves after each batch, as a
/// share of the time the batch took ([`RunOptions::yielding`]): as long
/// again, so that the operation keeps the database busy half the time at
/// most. Measured by `cargo xtask bench --only bulk`.
pub const BACKGROUND_YIELD: f64 = 1.0;

/// How long a running operation's runner may stay silent (no batch
/// recorded) before another runner takes it for dead and resumes it.
pub const OPERATION_SILENT_AFTER: Duration = Duration::from_secs(60);

/// What an operation does to each job it matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OperationAction {
    /// [`Admin::retry`](crate::Admin::retry): failed, errored and canceled
    /// jobs queued again.
    Retry {
        /// Also give each job its whole retry budget again.
        #[serde(default)]
        reset_attempts: bool,
    },
    /// [`Admin::cancel`](crate::Admin::cancel): waiting jobs canceled,
    /// running ones asked to stop.
    Cancel,
    /// [`Admin::force_fail`](crate::Admin::force_fail), with the
    /// operator's reason.
    Fail {
        /// Why: the failure message the jobs end with.
        reason: String,
    },
    /// [`Admin::delete`](crate::Admin::delete): jobs deleted, in any state.
    Delete,
    /// [`Admin::purge`](crate::Admin::purge): finished jobs removed (moved
    /// to the archive where the store keeps one). The filter names only
    /// final states and a finished-before time.
    Purge,
}

impl OperationAction {
    /// Jobs per batch unless the operation says otherwise:
    /// [`DEFAULT_PURGE_BATCH`] for a purge, else
    /// [`DEFAULT_OPERATION_BATCH`].
    pub fn default_batch(&self) -> u32 {
        match self {
            OperationAction::Purge => DEFAULT_PURGE_BATCH,
            _ => DEFAULT_OPERATION_BATCH,
        }
    }

    /// Its name: `retry`, `cancel`, `fail`, `delete` or `purge`.
    pub fn name(&self) -> &'static str {
        match self {
            OperationAction::Retry { .. } => "retry",
            OperationAction::Cancel => "cancel",
            OperationAction::Fail { .. } => "fail",
            OperationAction::Delete => "delete",
            OperationAction::Purge => "purge",
        }
    }

    /// What a job it changed has become: `retried`, `canceled`, ...
    pub fn done(&self) -> &'static str {
        match self {
            OperationAction::Retry { .. } => "retried",
            OperationAction::Cancel => "canceled",
            OperationAction::Fail { .. } => "failed",
            OperationAction::Delete => "deleted",
            OperationAction::Purge => "purged",
        }
    }

    /// The states it moves jobs out of, `retryable` being the store's
    /// [retryable states](crate::Admin::retryable_states); `None`: any.
    pub fn states(&self, retryable: &[JobState]) -> Option<Vec<JobState>> {
        match self {
            OperationAction::Retry { .. } => Some(retryable.to_vec()),
            OperationAction::Cancel | OperationAction::Fail { .. } => Some(vec![
                JobState::Queued,
                JobState::Errored,
                JobState::Processing,
            ]),
            OperationAction::Delete => None,
            OperationAction::Purge => Some(
                JobState::ALL
                    .into_iter()
                    .filter(|s| s.is_terminal())
                    .collect(),
            ),
        }
    }

    /// `filter` narrowed to the states this action moves jobs out of: the
    /// jobs it would change.
    pub fn narrow(&self, mut filter: JobFilter, retryable: &[JobState]) -> JobFilter {
        if let Some(states) = self.states(retryable) {
            filter.states = Some(match filter.states {
                Some(chosen) => chosen.into_iter().filter(|s| states.contains(s)).collect(),
                None => states,
            });
        }
        filter
    }

    /// Refuses what no store could carry out ([`StoreError::Refused`]): a
    /// force-fail without a reason, or one holding a NUL character.
    pub fn check(&self) -> Result<(), StoreError> {
        if let OperationAction::Fail { reason } = self {
            if reason.trim().is_empty() {
                return Err(StoreError::Refused(
                    "a force-fail must say why the jobs are failed".into(),
                ));
            }
            if reason.contains('\0') {
                return Err(StoreError::Refused(
                    "the reason holds a NUL character, which Postgres cannot store".into(),
                ));
            }
            if reason.len() > MAX_REASON_LEN {
                return Err(StoreError::Refused(format!(
                    "the reason is {} bytes long; the longest one taken is {MAX_REASON_LEN}",
                    reason.len()
                )));
            }
        }
        Ok(())
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OperationState {
    /// Recorded; no runner has it yet (started with `--detach`, from the
    /// API, or handed back by a runner that shut down).
    Pending,
    /// A runner is carrying it out.
    Running,
    /// Every matching job was dealt with (or the total reached).
    Done,
    /// An operator aborted it; the jobs already changed stay changed.
    Aborted,
    /// The process running it in the foreground was stopped (Ctrl-C); it
    /// can be resumed.
    Interrupted,
    /// An error no retry mends stopped it; its message says which.
    Failed,
}

impl OperationState {
    /// Every state.
    pub const ALL: [OperationState; 6] = [
        OperationState::Pending,
        OperationState::Running,
        OperationState::Done,
        OperationState::Aborted,
        OperationState::Interrupted,
        OperationState::Failed,
    ];

    /// Its name: `pending`, `running`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::Pending => "pending",
            OperationState::Running => "running",
            OperationState::Done => "done",
            OperationState::Aborted => "aborted",
            OperationState::Interrupted => "interrupted",
            OperationState::Failed => "failed",
        }
    }

    /// The state named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether it has ended for good: done, aborted or failed.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OperationState::Done | OperationState::Aborted | OperationState::Failed
        )
    }
}

impl std::fmt::Display for OperationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation to record ([`Admin::create_operation`](crate::Admin::create_operation)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NewOperation {
    /// What it does.
    pub action: OperationAction,
    /// To which jobs: those matching this filter, within the states the
    /// action moves jobs out of.
    pub filter: JobFilter,
    /// Who started it: an operator's name or a token's.
    pub by: String,
    /// How many jobs it changes at most: those that matched when it was
    /// started. Jobs that come to match later are left alone.
    pub total: u64,
    /// Jobs changed per batch (each batch one short transaction).
    pub batch: u32,
}

impl NewOperation {
    /// `action` on the jobs matching `filter`, started by `by`, who was
    /// told it changes `total` jobs.
    pub fn new(
        action: OperationAction,
        filter: JobFilter,
        by: impl Into<String>,
        total: u64,
    ) -> Self {
        NewOperation {
            filter,
            by: by.into(),
            total,
            batch: action.default_batch(),
            action,
        }
    }

    /// `batch` jobs per batch.
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch;
        self
    }

    /// Refuses an operation no store could carry out
    /// ([`StoreError::Refused`], naming the problem): a batch of 0 or over
    /// [`MAX_OPERATION_BATCH`], no one who started it, a bad action, or a
    /// purge whose filter names more than final states and a
    /// finished-before time.
    pub fn check(&self) -> Result<(), StoreError> {
        self.action.check()?;
        if self.batch == 0 || self.batch > MAX_OPERATION_BATCH {
            return Err(StoreError::Refused(format!(
                "a batch of {} jobs: choose between 1 and {MAX_OPERATION_BATCH}",
                self.batch
            )));
        }
        if self.by.trim().is_empty() || self.by.contains('\0') || self.by.len() > 1000 {
            return Err(StoreError::Refused(
                "an operation must say who started it (an operator or a token name, without NUL characters, at most 1000 bytes)".into(),
            ));
        }
        if self.action == OperationAction::Purge {
            purge_params(&self.filter, 1)?;
        }
        Ok(())
    }
}

/// The [`PurgeParams`](crate::PurgeParams) of a purge operation's
/// `filter`: refused unless it names final states, a finished-before time
/// and nothing else.
pub fn purge_params(filter: &JobFilter, limit: usize) -> Result<crate::PurgeParams, StoreError> {
    let (Some(states), Some(finished_before)) = (&filter.states, filter.finished_before) else {
        return Err(StoreError::Refused(
            "a purge needs the final states to purge and a finished-before time".into(),
        ));
    };
    if states.is_empty() {
        return Err(StoreError::Refused(
            "a purge needs the final states to purge: completed, failed or canceled".into(),
        ));
    }
    let bare = JobFilter::default()
        .states(states.iter().copied())
        .finished_before(finished_before);
    if &bare != filter {
        return Err(StoreError::Refused(
            "a purge takes final states and a finished-before time only; delete by filter to choose jobs otherwise".into(),
        ));
    }
    let params = crate::PurgeParams::new(states.clone(), finished_before, limit);
    params.filter()?;
    Ok(params)
}

/// An operation as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Operation<Id> {
    /// Its id: later operations have higher ones.
    pub id: i64,
    /// What it does.
    pub action: OperationAction,
    /// To which jobs.
    pub filter: JobFilter,
    /// Who started it.
    pub by: String,
    /// Where it stands.
    pub state: OperationState,
    /// How many jobs it changes at most.
    pub total: u64,
    /// How many it has changed (or, for a cancel, asked to stop).
    pub done: u64,
    /// Jobs per batch.
    pub batch: u32,
    /// The runner carrying it out, or that last did.
    pub runner: Option<String>,
    /// The highest key its batches have passed: the next batch starts
    /// after it. `None` before the first batch, or where the store keeps
    /// no position for the action.
    pub cursor: Option<Id>,
    /// Why it failed, was aborted or interrupted.
    pub message: Option<String>,
    /// When it was recorded, by the store's clock.
    pub created_at: DateTime<Utc>,
    /// When a runner first took it.
    pub started_at: Option<DateTime<Utc>>,
    /// When it last changed: its runner's last batch.
    pub updated_at: DateTime<Utc>,
    /// When it ended (done, aborted, failed).
    pub finished_at: Option<DateTime<Utc>>,
}

impl<Id> Operation<Id> {
    /// Operation `id`, as recorded from `new` at `at`: pending, nothing
    /// done yet.
    pub fn new(id: i64, new: NewOperation, at: DateTime<Utc>) -> Self {
        Operation {
            id,
            action: new.action,
            filter: new.filter,
            by: new.by,
            state: OperationState::Pending,
            total: new.total,
            done: 0,
            batch: new.batch,
            runner: None,
            cursor: None,
            message: None,
            created_at: at,
            started_at: None,
            updated_at: at,
            finished_at: None,
        }
    }

    /// The same operation with its cursor under another form of the key.
    pub fn map_id<T>(self, f: impl FnOnce(Id) -> T) -> Operation<T> {
        Operation {
            id: self.id,
            action: self.action,
            filter: self.filter,
            by: self.by,
            state: self.state,
            total: self.total,
            done: self.done,
            batch: self.batch,
            runner: self.runner,
            cursor: self.cursor.map(f),
            message: self.message,
            created_at: self.created_at,
            started_at: self.started_at,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
        }
    }

    /// `done` as a share of `total`, from 0 to 1 (1 for a total of 0).
    pub fn progress(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            (self.done as f64 / self.total as f64).min(1.0)
        }
    }
}

/// Which operations [`Admin::operations`](crate::Admin::operations) reads:
/// newest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OperationParams {
    /// At most this many (capped at [`MAX_OPERATION_PAGE`]).
    pub limit: usize,
    /// Only operations before this id: the page after one that ended with
    /// it.
    pub before: Option<i64>,
    /// Only operations in these states.
    pub states: Option<Vec<OperationState>>,
}

impl OperationParams {
    /// The newest `limit` operations.
    pub fn newest(limit: usize) -> Self {
        OperationParams {
            limit: limit.min(MAX_OPERATION_PAGE),
            before: None,
            states: None,
        }
    }

    /// Only operations before id `before`.
    pub fn before(mut self, before: Option<i64>) -> Self {
        self.before = before;
        self
    }

    /// Only operations in `states`.
    pub fn states(mut self, states: impl IntoIterator<Item = OperationState>) -> Self {
        self.states = Some(states.into_iter().collect());
        self
    }
}

/// What [`Admin::take_operation`](crate::Admin::take_operation) takes, for
/// whom.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TakeOperation {
    /// The runner taking it (a process name: host and pid).
    pub runner: String,
    /// Only this operation; it may also be interrupted (a resume).
    /// Otherwise the oldest one waiting.
    pub id: Option<i64>,
    /// A running operation whose runner recorded nothing for this long is
    /// taken for abandoned and may be taken.
    pub silent_for: Duration,
}

impl TakeOperation {
    /// The oldest operation waiting for a runner, for `runner`.
    pub fn next(runner: impl Into<String>) -> Self {
        TakeOperation {
            runner: runner.into(),
            id: None,
            silent_for: OPERATION_SILENT_AFTER,
        }
    }

    /// Operation `id` alone, for `runner`.
    pub fn id(runner: impl Into<String>, id: i64) -> Self {
        TakeOperation {
            id: Some(id),
            ..Self::next(runner)
        }
    }

    /// Runners silent for `silent_for` are taken for dead.
    pub fn silent_for(mut self, silent_for: Duration) -> Self {
        self.silent_for = silent_for;
        self
    }

    /// Whether `op`, `silent` for this long, may be taken.
    pub fn admits<Id>(&self, op: &Operation<Id>, silent: Duration) -> bool {
        if self.id.is_some_and(|id| id != op.id) {
            return false;
        }
        match op.state {
            OperationState::Pending => true,
            OperationState::Running => silent >= self.silent_for,
            OperationState::Interrupted => self.id.is_some(),
            _ => false,
        }
    }
}

/// What [`Admin::abort_operation`](crate::Admin::abort_operation) found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortOutcome<Id> {
    /// This call aborted it: the operation as it now stands.
    Aborted(Operation<Id>),
    /// It had already ended (done, aborted or failed): unchanged.
    Ended(Operation<Id>),
}

impl<Id> AbortOutcome<Id> {
    /// The operation, either way.
    pub fn operation(&self) -> &Operation<Id> {
        match self {
            AbortOutcome::Aborted(op) | AbortOutcome::Ended(op) => op,
        }
    }

    /// The same outcome with the operation's cursor under another form of
    /// the key.
    pub fn map_id<T>(self, f: impl FnOnce(Id) -> T) -> AbortOutcome<T> {
        match self {
            AbortOutcome::Aborted(op) => AbortOutcome::Aborted(op.map_id(f)),
            AbortOutcome::Ended(op) => AbortOutcome::Ended(op.map_id(f)),
        }
    }
}

/// A runner's record of one batch
/// ([`Admin::step_operation`](crate::Admin::step_operation)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationStep<Id> {
    /// Which operation.
    pub id: i64,
    /// The runner that holds it: the step applies only while it does.
    pub runner: String,
    /// Jobs the batch changed, added to the operation's count.
    pub done: u64,
    /// The operation's new position, if the batch moved it.
    pub cursor: Option<Id>,
    /// The state the operation ends in (or [`OperationState::Pending`]:
    /// handed back for another runner), if it ends now. Applies only while
    /// the operation is running: an abort that came first stands.
    pub end: Option<OperationState>,
    /// Why it ended, with `end`.
    pub message: Option<String>,
}

impl<Id> OperationStep<Id> {
    /// `runner` changed `done` more jobs of operation `id`, up to `cursor`.
    pub fn batch(id: i64, runner: impl Into<String>, done: u64, cursor: Option<Id>) -> Self {
        OperationStep {
            id,
            runner: runner.into(),
            done,
            cursor,
            end: None,
            message: None,
        }
    }

    /// The operation ends (or is handed back) in `state`, with `message`.
    pub fn ending(mut self, state: OperationState, message: Option<String>) -> Self {
        self.end = Some(state);
        self.message = message;
        self
    }

    /// Applies the step to `op` as every store does: `None` if `op` is no
    /// longer this runner's (taken over, or handed back) or has ended
    /// other than by an abort.
    pub fn apply(self, op: &mut Operation<Id>, now: DateTime<Utc>) -> Option<()> {
        let ours = op.runner.as_deref() == Some(self.runner.as_str());
        let live = matches!(op.state, OperationState::Running | OperationState::Aborted);
        if !ours || !live {
            return None;
        }
        op.done += self.done;
        if self.cursor.is_some() {
            op.cursor = self.cursor;
        }
        op.updated_at = now;
        if let (OperationState::Running, Some(end)) = (op.state, self.end) {
            op.state = end;
            op.message = self.message;
            if end.is_final() {
                op.finished_at = Some(now);
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> Operation<i64> {
        let new = NewOperation::new(OperationAction::Delete, JobFilter::default(), "alice", 10);
        let mut op = Operation::new(1, new, DateTime::UNIX_EPOCH);
        op.state = OperationState::Running;
        op.runner = Some("host:1".into());
        op
    }

    #[test]
    fn a_step_counts_only_for_the_runner_holding_the_operation() {
        let mut op = op();
        let now = DateTime::UNIX_EPOCH + chrono::TimeDelta::seconds(5);
        assert!(OperationStep::batch(1, "host:2", 3, Some(9))
            .apply(&mut op, now)
            .is_none());
        assert_eq!(op.done, 0);
        assert!(OperationStep::batch(1, "host:1", 3, Some(9))
            .apply(&mut op, now)
            .is_some());
        assert_eq!((op.done, op.cursor, op.updated_at), (3, Some(9), now));
    }

    #[test]
    fn an_abort_stands_against_the_runners_last_batch() {
        let mut op = op();
        op.state = OperationState::Aborted;
        let step = OperationStep::batch(1, "host:1", 4, None).ending(OperationState::Done, None);
        assert!(step.apply(&mut op, DateTime::UNIX_EPOCH).is_some());
        assert_eq!(op.state, OperationState::Aborted, "the abort stands");
        assert_eq!(op.done, 4, "the batch it ran is still counted");
    }

    #[test]
    fn a_purge_takes_final_states_and_a_time_only() {
        let at = DateTime::UNIX_EPOCH;
        let ok = JobFilter::default()
            .states([JobState::Completed])
            .finished_before(at);
        assert!(purge_params(&ok, 10).is_ok());
        for (filter, says) in [
            (JobFilter::default(), "needs the final states"),
            (ok.clone().kinds(["email"]), "delete by filter"),
            (
                JobFilter::default()
                    .states([JobState::Queued])
                    .finished_before(at),
                "only finished jobs",
            ),
        ] {
            let error = purge_params(&filter, 10).expect_err("refused").to_string();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn new_operations_are_checked_before_they_are_recorded() {
        let fail = |reason: &str| {
            NewOperation::new(
                OperationAction::Fail {
                    reason: reason.into(),
                },
                JobFilter::default(),
                "alice",
                1,
            )
        };
        assert!(fail("stuck").check().is_ok());
        for (new, says) in [
            (fail(" "), "must say why"),
            (fail("a\0b"), "NUL"),
            (fail("stuck").batch(0), "a batch of 0"),
            (
                NewOperation::new(OperationAction::Delete, JobFilter::default(), "", 1),
                "who started it",
            ),
        ] {
            let error = new.check().expect_err("refused").to_string();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn an_action_narrows_the_filter_to_the_states_it_moves() {
        let retry = OperationAction::Retry {
            reset_attempts: false,
        };
        let retryable = [JobState::Failed, JobState::Canceled];
        let narrowed = retry.narrow(
            JobFilter::default().states([JobState::Failed, JobState::Queued]),
            &retryable,
        );
        assert_eq!(narrowed.states, Some(vec![JobState::Failed]));
        let all = OperationAction::Delete.narrow(JobFilter::default(), &retryable);
        assert_eq!(all.states, None);
    }

    #[test]
    fn an_interrupted_operation_is_taken_only_by_name() {
        let mut op = op();
        op.state = OperationState::Interrupted;
        assert!(!TakeOperation::next("r").admits(&op, Duration::ZERO));
        assert!(TakeOperation::id("r", 1).admits(&op, Duration::ZERO));
        op.state = OperationState::Running;
        assert!(!TakeOperation::next("r").admits(&op, Duration::from_secs(1)));
        assert!(TakeOperation::next("r").admits(&op, OPERATION_SILENT_AFTER));
    }
}
