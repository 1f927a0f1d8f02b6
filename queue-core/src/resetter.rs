//! The resetter contract: what happens to stalled jobs.
//!
//! A job is *stalled* when it is processing, no live attempt holds it (for a
//! database store: it is not row-locked by a transaction), and its
//! `last_heartbeat_at` is older than the stalled max age: its worker crashed
//! or lost its connection. [`Store::reset_stalled`](crate::Store::reset_stalled)
//! then, for each stalled job:
//!
//! - with [`Delivery::AtLeastOnce`] and fewer than `max_resets` resets so far,
//!   moves it back to queued and increments `num_resets`;
//! - with [`Delivery::AtLeastOnce`] and `max_resets` reached, moves it to
//!   failed with [`MAX_RESETS_MESSAGE`];
//! - with [`Delivery::AtMostOnce`], moves it to failed with
//!   [`AT_MOST_ONCE_MESSAGE`]: it may have run, so it must not run again.
//!
//! Each move guards the processing state and the stalled heartbeat, so a job
//! that finished or heartbeated meanwhile is left alone, and several resetters
//! may run at once. The old attempt's lease is invalid afterwards.

use chrono::{DateTime, Utc};

/// Failure message of a job failed for reaching the reset limit.
pub const MAX_RESETS_MESSAGE: &str =
    "job stalled too many times: its worker stopped heartbeating on every attempt and the reset limit was reached";

/// Failure message of a stalled job failed under at-most-once delivery.
pub const AT_MOST_ONCE_MESSAGE: &str =
    "job stalled and delivery is at most once: its worker stopped heartbeating, and it may have run, so it was not retried";

/// What a stalled job may go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Delivery {
    /// Stalled jobs run again (handlers must be idempotent).
    #[default]
    AtLeastOnce,
    /// Stalled jobs fail instead of running again.
    AtMostOnce,
}

/// What [`Store::reset_stalled`](crate::Store::reset_stalled) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetParams {
    /// Jobs whose last heartbeat is older than this are stalled
    /// (`now - stalled max age`).
    pub stalled_before: DateTime<Utc>,
    /// How many resets a job may have before it fails instead.
    pub max_resets: u32,
    /// Whether stalled jobs run again.
    pub delivery: Delivery,
    /// The current time, stored as `finished_at` of failed jobs.
    pub now: DateTime<Utc>,
}

/// What a reset did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResetReport<Id> {
    /// Jobs moved back to queued.
    pub reset: Vec<Id>,
    /// Jobs moved to failed.
    pub failed: Vec<Id>,
}

impl<Id> Default for ResetReport<Id> {
    fn default() -> Self {
        ResetReport {
            reset: Vec::new(),
            failed: Vec::new(),
        }
    }
}
