//! [`Scheduler`]: periodic jobs, from cron expressions or fixed intervals.
//!
//! Each [`Schedule`] names a job to enqueue at each of its occurrences. An
//! occurrence is enqueued with the unique key
//! `schedule:<name>:<occurrence, RFC 3339 UTC>` held for as long as the job
//! exists ([`UniqueScope::Forever`]): however many processes run the same
//! schedules, each occurrence becomes exactly one job, and the job carries
//! its schedule's name and time in that key. Every process enqueues every
//! occurrence (the store keeps the first), so there is no leader to lose: a
//! process that dies takes nothing with it, and the others go on.
//!
//! While a scheduler ticks on time, it enqueues each occurrence as it comes
//! due. What it does with occurrences it missed is each schedule's
//! [`CatchUp`] (skip them, or run the latest of them once): those that fell
//! before it started, and those of every gap after. A gap is a tick that
//! finds more than one occurrence of a schedule due, the earliest of them
//! late by more than [`SchedulerOptions::gap_after`] (10 s by default): the
//! scheduler was kept from ticking (the database was away and each enqueue
//! failed, or the process stalled). A 1 s schedule after an hour's outage is
//! then one enqueue or none, never 3,600; a tick a few seconds late still
//! enqueues each occurrence it passed.
//!
//! Cron expressions are croner's (five fields, or six with seconds first;
//! `@daily` and friends), evaluated in the time zone given: any
//! [`chrono::TimeZone`], such as `chrono::Utc` or a `chrono_tz::Tz`. Across
//! a daylight saving change, a time that does not exist that day runs at
//! the first instant after the gap, and a time that happens twice runs
//! once.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use queue_core::{Admin, CancellationToken, Clock, NewJob, StoreError, SystemClock, UniqueScope};

use crate::error::WorkerError;

/// What a schedule does about occurrences it missed: those that fell
/// before its scheduler started, or during a gap (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CatchUp {
    /// Skips them: the next job is the first occurrence after start-up or
    /// after the gap.
    #[default]
    Skip,
    /// Runs once for all of them: the latest occurrence missed is enqueued
    /// at once (unless a job holds it already, having run on time).
    Once,
}

/// The instants a schedule's occurrences fall on.
type NextAfter = dyn Fn(DateTime<Utc>) -> Option<DateTime<Utc>> + Send + Sync;

/// A periodic job: when it occurs, and the job each occurrence enqueues.
#[derive(Clone)]
pub struct Schedule {
    name: String,
    /// The next occurrence strictly after an instant.
    next_after: Arc<NextAfter>,
    /// The latest occurrence at or before an instant.
    latest_by: Arc<NextAfter>,
    job: NewJob,
    catch_up: CatchUp,
    describe: String,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("when", &self.describe)
            .field("kind", &self.job.kind)
            .field("catch_up", &self.catch_up)
            .finish()
    }
}

