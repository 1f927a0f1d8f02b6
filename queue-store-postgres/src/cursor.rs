//! The claim cursor: where the next claim starts reading the claim order,
//! so that it does not walk the index entries of every job claimed since
//! the last vacuum (see
//! [`PgStoreOptions::claim_cursor`](crate::PgStoreOptions::claim_cursor)).
//!
//! Normally a claim starts at the cursor only inside a backlog (after a
//! claim that came back full), and reads from the start at least every
//! rescan interval. While a session holds an old snapshot (idle in
//! transaction, a long report), vacuum can remove no dead row, no index
//! entry can be marked dead, and every claim from the start walks the
//! entry of every job claimed since that snapshot: tens of milliseconds
//! after a few minutes at a few hundred jobs a second, growing without
//! end. When a claim from the start was slow (short at the end of a
//! backlog, or full inside one: there each rescan walks those entries,
//! every few claims), the store measures the walk off the claim path, in
//! blocks read, and at
//! [`COSTLY_BLOCKS`] or more the walk is *costly*: claims then always start at the cursor (kept
//! after short claims too), a few claims back (so that a key that commits
//! a little late is still ahead of it), and the walk from the start is
//! left to a *probe*, a read of the first waiting job's position off the
//! claim path, at most every rescan interval and never more than a
//! hundredth of the time. The probe moves the cursor to that job (back, for a job the
//! cursor passed; forward, over the dead entries) and wakes the workers
//! when it moved it back; it sends the next claim to the start when jobs
//! whose time came wait apart (those only a claim from the start takes).
//! A probe that walks fast ends the costly state.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A place in the claim order: a job's priority (0 when the table has none)
/// and key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Position<K> {
    pub priority: i64,
    pub key: K,
}

/// A claim from the start that took this long makes the walk to the first
/// waiting job suspect (a short claim on a clean index takes 0.1-0.4 ms,
/// but a busy machine or a claim of many rows can take longer): the store
/// then measures it, at most every [`MEASURE_AT_MOST_EVERY`].
const SUSPECT_WALK: Duration = Duration::from_millis(1);
/// A walk that reads this many blocks (index and table pages, as `EXPLAIN
/// (ANALYZE, BUFFERS)` counts them: about one for every hundred dead
/// entries; 105 blocks in 1.0 ms for 10,000, 309 in 6.6 ms for 30,000) is
/// costly. A count, unlike a time, does not depend on how busy the machine
/// is, so a small table never turns costly under load (which would make
/// jobs before the cursor wait for a probe).
pub(crate) const COSTLY_BLOCKS: u64 = 100;
/// At most one measurement in this long.
const MEASURE_AT_MOST_EVERY: Duration = Duration::from_secs(5);
/// A probe faster than this says the walk is cheap again.
const CHEAP_WALK: Duration = Duration::from_micros(500);
/// Probes take at most one part in this of the time, however slow. Each
/// walks every dead entry while claims go on beside it: at one part in 20,
/// the pickup p99 of a 600 jobs/s drain went from 0.8 to 3-4 ms; at none,
/// it stayed at 0.8 ms.
const PROBE_SHARE: u32 = 100;
/// While the walk is costly, a claim starts this many claims back: a key
/// that committed a little after later keys were claimed (enqueues on
/// several connections) is still ahead of it, at the cost of stepping over
/// the entries of the jobs those claims took.
const LOOKBACK: usize = 8;

/// The cursor of one store, shared by its concurrent claims.
pub(crate) struct ClaimCursor<K> {
    /// How long claims may start at the cursor after a claim from the start.
    rescan_after: Duration,
    state: Mutex<State<K>>,
}

