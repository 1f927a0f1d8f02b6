//! Carrying out an operation: batch after batch, each one short and
//! recorded, until no matching job is left, the total is reached, an
//! operator aborts it or the runner is stopped.

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::{purge_params, Operation, OperationAction, OperationState, OperationStep};
use crate::admin::{Admin, JobFilter, RetryParams, Targets};
use crate::error::StoreError;

/// How [`run_operation`] runs.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RunOptions {
    /// A pause after each batch, so that a large operation leaves the
    /// database to the workers' claims between its batches.
    pub pace: Duration,
    /// A further pause after each batch, as a share of the time the batch
    /// took: 1.0 leaves the database idle (of this operation) as long as it
    /// kept it busy, on any machine and table.
    pub yield_share: f64,
    /// What a stop makes of the operation.
    pub stop_as: StopAs,
    /// Whether the store keeps the operation: each batch is recorded
    /// there. Untracked, the operation lives in the runner alone (where
    /// the store has nowhere to keep it): nothing else can follow, abort
    /// or resume it.
    pub tracked: bool,
}

impl RunOptions {
    /// Batches `pace` apart; a stop leaves the operation `stop_as`.
    pub fn new(pace: Duration, stop_as: StopAs) -> Self {
        RunOptions {
            pace,
            yield_share: 0.0,
            stop_as,
            tracked: true,
        }
    }

    /// After each batch, also pause `share` of the time it took.
    pub fn yielding(mut self, share: f64) -> Self {
        self.yield_share = share.max(0.0);
        self
    }

    /// The operation kept by the runner alone, not recorded in the store.
    pub fn untracked(mut self) -> Self {
        self.tracked = false;
        self
    }
}

/// What a runner that is stopped leaves its operation as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopAs {
    /// [`OperationState::Interrupted`]: an operator stopped it (Ctrl-C in
    /// the CLI); it waits until someone resumes it by id.
    Interrupted,
    /// [`OperationState::Pending`]: its process is shutting down; the next
    /// runner to look carries it on.
    HandedBack,
}

/// The longest wait between tries while the store is unavailable.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Carries out `op`, which `runner` has
/// [taken](crate::Admin::take_operation), batch by batch from its cursor,
/// recording each batch ([`Admin::step_operation`]) and calling `progress`
/// with the operation as recorded. Returns the operation as it ended: done,
/// aborted (by an operator, seen after the batch under way), failed (an
/// error no retry mends, in its message), or, once `stop` is cancelled,
/// as `options.stop_as` says. While the store is unavailable it waits and
/// tries again. An error comes back only when a batch's record cannot be
/// written for a reason other than unavailability.
pub async fn run_operation<A>(
    admin: &A,
    mut op: Operation<A::Id>,
    runner: &str,
    stop: &CancellationToken,
    options: RunOptions,
    mut progress: impl FnMut(&Operation<A::Id>) + Send,
) -> Result<Operation<A::Id>, StoreError>
where
    A: Admin + ?Sized,
{
    let filter = op
        .action
        .narrow(op.filter.clone(), &admin.retryable_states());
    let mut failures = 0;
    let mut took = Duration::ZERO;
    // A purge's position (the latest finish time purged), kept for this
    // run: one resumed elsewhere starts again from the oldest job left.
    let mut purged_to = None;
    while op.state == OperationState::Running {
        let step = if stop.is_cancelled() {
            let (state, message) = match options.stop_as {
                StopAs::Interrupted => (
                    OperationState::Interrupted,
                    Some(format!(
                        "interrupted by its runner after {} of {}",
                        op.done, op.total
                    )),
                ),
                StopAs::HandedBack => (OperationState::Pending, None),
            };
            OperationStep::batch(op.id, runner, 0, None).ending(state, message)
        } else {
            let left = op.total.saturating_sub(op.done);
            let limit = usize::try_from(left.min(u64::from(op.batch))).unwrap_or(usize::MAX);
            let started = std::time::Instant::now();
            let ran = batch(admin, &op, &filter, limit, &mut purged_to).await;
            took = started.elapsed();
            match ran {
                Ok(Batch {
                    moved,
                    cursor,
                    found_none,
                }) => {
                    failures = 0;
                    let step = OperationStep::batch(op.id, runner, moved, cursor);
                    // Only a batch that found nothing ends it before the
                    // total: a retry's batch comes back short while more
                    // jobs match when two of them share a unique key, and
                    // a purge's when another took some of its jobs first.
                    if found_none || op.done + moved >= op.total {
                        step.ending(OperationState::Done, None)
                    } else {
                        step
                    }
                }
                Err(error) if transient(&error) => {
                    failures += 1;
                    wait(stop, backoff(failures)).await;
                    continue;
                }
                Err(error) => OperationStep::batch(op.id, runner, 0, None)
                    .ending(OperationState::Failed, Some(error.to_string())),
            }
        };
        let paced = step.end.is_none();
        op = if options.tracked {
            record(admin, &op, step).await?
        } else {
            let mut kept = op.clone();
            step.apply(&mut kept, Utc::now());
            kept
        };
        progress(&op);
        let pause = options.pace + took.mul_f64(options.yield_share);
        if paced && !pause.is_zero() {
            wait(stop, pause).await;
        }
    }
    Ok(op)
}

