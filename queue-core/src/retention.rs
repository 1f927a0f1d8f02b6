//! Retention: how long finished jobs are kept, and the pass that removes
//! the older ones.
//!
//! [`prune`] is how the worker's periodic pruner (`queue_worker::Pruner`)
//! removes finished jobs. It goes state by state, in batches of
//! [`Retention::batch`] jobs through [`Admin::purge`], pausing after each
//! as a background operation does ([`Retention::pause`] and as long again
//! as the batch took), so that a backlog of a million old rows is removed
//! in short statements that leave room for the queue's own work. Several
//! processes may prune at once: a batch only ever takes jobs that are
//! finished and old enough, and one a concurrent pass removed first is
//! simply not counted twice.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::admin::{Admin, PurgeParams};
use crate::error::StoreError;
use crate::job::JobState;
use crate::operations::{BACKGROUND_PACE, BACKGROUND_YIELD, DEFAULT_PURGE_BATCH};

/// How long jobs are kept once finished, per final state; `None` keeps
/// them forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Completed jobs are removed this long after they finished.
    pub completed: Option<Duration>,
    /// Failed jobs likewise.
    pub failed: Option<Duration>,
    /// Canceled jobs likewise.
    pub canceled: Option<Duration>,
    /// Jobs removed per statement. Default [`DEFAULT_PURGE_BATCH`], as a
    /// purge operation's.
    pub batch: usize,
    /// The pause after each batch of one pass, before the next; the pass
    /// also waits as long again as the batch took
    /// ([`BACKGROUND_YIELD`]), so that it keeps the database busy half the
    /// time at most on any machine, as a background operation does.
    /// Default [`BACKGROUND_PACE`].
    pub pause: Duration,
}

impl Default for Retention {
    /// Keeps everything (no age set), in batches of [`DEFAULT_PURGE_BATCH`]
    /// paced as a background operation.
    fn default() -> Self {
        Retention {
            completed: None,
            failed: None,
            canceled: None,
            batch: DEFAULT_PURGE_BATCH as usize,
            pause: BACKGROUND_PACE,
        }
    }
}

impl Retention {
    /// Every finished state kept for `age`.
    pub fn all(age: Duration) -> Self {
        Retention {
            completed: Some(age),
            failed: Some(age),
            canceled: Some(age),
            ..Retention::default()
        }
    }

    /// How long jobs in `state` are kept, if they are removed at all.
    pub fn age(&self, state: JobState) -> Option<Duration> {
        match state {
            JobState::Completed => self.completed,
            JobState::Failed => self.failed,
            JobState::Canceled => self.canceled,
            _ => None,
        }
    }

    /// Checks the settings: a batch of at least one job.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.batch == 0 {
            return Err(StoreError::Config(
                "retention batch must be at least 1 job".into(),
            ));
        }
        Ok(())
    }
}

/// The states a finished job ends in, in the order [`prune`] visits them.
const FINAL_STATES: [JobState; 3] = [JobState::Completed, JobState::Failed, JobState::Canceled];

/// What one [`prune`] pass removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Jobs removed, per state.
    pub removed: Vec<(JobState, u64)>,
    /// Statements run.
    pub batches: u64,
}

impl PruneReport {
    /// Jobs removed in all states.
    pub fn total(&self) -> u64 {
        self.removed.iter().map(|(_, n)| n).sum()
    }
}

/// Removes the finished jobs `retention` no longer keeps at `now`: for each
/// state with an age, batches of jobs that finished before `now - age`,
/// until a batch finds fewer than [`Retention::batch`]. `on_batch` hears
/// of each batch (its state and how many it removed), for progress and
/// metrics. Stops at the first error; what was removed before it stays
/// removed.
pub async fn prune<A: Admin + ?Sized>(
    admin: &A,
    retention: &Retention,
    now: DateTime<Utc>,
    mut on_batch: impl FnMut(JobState, u64),
) -> Result<PruneReport, StoreError> {
    retention.validate()?;
    let mut report = PruneReport::default();
    for state in FINAL_STATES {
        let Some(age) = retention.age(state) else {
            continue;
        };
        let finished_before = chrono::Duration::from_std(age)
            .ok()
            .and_then(|age| now.checked_sub_signed(age));
        // An age reaching back before any time a clock can tell: none is
        // that old.
        let Some(finished_before) = finished_before else {
            report.removed.push((state, 0));
            continue;
        };
        let mut params = PurgeParams::new(vec![state], finished_before, retention.batch);
        let mut removed = 0;
        let mut took = Duration::ZERO;
        loop {
            if report.batches > 0 {
                let pause = retention.pause + took.mul_f64(BACKGROUND_YIELD);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            let started = std::time::Instant::now();
            let purged = admin.purge(&params).await?;
            took = started.elapsed();
            let n = purged.purged;
            report.batches += 1;
            removed += n;
            on_batch(state, n);
            // A batch may remove fewer than it found (another pruner took
            // some first): only one that found fewer is the last.
            if purged.found < retention.batch as u64 {
                break;
            }
            // On from the last batch's latest finish time, where the store
            // gives one: the oldest jobs are gone.
            params.finished_from = purged.last_finished.or(params.finished_from);
        }
        report.removed.push((state, removed));
    }
    Ok(report)
}