struct State<K> {
    /// Where the next claim starts (the position included: it was the last
    /// job taken, or the first waiting one a probe found); `None` when it
    /// reads from the start.
    at: Option<Position<K>>,
    /// The last [`LOOKBACK`] positions claims ended at, in one priority,
    /// oldest first: while the walk is costly, claims start at the oldest.
    behind: VecDeque<Position<K>>,
    /// When the last claim from the start went out.
    last_rescan: Option<Instant>,
    /// Whether the walk from the start is costly (see the module's text).
    costly: bool,
    /// Whether a probe is out.
    probing: bool,
    /// Whether a measurement of the walk is out, and when the last went.
    measuring: bool,
    last_measure: Option<Instant>,
    /// When the last probe ended, and how long it took.
    last_probe: Option<(Instant, Duration)>,
    /// Moved by each probe that moves the cursor, so that a claim that went
    /// out before it does not move the cursor back over what it found.
    epoch: u64,
}

/// Where a claim going out now starts, and what it must do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Start<K> {
    /// At this position (included), or from the start.
    pub at: Option<Position<K>>,
    /// Send a probe off the claim path now.
    pub probe: bool,
    /// Hand back to [`ClaimCursor::ended`].
    pub epoch: u64,
}

/// What a claim at the cursor that found nothing does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NothingAtCursor {
    /// Claim from the start: jobs that became claimable before the cursor
    /// must not wait for the worker's next poll.
    FromStart,
    /// The walk is costly: send a probe (it wakes the workers if it finds
    /// a job before the cursor).
    Probe,
    /// Nothing: a probe is out or went out very recently.
    Wait,
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Probed<K> {
    /// The first waiting job ready now, in claim order.
    pub first: Option<Position<K>>,
    /// Whether that job is before the cursor the probe was sent with.
    pub before_cursor: bool,
    /// Whether jobs whose time came (scheduled, retrying) wait apart.
    pub due_waiting: bool,
}

impl<K: Clone> ClaimCursor<K> {
    pub(crate) fn new(rescan_after: Duration) -> Self {
        ClaimCursor {
            rescan_after,
            state: Mutex::new(State {
                at: None,
                behind: VecDeque::with_capacity(LOOKBACK),
                last_rescan: None,
                costly: false,
                probing: false,
                measuring: false,
                last_measure: None,
                last_probe: None,
                epoch: 0,
            }),
        }
    }

    /// Where a claim going out now starts: at the returned position, or
    /// from the start (`None`), which it records as the latest rescan.
    pub(crate) fn start(&self, now: Instant) -> Start<K> {
        let mut state = self.lock();
        let epoch = state.epoch;
        if state.costly && state.at.is_some() {
            let probe = self.probe_due(&mut state, now);
            return Start {
                at: state.behind.front().or(state.at.as_ref()).cloned(),
                probe,
                epoch,
            };
        }
        let fresh = state
            .last_rescan
            .is_some_and(|at| now.saturating_duration_since(at) < self.rescan_after);
        match &state.at {
            Some(at) if fresh => Start {
                at: Some(at.clone()),
                probe: false,
                epoch,
            },
            _ => {
                state.last_rescan = Some(now);
                Start {
                    at: None,
                    probe: false,
                    epoch,
                }
            }
        }
    }

    /// Records how a claim ended: `last` is the last job it took in claim
    /// order, `full` whether it took as many as it asked for, `from_start`
    /// how long it took if it read from the start. Normally only a full
    /// claim says the backlog goes on after its last job, and anything else
    /// (a short claim, a failed one) sends the next claim to the start;
    /// while the walk is costly, a short claim keeps the cursor at its last
    /// job (or where it was, if it took none). Whether the store should
    /// measure the walk now (a claim from the start was slow, short or
    /// full: inside a backlog a session's old snapshot makes every rescan
    /// walk the entries of the jobs claimed since, and a drain of a million
    /// jobs ran at a quarter of its speed while the claims, all full, never
    /// sent a measurement).
    pub(crate) fn ended(
        &self,
        now: Instant,
        epoch: u64,
        last: Option<Position<K>>,
        full: bool,
        from_start: Option<Duration>,
        failed: bool,
    ) -> bool {
        let mut state = self.lock();
        let measure = from_start.is_some_and(|took| took >= SUSPECT_WALK)
            && !failed
            && !state.costly
            && !state.measuring
            && state
                .last_measure
                .is_none_or(|at| now.duration_since(at) >= MEASURE_AT_MOST_EVERY);
        if measure {
            state.measuring = true;
            state.last_measure = Some(now);
        }
        if state.epoch != epoch {
            // A probe moved the cursor while this claim was out.
            return measure;
        }
        if failed {
            state.jump_to(None);
        } else if state.costly {
            // A claim that took nothing leaves the cursor where it was.
            if let Some(last) = last {
                state.step_to(last);
            }
        } else {
            state.jump_to(last.filter(|_| full));
        }
        measure
    }

