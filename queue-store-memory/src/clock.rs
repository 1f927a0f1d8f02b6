//! A clock that tests move by hand.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use queue_core::Clock;

/// A [`Clock`] that stands still until told to move. Clones share the time.
///
/// ```
/// use std::time::Duration;
/// use queue_core::Clock;
/// use queue_store_memory::ManualClock;
///
/// let clock = ManualClock::new(chrono::DateTime::UNIX_EPOCH);
/// clock.advance(Duration::from_secs(90));
/// assert_eq!(clock.now().timestamp(), 90);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