/// What one batch did.
struct Batch<K> {
    /// How many jobs it changed.
    moved: u64,
    /// The position after it, where the store reports one.
    cursor: Option<K>,
    /// Whether it found no job left to change.
    found_none: bool,
}

/// One batch of `op` over the jobs matching `filter` (the operation's,
/// narrowed to the states its action moves), a purge's position kept in
/// `purged_to`.
async fn batch<A>(
    admin: &A,
    op: &Operation<A::Id>,
    filter: &JobFilter,
    limit: usize,
    purged_to: &mut Option<chrono::DateTime<Utc>>,
) -> Result<Batch<A::Id>, StoreError>
where
    A: Admin + ?Sized,
{
    let targets = Targets::Matching {
        filter: filter.clone(),
        limit,
        after: op.cursor.clone(),
    };
    let report = match &op.action {
        OperationAction::Retry { reset_attempts } => {
            let params = RetryParams {
                reset_attempts: *reset_attempts,
            };
            admin.retry(&targets, params).await?
        }
        OperationAction::Cancel => admin.cancel(&targets).await?,
        OperationAction::Fail { reason } => admin.force_fail(&targets, reason).await?,
        OperationAction::Delete => admin.delete(&targets).await?,
        OperationAction::Purge => {
            let params = purge_params(filter, limit)?.from(*purged_to);
            let purged = admin.purge(&params).await?;
            *purged_to = purged.last_finished.or(*purged_to);
            return Ok(Batch {
                moved: purged.purged,
                cursor: None,
                found_none: purged.found == 0,
            });
        }
    };
    let moved = report.changed + report.stop_requested;
    Ok(Batch {
        moved,
        cursor: report.last,
        found_none: moved == 0,
    })
}

/// Records `step`, trying again while the store is unavailable (the batch
/// it counts is done: its count must not be lost). Returns the operation
/// as recorded; if it is no longer `runner`'s (another runner took it over
/// while this one was silent), as the store has it, with nothing recorded.
async fn record<A>(
    admin: &A,
    op: &Operation<A::Id>,
    step: OperationStep<A::Id>,
) -> Result<Operation<A::Id>, StoreError>
where
    A: Admin + ?Sized,
{
    let mut failures = 0;
    loop {
        match admin.step_operation(&step).await {
            Ok(Some(recorded)) => return Ok(recorded),
            Ok(None) => {
                return match admin.operation(op.id).await? {
                    Some(now) => Ok(now),
                    None => Err(StoreError::Refused(format!(
                        "operation {} was removed while it ran",
                        op.id
                    ))),
                }
            }
            Err(error) if transient(&error) && failures < 60 => {
                failures += 1;
                // A stop does not cut this wait short: the count matters
                // more than a prompt exit.
                tokio::time::sleep(backoff(failures)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Whether trying again later may mend `error`.
fn transient(error: &StoreError) -> bool {
    error.is_retryable() || matches!(error, StoreError::TimedOut { .. })
}

/// 0.5 s, doubling with each failure in a row, up to [`MAX_BACKOFF`].
fn backoff(failures: u32) -> Duration {
    let doubled = Duration::from_millis(500).saturating_mul(1 << failures.min(6));
    doubled.min(MAX_BACKOFF)
}

/// Sleeps for `wait`, or until `stop`.
async fn wait(stop: &CancellationToken, wait: Duration) {
    // Ends early when stopped; the timeout's error is the whole wait.
    let _ = tokio::time::timeout(wait, stop.cancelled()).await;
}