impl Schedule {
    /// Enqueues `job` at each time the cron expression `expression`
    /// matches in `zone`. Refused (with croner's reason) if the expression
    /// does not parse.
    ///
    /// ```
    /// use queue_core::NewJob;
    /// use queue_worker::Schedule;
    ///
    /// // Every day at 03:00 in UTC (with chrono-tz: any IANA zone).
    /// let nightly = Schedule::cron("nightly-report", "0 3 * * *", chrono::Utc, NewJob::new("report", serde_json::json!({})))?;
    /// assert!(Schedule::cron("typo", "0 25 * * *", chrono::Utc, NewJob::new("x", serde_json::json!(null))).is_err());
    /// # Ok::<(), queue_worker::WorkerError>(())
    /// ```
    pub fn cron<Z>(
        name: &str,
        expression: &str,
        zone: Z,
        job: NewJob,
    ) -> Result<Schedule, WorkerError>
    where
        Z: TimeZone + Send + Sync + 'static,
        Z::Offset: Send + Sync,
    {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|e| {
                WorkerError::InvalidOptions(format!(
                    "schedule {name:?}: cron expression {expression:?} does not parse: {e}"
                ))
            })?;
        let (cron, zone) = (Arc::new(cron), Arc::new(zone));
        let (next_cron, next_zone) = (cron.clone(), zone.clone());
        let next_after = move |at: DateTime<Utc>| {
            next_cron
                .find_next_occurrence(&at.with_timezone(&*next_zone), false)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        };
        let latest_by = move |at: DateTime<Utc>| {
            cron.find_previous_occurrence(&at.with_timezone(&*zone), true)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        };
        Schedule::new(
            name,
            Arc::new(next_after),
            Arc::new(latest_by),
            job,
            expression,
        )
    }

    /// Enqueues `job` every `period`, at whole multiples of it since the
    /// Unix epoch (so every process agrees on the instants): every minute on
    /// the minute, every second on the second. Refused for a period under a
    /// millisecond.
    pub fn every(name: &str, period: Duration, job: NewJob) -> Result<Schedule, WorkerError> {
        let millis = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
        if millis < 1 {
            return Err(WorkerError::InvalidOptions(format!(
                "schedule {name:?}: a period must be at least a millisecond"
            )));
        }
        let latest_by = move |at: DateTime<Utc>| {
            let n = at.timestamp_millis().div_euclid(millis);
            DateTime::<Utc>::from_timestamp_millis(n.checked_mul(millis)?)
        };
        let next_after = move |at: DateTime<Utc>| {
            let n = at.timestamp_millis().div_euclid(millis).checked_add(1)?;
            DateTime::<Utc>::from_timestamp_millis(n.checked_mul(millis)?)
        };
        Schedule::new(
            name,
            Arc::new(next_after),
            Arc::new(latest_by),
            job,
            &format!("every {period:?}"),
        )
    }

    fn new(
        name: &str,
        next_after: Arc<NextAfter>,
        latest_by: Arc<NextAfter>,
        job: NewJob,
        describe: &str,
    ) -> Result<Schedule, WorkerError> {
        if name.is_empty() || name.contains(':') {
            return Err(WorkerError::InvalidOptions(format!(
                "schedule name {name:?} must be non-empty and free of ':' (it is part of each job's unique key)"
            )));
        }
        if job.unique.is_some() {
            return Err(WorkerError::InvalidOptions(format!(
                "schedule {name:?}: its job must not carry a unique key of its own; each occurrence gets one"
            )));
        }
        Ok(Schedule {
            name: name.to_owned(),
            next_after,
            latest_by,
            job,
            catch_up: CatchUp::default(),
            describe: describe.to_owned(),
        })
    }

    /// What to do at start-up about occurrences missed while no scheduler
    /// ran (default: [`CatchUp::Skip`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next occurrence strictly after `at`.
    pub fn next_after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        (self.next_after)(at)
    }

    /// The latest occurrence at or before `at`.
    pub fn latest_by(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        (self.latest_by)(at)
    }

    /// When it occurs, as given: the cron expression, or `every ..`.
    pub fn when(&self) -> &str {
        &self.describe
    }

    /// The kind of the jobs it enqueues.
    pub fn kind(&self) -> &str {
        &self.job.kind
    }

    /// The unique key of the occurrence at `at`.
    pub fn occurrence_key(&self, at: DateTime<Utc>) -> String {
        format!(
            "schedule:{}:{}",
            self.name,
            at.to_rfc3339_opts(SecondsFormat::Millis, true)
        )
    }
}

/// One occurrence a [`Scheduler::tick`] handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    /// The schedule's name.
    pub schedule: String,
    /// When it fell.
    pub at: DateTime<Utc>,
    /// Whether this scheduler's enqueue added the job (`false`: another
    /// process had, and the store kept that one).
    pub inserted: bool,
}

/// How a [`Scheduler`] runs.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// The clock occurrences are judged by.
    pub clock: Arc<dyn Clock>,
    /// The longest the scheduler sleeps before looking at the clock again
    /// (it sleeps until the next occurrence when that is sooner). Default
    /// 1 s.
    pub max_sleep: Duration,
    /// How late the earliest of several due occurrences must be for a tick
    /// to treat them as missed in a gap, and apply each schedule's
    /// [`CatchUp`] to them, instead of enqueueing each. Default 10 s.
    pub gap_after: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            clock: Arc::new(SystemClock),
            max_sleep: Duration::from_secs(1),
            gap_after: Duration::from_secs(10),
        }
    }
}

/// Enqueues the occurrences of its [`Schedule`]s as they come due, through
/// any store's [`Admin::enqueue`]. Run one in every worker process if you
/// like: each occurrence still becomes one job.
pub struct Scheduler<A: Admin + ?Sized> {
    admin: Arc<A>,
    schedules: Vec<Schedule>,
    /// Each schedule's next occurrence to enqueue; set at the first tick.
    due: Vec<Option<DateTime<Utc>>>,
    started: bool,
    options: SchedulerOptions,
}

