//! Periodic jobs on the memory store with a manual clock: occurrences of
//! intervals and cron expressions, time zones and daylight saving changes,
//! what start-up does about missed occurrences, and two schedulers (as two
//! processes would) making one job per occurrence.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::{America::New_York, Europe::Berlin};
use queue_core::{Admin, Clock, JobFilter, NewJob};
use queue_store_memory::{ManualClock, MemoryStore};
use queue_worker::{CatchUp, Schedule, Scheduler, SchedulerOptions};

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .expect("an RFC 3339 time")
        .with_timezone(&Utc)
}

fn job() -> NewJob {
    NewJob::new("periodic", serde_json::json!({}))
}

fn scheduler(
    store: &MemoryStore,
    clock: &ManualClock,
    schedules: Vec<Schedule>,
) -> Scheduler<MemoryStore> {
    Scheduler::new(
        store.clone(),
        schedules,
        SchedulerOptions {
            clock: Arc::new(clock.clone()),
            ..SchedulerOptions::default()
        },
    )
    .expect("valid schedules")
}

/// The unique keys of every job in the store, sorted.
async fn keys(store: &MemoryStore) -> Vec<String> {
    let page = store
        .list(&queue_core::ListParams::first(JobFilter::default(), 1000))
        .await
        .expect("a list");
    let mut keys: Vec<String> = page.jobs.into_iter().filter_map(|j| j.unique_key).collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn every_occurrence_becomes_one_job_however_many_schedulers_run_it() {
    let start = utc("2026-11-24T10:00:00.500Z");
    let clock = ManualClock::new(start);
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let every = || Schedule::every("tick", Duration::from_secs(1), job()).expect("a schedule");
    let mut first = scheduler(&store, &clock, vec![every()]);
    let mut second = scheduler(&store, &clock, vec![every()]);
    assert!(
        first.tick(start).await.unwrap().is_empty(),
        "nothing due yet"
    );
    assert!(second.tick(start).await.unwrap().is_empty());
    // A tick three seconds late (within the gap allowance) enqueues each
    // occurrence it passed.
    clock.advance(Duration::from_secs(3));
    let handled = first.tick(clock.now()).await.unwrap();
    let again = second.tick(clock.now()).await.unwrap();
    assert_eq!(
        handled
            .iter()
            .map(|o| (o.at, o.inserted))
            .collect::<Vec<_>>(),
        [
            (utc("2026-11-24T10:00:01Z"), true),
            (utc("2026-11-24T10:00:02Z"), true),
            (utc("2026-11-24T10:00:03Z"), true),
        ],
        "on the second, in order"
    );
    assert_eq!(again.len(), 3);
    assert!(
        again.iter().all(|o| !o.inserted),
        "the store kept the first's jobs"
    );
    assert!(
        first.tick(clock.now()).await.unwrap().is_empty(),
        "nothing twice"
    );
    assert_eq!(
        keys(&store).await,
        [
            "schedule:tick:2026-11-24T10:00:01.000Z",
            "schedule:tick:2026-11-24T10:00:02.000Z",
            "schedule:tick:2026-11-24T10:00:03.000Z",
        ],
        "each job carries its schedule's name and time"
    );
}

#[test]
fn cron_occurrences_follow_the_zones_local_time_across_daylight_saving_changes() {
    let nine = Schedule::cron("nine", "0 9 * * *", New_York, job()).unwrap();
    // New York: EST (UTC-5) until 8 March 2026, EDT (UTC-4) after.
    assert_eq!(
        nine.next_after(utc("2026-03-06T15:00:00Z")),
        Some(utc("2026-03-07T14:00:00Z"))
    );
    assert_eq!(
        nine.next_after(utc("2026-03-07T15:00:00Z")),
        Some(utc("2026-03-08T13:00:00Z"))
    );

    // Berlin springs forward at 02:00 on 29 March 2026: 02:30 does not
    // exist that day and runs at the first instant after the gap.
    let half_past_two = Schedule::cron("night", "30 2 * * *", Berlin, job()).unwrap();
    let gap_day = half_past_two
        .next_after(utc("2026-03-28T12:00:00Z"))
        .unwrap();
    assert_eq!(
        gap_day.with_timezone(&Berlin),
        Berlin.with_ymd_and_hms(2026, 3, 29, 3, 0, 0).unwrap(),
        "{gap_day}"
    );
    assert_eq!(
        half_past_two.next_after(gap_day),
        Some(utc("2026-03-30T00:30:00Z")),
        "and on the next day at 02:30 CEST again"
    );
    // It falls back at 03:00 on 25 October 2026: 02:30 happens twice, and
    // runs once.
    let first = half_past_two
        .next_after(utc("2026-10-24T12:00:00Z"))
        .unwrap();
    assert_eq!(first, utc("2026-10-25T00:30:00Z"), "02:30 CEST");
    assert_eq!(
        half_past_two.next_after(first),
        Some(utc("2026-10-26T01:30:00Z")),
        "not again at 02:30 CET"
    );

    // Six fields: seconds first.
    let every_ten = Schedule::cron("ten", "*/10 * * * * *", Utc, job()).unwrap();
    assert_eq!(
        every_ten.next_after(utc("2026-11-24T10:00:03Z")),
        Some(utc("2026-11-24T10:00:10Z"))
    );
}

#[tokio::test]
async fn after_downtime_a_schedule_skips_what_it_missed_or_runs_it_once() {
    let clock = ManualClock::new(utc("2026-11-20T02:59:59Z"));
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let daily = |catch_up| {
        Schedule::cron("daily", "0 3 * * *", Utc, job())
            .unwrap()
            .catch_up(catch_up)
    };
    // A scheduler runs through 03:00 on the 20th, then every process stops.
    let mut before = scheduler(&store, &clock, vec![daily(CatchUp::Skip)]);
    before.tick(clock.now()).await.unwrap();
    clock.set(utc("2026-11-20T03:00:00Z"));
    assert_eq!(before.tick(clock.now()).await.unwrap().len(), 1);
    drop(before);

    // Back at 05:00 on the 22nd: the 21st and the 22nd were missed.
    clock.set(utc("2026-11-22T05:00:00Z"));
    let mut skipping = scheduler(&store, &clock, vec![daily(CatchUp::Skip)]);
    assert!(
        skipping.tick(clock.now()).await.unwrap().is_empty(),
        "skipped"
    );
    let mut once = scheduler(&store, &clock, vec![daily(CatchUp::Once)]);
    let caught_up = once.tick(clock.now()).await.unwrap();
    assert_eq!(
        caught_up
            .iter()
            .map(|o| (o.at, o.inserted))
            .collect::<Vec<_>>(),
        [(utc("2026-11-22T03:00:00Z"), true)],
        "one job for both missed days"
    );
    // A restart right after an occurrence that ran on time adds nothing.
    let mut restarted = scheduler(&store, &clock, vec![daily(CatchUp::Once)]);
    let again = restarted.tick(clock.now()).await.unwrap();
    assert!(again.iter().all(|o| !o.inserted), "{again:?}");
    assert_eq!(
        keys(&store).await,
        [
            "schedule:daily:2026-11-20T03:00:00.000Z",
            "schedule:daily:2026-11-22T03:00:00.000Z",
        ]
    );
    // Both go on from there.
    clock.set(utc("2026-11-23T03:00:00Z"));
    assert_eq!(skipping.tick(clock.now()).await.unwrap().len(), 1);
    assert_eq!(once.tick(clock.now()).await.unwrap().len(), 1);
    assert_eq!(keys(&store).await.len(), 3);
}

/// A gap while running (an hour without a tick, as when every enqueue
/// failed through a database outage) is caught up like a start-up: a 1 s
/// schedule skips the 3,600 occurrences it missed, or runs the latest once.
#[tokio::test]
async fn after_a_gap_while_running_a_schedule_catches_up_per_its_policy() {
    let start = utc("2026-11-24T10:00:00.500Z");
    let clock = ManualClock::new(start);
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let every = |name: &str, catch_up| {
        Schedule::every(name, Duration::from_secs(1), job())
            .unwrap()
            .catch_up(catch_up)
    };
    let mut scheduler = scheduler(
        &store,
        &clock,
        vec![every("skip", CatchUp::Skip), every("once", CatchUp::Once)],
    );
    assert_eq!(
        scheduler.tick(clock.now()).await.unwrap().len(),
        1,
        "at start-up, once runs the occurrence it just missed"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        scheduler.tick(clock.now()).await.unwrap().len(),
        2,
        "on time: one occurrence each"
    );
    // An hour with no tick.
    clock.advance(Duration::from_secs(3600));
    let after = scheduler.tick(clock.now()).await.unwrap();
    assert_eq!(
        after
            .iter()
            .map(|o| (o.schedule.as_str(), o.at))
            .collect::<Vec<_>>(),
        [("once", utc("2026-11-24T11:00:01Z"))],
        "skip enqueues none of the 3,600 missed occurrences, once the latest"
    );
    // Both go on from there, one occurrence a second.
    clock.advance(Duration::from_secs(1));
    let next = scheduler.tick(clock.now()).await.unwrap();
    assert_eq!(
        next.iter()
            .map(|o| (o.schedule.as_str(), o.at))
            .collect::<Vec<_>>(),
        [
            ("skip", utc("2026-11-24T11:00:02Z")),
            ("once", utc("2026-11-24T11:00:02Z"))
        ]
    );
    assert_eq!(
        keys(&store).await.len(),
        6,
        "1 at start-up, 2 on time, 1 catching up, 2 after"
    );
}

#[test]
fn schedules_that_cannot_work_are_refused_with_the_reason() {
    let store = MemoryStore::new();
    let refused = |r: Result<Schedule, queue_worker::WorkerError>| r.unwrap_err().to_string();
    assert!(refused(Schedule::cron("x", "0 25 * * *", Utc, job())).contains("does not parse"));
    assert!(refused(Schedule::cron("a:b", "0 3 * * *", Utc, job())).contains("':'"));
    assert!(refused(Schedule::every("x", Duration::ZERO, job())).contains("millisecond"));
    let keyed = job().unique("mine", queue_core::UniqueScope::Active);
    assert!(refused(Schedule::every("x", Duration::from_secs(1), keyed)).contains("unique key"));
    let twice = Scheduler::new(
        store,
        vec![
            Schedule::every("x", Duration::from_secs(1), job()).unwrap(),
            Schedule::every("x", Duration::from_secs(2), job()).unwrap(),
        ],
        SchedulerOptions::default(),
    );
    assert!(twice.is_err_and(|e| e.to_string().contains("two schedules are named \"x\"")));
}