    /// Records a measurement of the walk from the start: the blocks it
    /// read (`None`: it failed). At [`COSTLY_BLOCKS`] or more, the walk is
    /// costly.
    pub(crate) fn measured(&self, blocks: Option<u64>) {
        let mut state = self.lock();
        state.measuring = false;
        if blocks.is_some_and(|b| b >= COSTLY_BLOCKS) {
            state.costly = true;
        }
    }

    /// A claim at the cursor found nothing: what next.
    pub(crate) fn nothing_at_cursor(&self, now: Instant) -> NothingAtCursor {
        let mut state = self.lock();
        if !state.costly {
            state.last_rescan = Some(now);
            NothingAtCursor::FromStart
        } else if self.probe_due(&mut state, now) {
            NothingAtCursor::Probe
        } else {
            NothingAtCursor::Wait
        }
    }

    /// Whether a probe may go out now; if so, marks it out.
    fn probe_due(&self, state: &mut State<K>, now: Instant) -> bool {
        if state.probing {
            return false;
        }
        let due = match state.last_probe {
            None => true,
            Some((at, took)) => {
                now.saturating_duration_since(at) >= self.rescan_after.max(took * PROBE_SHARE)
            }
        };
        state.probing = due;
        due
    }

    /// The cursor a probe compares the first waiting job with.
    pub(crate) fn position(&self) -> Option<Position<K>> {
        self.lock().at.clone()
    }