impl<A: Admin + ?Sized> Scheduler<A> {
    /// A scheduler over `admin`; refused if two schedules share a name, an
    /// option is out of range, or the store could not take a schedule's
    /// jobs (a table without a unique key column, or without a way to keep
    /// a key for as long as its job exists: [`Admin::check_enqueue`]), which
    /// would otherwise stop the scheduler at its first occurrence.
    pub fn new(
        admin: impl Into<Arc<A>>,
        schedules: Vec<Schedule>,
        options: SchedulerOptions,
    ) -> Result<Self, WorkerError> {
        for (i, schedule) in schedules.iter().enumerate() {
            if schedules[..i].iter().any(|s| s.name == schedule.name) {
                return Err(WorkerError::InvalidOptions(format!(
                    "two schedules are named {:?}; each needs its own name (it keys their jobs)",
                    schedule.name
                )));
            }
        }
        let admin = admin.into();
        for schedule in &schedules {
            // Any occurrence's job is the same but for its time.
            let example = schedule.job.clone().unique(
                schedule.occurrence_key(DateTime::<Utc>::UNIX_EPOCH),
                UniqueScope::Forever,
            );
            admin
                .check_enqueue(std::slice::from_ref(&example))
                .map_err(|e| {
                    WorkerError::InvalidOptions(format!(
                        "schedule {:?} cannot enqueue its jobs here: {e}",
                        schedule.name
                    ))
                })?;
        }
        if options.max_sleep.is_zero() {
            return Err(WorkerError::InvalidOptions(
                "scheduler max_sleep must be longer than zero".into(),
            ));
        }
        let due = vec![None; schedules.len()];
        Ok(Scheduler {
            admin,
            schedules,
            due,
            started: false,
            options,
        })
    }

    /// Enqueues the occurrence due at `now` that this scheduler has not
    /// enqueued yet, per schedule. The first call decides, per schedule's
    /// [`CatchUp`], what happens to occurrences before it; a later call that
    /// finds more than one occurrence due (a gap) decides the same way. An
    /// enqueue that fails leaves its occurrence due for the next tick.
    pub async fn tick(&mut self, now: DateTime<Utc>) -> Result<Vec<Occurrence>, StoreError> {
        if !self.started {
            for (schedule, due) in self.schedules.iter().zip(&mut self.due) {
                *due = match schedule.catch_up {
                    CatchUp::Skip => schedule.next_after(now),
                    CatchUp::Once => (schedule.latest_by)(now).or_else(|| schedule.next_after(now)),
                };
            }
            self.started = true;
        }
        let mut handled = Vec::new();
        let gap_after =
            chrono::TimeDelta::from_std(self.options.gap_after).unwrap_or(chrono::TimeDelta::MAX);
        for (schedule, due) in self.schedules.iter().zip(&mut self.due) {
            // A gap: the occurrence due is not the latest one by now, and
            // it is late by more than a stalled tick would be.
            let gap = due.is_some_and(|at| {
                at <= now
                    && now - at > gap_after
                    && schedule.next_after(at).is_some_and(|next| next <= now)
            });
            if let (true, Some(missed_from)) = (gap, *due) {
                *due = match schedule.catch_up {
                    CatchUp::Skip => schedule.next_after(now),
                    CatchUp::Once => (schedule.latest_by)(now),
                };
                tracing::info!(
                    schedule = %schedule.name,
                    %missed_from,
                    catch_up = ?schedule.catch_up,
                    "occurrences were missed (the scheduler could not tick); catching up per the schedule"
                );
            }
            while let Some(at) = due.filter(|at| *at <= now) {
                let job = schedule
                    .job
                    .clone()
                    .unique(schedule.occurrence_key(at), UniqueScope::Forever);
                let enqueued = self.admin.enqueue(std::slice::from_ref(&job)).await?;
                let inserted = enqueued.first().is_some_and(|e| e.inserted);
                tracing::debug!(schedule = %schedule.name, %at, inserted, "occurrence enqueued");
                handled.push(Occurrence {
                    schedule: schedule.name.clone(),
                    at,
                    inserted,
                });
                *due = schedule.next_after(at);
            }
        }
        Ok(handled)
    }

    /// The earliest occurrence still to enqueue.
    fn next_due(&self) -> Option<DateTime<Utc>> {
        self.due.iter().flatten().min().copied()
    }

    /// Ticks as occurrences come due until `shutdown` is cancelled.
    /// Transient store errors are logged and the occurrence tried again; a
    /// permanent one stops it.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        loop {
            let now = self.options.clock.now();
            match self.tick(now).await {
                Ok(_) => {}
                Err(error) if error.is_retryable() => {
                    tracing::warn!(error = %error.chain(), "enqueueing a scheduled job failed; trying again");
                }
                Err(error) => return Err(WorkerError::Store(error)),
            }
            let until_due = self
                .next_due()
                .and_then(|at| (at - self.options.clock.now()).to_std().ok())
                .unwrap_or(self.options.max_sleep);
            tokio::select! {
                _ = tokio::time::sleep(until_due.min(self.options.max_sleep)) => {}
                _ = shutdown.cancelled() => return Ok(()),
            }
        }
    }
}
