//! The claim cursor: where the next claim into a backlog starts reading the
//! claim order, so that it does not walk the index entries of every job
//! claimed since the last vacuum (see
//! [`PgStoreOptions::claim_cursor`](crate::PgStoreOptions::claim_cursor)).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A place in the claim order: a job's priority (0 when the table has none)
/// and key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Position<K> {
    pub priority: i64,
    pub key: K,
}

/// The cursor of one store, shared by its concurrent claims.
pub(crate) struct ClaimCursor<K> {
    /// How long claims may start at the cursor after a claim from the start.
    rescan_after: Duration,
    state: Mutex<State<K>>,
}

struct State<K> {
    /// After the last job of the last claim that came back full; `None`
    /// when the next claim reads from the start.
    after: Option<Position<K>>,
    /// When the last claim from the start went out.
    last_rescan: Option<Instant>,
}

impl<K: Clone> ClaimCursor<K> {
    pub(crate) fn new(rescan_after: Duration) -> Self {
        ClaimCursor {
            rescan_after,
            state: Mutex::new(State {
                after: None,
                last_rescan: None,
            }),
        }
    }

    /// Where a claim going out now starts: after the returned position, or
    /// from the start (`None`), which it records as the latest rescan.
    pub(crate) fn start(&self, now: Instant) -> Option<Position<K>> {
        let mut state = self.lock();
        let fresh = state
            .last_rescan
            .is_some_and(|at| now.saturating_duration_since(at) < self.rescan_after);
        match &state.after {
            Some(after) if fresh => Some(after.clone()),
            _ => {
                state.last_rescan = Some(now);
                None
            }
        }
    }

    /// Records how a claim ended: `last` is the last job it took in claim
    /// order, `full` whether it took as many as it asked for. Only a full
    /// claim says the backlog goes on after its last job; anything else
    /// (a short claim, a failed one) sends the next claim to the start.
    pub(crate) fn ended(&self, last: Option<Position<K>>, full: bool) {
        self.lock().after = last.filter(|_| full);
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(priority: i64, key: i64) -> Option<Position<i64>> {
        Some(Position { priority, key })
    }

    #[test]
    fn claims_start_after_a_full_claim_until_the_rescan_interval_passes() {
        let cursor = ClaimCursor::new(Duration::from_millis(10));
        let t = Instant::now();
        assert_eq!(
            cursor.start(t),
            None,
            "the first claim reads from the start"
        );
        cursor.ended(at(0, 48), true);
        assert_eq!(cursor.start(t + Duration::from_millis(4)), at(0, 48));
        cursor.ended(at(0, 96), true);
        assert_eq!(cursor.start(t + Duration::from_millis(9)), at(0, 96));
        assert_eq!(
            cursor.start(t + Duration::from_millis(10)),
            None,
            "10 ms after the last read from the start, the next one"
        );
        cursor.ended(at(5, 7), true);
        assert_eq!(
            cursor.start(t + Duration::from_millis(12)),
            at(5, 7),
            "a claim from the start moves the cursor back to where it ended"
        );
    }

    #[test]
    fn a_short_or_failed_claim_sends_the_next_claim_to_the_start() {
        let cursor = ClaimCursor::new(Duration::from_secs(3600));
        let t = Instant::now();
        assert_eq!(cursor.start(t), None);
        cursor.ended(at(0, 48), true);
        assert_eq!(cursor.start(t), at(0, 48));
        cursor.ended(at(0, 60), false);
        assert_eq!(cursor.start(t), None, "short: the backlog after it is gone");
        cursor.ended(at(0, 48), true);
        cursor.ended(None, false);
        assert_eq!(cursor.start(t), None, "failed");
    }
}