    /// Records what a probe found (`None`: it failed) and how long it took;
    /// whether the workers should look again now (the cursor moved back
    /// over a waiting job or to another priority, or the next claim reads
    /// from the start).
    pub(crate) fn probe_ended(
        &self,
        now: Instant,
        took: Duration,
        found: Option<Probed<K>>,
    ) -> bool {
        let mut state = self.lock();
        state.probing = false;
        // A failed probe's time says nothing of the walk (it may have
        // timed out): the next may go out after the rescan interval.
        let walked = if found.is_some() {
            took
        } else {
            Duration::ZERO
        };
        state.last_probe = Some((now, walked));
        let Some(found) = found else {
            return false;
        };
        if took < CHEAP_WALK {
            state.costly = false;
        }
        if found.due_waiting {
            state.jump_to(None);
            state.epoch += 1;
            return true;
        }
        match found.first {
            Some(first) => {
                // Another priority: claims at the old cursor never reach it.
                let other_priority =
                    state.at.as_ref().map(|at| at.priority) != Some(first.priority);
                state.jump_to(Some(first));
                state.epoch += 1;
                found.before_cursor || other_priority
            }
            None => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Clone> State<K> {
    /// Moves the cursor to `at`, with nothing behind it.
    fn jump_to(&mut self, at: Option<Position<K>>) {
        self.behind.clear();
        self.behind.extend(at.clone());
        self.at = at;
    }

    /// Moves the cursor on to where a claim ended, keeping the positions of
    /// the last claims of its priority behind it.
    fn step_to(&mut self, at: Position<K>) {
        if self
            .behind
            .back()
            .is_some_and(|b| b.priority != at.priority)
        {
            self.behind.clear();
        }
        if self.behind.len() == LOOKBACK {
            self.behind.pop_front();
        }
        self.behind.push_back(at.clone());
        self.at = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(priority: i64, key: i64) -> Option<Position<i64>> {
        Some(Position { priority, key })
    }

    const FAST: Option<Duration> = Some(Duration::from_micros(200));
    const SLOW: Option<Duration> = Some(Duration::from_millis(30));

    /// A claim that went out at `now`, ended as given.
    fn claim(
        cursor: &ClaimCursor<i64>,
        now: Instant,
        last: Option<Position<i64>>,
        full: bool,
        took: Option<Duration>,
    ) -> Start<i64> {
        let start = cursor.start(now);
        let from_start = start.at.is_none().then_some(took).flatten();
        if cursor.ended(
            Instant::now(),
            start.epoch,
            last.clone(),
            full,
            from_start,
            false,
        ) {
            // The store measures the walk: costly, as measured at 30 ms.
            cursor.measured(Some(COSTLY_BLOCKS * 10));
            // The next claim reads from the start once more (the short
            // claim had sent it there) and ends where this one did.
            let next = cursor.start(now);
            assert_eq!(next.at, None);
            cursor.ended(Instant::now(), next.epoch, last, full, from_start, false);
        }
        start
    }

    #[test]
    fn claims_start_at_the_last_job_of_a_full_claim_until_the_rescan_interval_passes() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        assert_eq!(
            cursor.start(t).at,
            None,
            "the first claim reads from the start"
        );
        cursor.ended(Instant::now(), 0, at(0, 48), true, FAST, false);
        assert_eq!(cursor.start(t + Duration::from_millis(4)).at, at(0, 48));
        cursor.ended(Instant::now(), 0, at(0, 96), true, None, false);
        assert_eq!(cursor.start(t + Duration::from_millis(9)).at, at(0, 96));
        assert_eq!(
            cursor.start(t + Duration::from_millis(10)).at,
            None,
            "10 ms after the last read from the start, the next one"
        );
        cursor.ended(Instant::now(), 0, at(5, 7), true, FAST, false);
        assert_eq!(
            cursor.start(t + Duration::from_millis(12)).at,
            at(5, 7),
            "a claim from the start moves the cursor back to where it ended"
        );
    }

    #[test]
    fn a_short_or_failed_claim_sends_the_next_claim_to_the_start() {
        let cursor = ClaimCursor::new(Duration::from_secs(3600));
        let t = Instant::now();
        assert_eq!(cursor.start(t).at, None);
        cursor.ended(Instant::now(), 0, at(0, 48), true, FAST, false);
        assert_eq!(cursor.start(t).at, at(0, 48));
        cursor.ended(Instant::now(), 0, at(0, 60), false, None, false);
        assert_eq!(
            cursor.start(t).at,
            None,
            "short: the backlog after it is gone"
        );
        cursor.ended(Instant::now(), 0, at(0, 48), true, FAST, false);
        cursor.ended(Instant::now(), 0, None, false, None, true);
        assert_eq!(cursor.start(t).at, None, "failed");
        assert_eq!(
            cursor.nothing_at_cursor(t),
            NothingAtCursor::FromStart,
            "a cheap walk: nothing at the cursor reads from the start"
        );
    }

    #[test]
    fn a_slow_short_claim_from_the_start_keeps_claims_at_the_cursor_and_probes_aside() {
        let rescan = Duration::from_millis(10);
        let cursor = ClaimCursor::new(rescan);
        let t = Instant::now();
        claim(&cursor, t, at(0, 6), false, SLOW);
        let next = cursor.start(t + Duration::from_millis(50));
        assert_eq!(
            next.at,
            at(0, 6),
            "costly: a short claim keeps the cursor at its last job, past the rescan interval"
        );
        assert!(next.probe, "the first probe goes out at once");
        cursor.ended(Instant::now(), next.epoch, at(0, 12), false, None, false);
        let t1 = t + Duration::from_millis(51);
        let busy = cursor.start(t1);
        assert_eq!(
            busy.at,
            at(0, 6),
            "a claim starts a few claims back, for keys that committed late"
        );
        assert!(!busy.probe, "one probe out at a time");
        cursor.ended(Instant::now(), busy.epoch, None, false, None, false);
        assert_eq!(
            cursor.start(t1).at,
            at(0, 6),
            "a claim that took nothing leaves the cursor where it was"
        );
        // The probe walked 30 ms: the next may go out 3 s after it.
        let found = Probed {
            first: at(0, 13),
            before_cursor: false,
            due_waiting: false,
        };
        assert!(
            !cursor.probe_ended(t1, Duration::from_millis(30), Some(found)),
            "ahead of the cursor, in its priority: no need to wake anyone"
        );
        assert_eq!(
            cursor.start(t1).at,
            at(0, 13),
            "the probe moved the cursor over the dead entries"
        );
        assert_eq!(
            cursor.nothing_at_cursor(t1 + Duration::from_millis(2_999)),
            NothingAtCursor::Wait,
            "probes take at most a hundredth of the time"
        );
        assert_eq!(
            cursor.nothing_at_cursor(t1 + Duration::from_secs(3)),
            NothingAtCursor::Probe
        );
    }

    #[test]
    fn while_the_walk_is_costly_claims_start_eight_claims_back_in_one_priority() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        claim(&cursor, t, at(0, 1), false, SLOW);
        for key in 2..=10 {
            let out = cursor.start(t);
            cursor.ended(Instant::now(), out.epoch, at(0, key), false, None, false);
        }
        assert_eq!(cursor.start(t).at, at(0, 3), "the last eight: 3 to 10");
        let out = cursor.start(t);
        cursor.ended(Instant::now(), out.epoch, at(2, 50), false, None, false);
        assert_eq!(
            cursor.start(t).at,
            at(2, 50),
            "another priority: nothing behind it"
        );
    }

    #[test]
    fn a_slow_claim_is_a_suspicion_and_only_a_walk_of_many_blocks_makes_it_costly() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        let out = cursor.start(t);
        assert!(
            cursor.ended(t, out.epoch, at(0, 6), false, SLOW, false),
            "a slow short claim from the start: measure the walk"
        );
        let again = cursor.start(t);
        assert!(
            !cursor.ended(t, again.epoch, at(0, 7), false, SLOW, false),
            "one measurement at a time"
        );
        cursor.measured(Some(COSTLY_BLOCKS - 1));
        assert_eq!(
            cursor.start(t + Duration::from_millis(20)).at,
            None,
            "a busy machine, not a long walk: claims read from the start as before"
        );
        let soon = cursor.start(t + Duration::from_secs(1));
        assert!(
            !cursor.ended(
                t + Duration::from_secs(1),
                soon.epoch,
                None,
                false,
                SLOW,
                false
            ),
            "at most one measurement every few seconds"
        );
        let later = cursor.start(t + Duration::from_secs(6));
        assert!(cursor.ended(
            t + Duration::from_secs(6),
            later.epoch,
            at(0, 9),
            false,
            SLOW,
            false
        ));
        cursor.measured(Some(COSTLY_BLOCKS));
        let t7 = t + Duration::from_secs(7);
        let next = cursor.start(t7);
        assert_eq!(
            next.at, None,
            "the short claim had sent this one to the start"
        );
        cursor.ended(t7, next.epoch, at(0, 10), false, SLOW, false);
        assert_eq!(
            cursor.start(t7 + Duration::from_secs(1)).at,
            at(0, 10),
            "costly: short claims keep the cursor, past the rescan interval"
        );
    }

    #[test]
    fn a_probe_moves_the_cursor_back_wakes_the_workers_and_outranks_claims_already_out() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        claim(&cursor, t, at(0, 100), false, SLOW);
        let out = cursor.start(t);
        assert!(out.probe);
        let late = Probed {
            first: at(0, 40),
            before_cursor: true,
            due_waiting: false,
        };
        assert!(
            cursor.probe_ended(t, Duration::from_millis(5), Some(late)),
            "a job the cursor passed (a key that committed late): wake"
        );
        cursor.ended(Instant::now(), out.epoch, at(0, 150), false, None, false);
        assert_eq!(
            cursor.start(t).at,
            at(0, 40),
            "a claim that went out before the probe does not move the cursor past what it found"
        );
        let t2 = t + Duration::from_secs(1);
        let out = cursor.start(t2);
        assert!(out.probe);
        let higher = Probed {
            first: at(0, 40),
            before_cursor: false,
            due_waiting: true,
        };
        assert!(cursor.probe_ended(t2, Duration::from_millis(5), Some(higher)));
        assert_eq!(
            cursor.start(t2).at,
            None,
            "jobs whose time came wait apart: the next claim reads from the start"
        );
        claim(&cursor, t2, at(0, 160), false, SLOW);
        let t3 = t2 + Duration::from_secs(1);
        assert!(cursor.start(t3).probe);
        let other = Probed {
            first: at(-1, 7),
            before_cursor: false,
            due_waiting: false,
        };
        assert!(
            cursor.probe_ended(t3, Duration::from_millis(5), Some(other)),
            "the cursor's priority is done and a lower one waits: wake"
        );
    }

