//! How far this process's clock is from the database's, so that the times
//! a worker, a resetter or an operator tool passes (heartbeats, claim
//! times, stall cut-offs, finish and retry times) are written and judged
//! on the database's clock. Without it a worker whose clock ran a minute
//! ahead would stamp heartbeats a minute in the future (its jobs would
//! look alive after it died), and a resetter whose clock ran ahead would
//! take healthy jobs for stalled ones.
//!
//! The offset is measured when the store starts and again at most once a
//! minute (on the resetter's and the stats' paths). Offsets under a second
//! are taken as none: stall ages are many seconds, and exact times stay
//! exactly as the caller gave them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use queue_core::{Clock, StoreError, SystemClock};
use sqlx::PgPool;

use crate::error::store_error;
use crate::stash::OnLiveConnection;

/// Offsets smaller than this are taken as none.
const NEGLIGIBLE: TimeDelta = TimeDelta::seconds(1);
/// How often the offset is measured again.
const REMEASURE: Duration = Duration::from_secs(60);

/// The database's clock minus this process's, as measured.
pub(crate) struct ClockOffset {
    micros: AtomicI64,
    clock: Mutex<Arc<dyn Clock>>,
    measured: Mutex<Option<Instant>>,
}

impl Default for ClockOffset {
    fn default() -> Self {
        ClockOffset {
            micros: AtomicI64::new(0),
            clock: Mutex::new(Arc::new(SystemClock)),
            measured: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for ClockOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockOffset")
            .field("micros", &self.micros.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ClockOffset {
    /// `at`, a time of this process's clock, on the database's clock.
    pub(crate) fn to_db(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let micros = self.micros.load(Ordering::Relaxed);
        if micros == 0 {
            return at;
        }
        at.checked_add_signed(TimeDelta::microseconds(micros))
            .unwrap_or(at)
    }

    /// `at` on the database's clock, back on this process's.
    pub(crate) fn to_local(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let micros = self.micros.load(Ordering::Relaxed);
        at.checked_sub_signed(TimeDelta::microseconds(micros))
            .unwrap_or(at)
    }

    /// Now on the clock the callers' times come from (the one
    /// [`ClockOffset::set_clock`] gave, else the system's): the time the
    /// store takes for an operator's write, which [`ClockOffset::to_db`]
    /// puts on the database's clock.
    pub(crate) fn callers_now(&self) -> DateTime<Utc> {
        self.clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .now()
    }

    /// The offset as measured last.
    pub(crate) fn offset(&self) -> TimeDelta {
        TimeDelta::microseconds(self.micros.load(Ordering::Relaxed))
    }

    /// Measures against `clock` from now on (the clock the callers' times
    /// come from), at once.
    pub(crate) async fn set_clock(
        &self,
        clock: Arc<dyn Clock>,
        pool: &PgPool,
    ) -> Result<(), StoreError> {
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = clock;
        self.measure(pool).await
    }

    /// Measures again if the last measurement is older than a minute.
    pub(crate) async fn refresh(&self, pool: &PgPool) -> Result<(), StoreError> {
        let stale = self
            .measured
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|at| at.elapsed() >= REMEASURE);
        if stale {
            self.measure(pool).await?;
        }
        Ok(())
    }

    /// Reads the database's clock between two readings of ours.
    pub(crate) async fn measure(&self, pool: &PgPool) -> Result<(), StoreError> {
        let clock = self
            .clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let before = clock.now();
        let context = "reading the database's clock";
        let mut tries = OnLiveConnection::new(pool, context);
        let database: DateTime<Utc> = loop {
            let mut conn = tries.connection().await?;
            let done = sqlx::query_scalar("SELECT statement_timestamp()")
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        let after = clock.now();
        let ours = before + (after - before) / 2;
        let offset = database - ours;
        let offset = if offset.abs() < NEGLIGIBLE {
            TimeDelta::zero()
        } else {
            offset
        };
        let previous = self
            .micros
            .swap(offset.num_microseconds().unwrap_or(0), Ordering::Relaxed);
        if previous != offset.num_microseconds().unwrap_or(0) && !offset.is_zero() {
            tracing::warn!(
                offset_ms = offset.num_milliseconds(),
                "this process's clock differs from the database's; heartbeats, stall judgement and finish times use the database's clock"
            );
        }
        *self.measured.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        Ok(())
    }
}