    #[test]
    fn a_fast_probe_ends_the_costly_walk() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        claim(&cursor, t, at(0, 6), false, SLOW);
        assert!(cursor.start(t).probe);
        let found = Probed {
            first: at(0, 9),
            before_cursor: false,
            due_waiting: false,
        };
        cursor.probe_ended(t, Duration::from_micros(100), Some(found));
        let t1 = t + Duration::from_millis(20);
        assert_eq!(
            cursor.start(t1).at,
            None,
            "cheap again: claims read from the start every rescan interval"
        );
        assert_eq!(cursor.nothing_at_cursor(t1), NothingAtCursor::FromStart);
    }

    #[test]
    fn a_failed_probe_changes_nothing_but_its_time() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        claim(&cursor, t, at(0, 6), false, SLOW);
        assert!(cursor.start(t).probe);
        assert!(!cursor.probe_ended(t, Duration::from_millis(40), None));
        assert_eq!(cursor.start(t).at, at(0, 6), "still costly, still at 6");
        assert_eq!(
            cursor.nothing_at_cursor(t + Duration::from_millis(10)),
            NothingAtCursor::Probe,
            "a failed probe's time does not stretch the gap"
        );
    }

    /// Inside a backlog every claim comes back full, and an old snapshot
    /// makes each rescan walk the entries of every job claimed since (a
    /// drain of a million jobs ran at a quarter of its speed): a slow full
    /// claim from the start is measured too, and a costly walk keeps the
    /// claims at the cursor.
    #[test]
    fn a_slow_full_claim_from_the_start_is_measured_and_a_costly_walk_keeps_the_backlog_at_the_cursor(
    ) {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        let out = cursor.start(t);
        assert_eq!(out.at, None);
        assert!(
            !cursor.ended(t, out.epoch, at(0, 64), true, FAST, false),
            "a fast claim from the start: nothing to measure"
        );
        let rescan = cursor.start(t + Duration::from_millis(10));
        assert_eq!(rescan.at, None, "the rescan interval passed");
        assert!(
            cursor.ended(t, rescan.epoch, at(0, 128), true, SLOW, false),
            "a slow full claim from the start: measure the walk"
        );
        cursor.measured(Some(COSTLY_BLOCKS * 30));
        let t1 = t + Duration::from_secs(1);
        for key in [192, 256, 320] {
            let next = cursor.start(t1);
            assert!(
                next.at.is_some(),
                "costly: claims start at the cursor, past the rescan interval"
            );
            cursor.ended(t1, next.epoch, at(0, key), true, None, false);
        }
        assert_eq!(
            cursor.start(t1).at,
            at(0, 128),
            "a few claims back, for keys that commit late"
        );
    }
}
