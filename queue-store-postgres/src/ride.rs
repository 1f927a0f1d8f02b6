//! Locks that ride on another job's commit (transactional mode).
//!
//! A job's transaction costs two round trips: its lock when the handler
//! asks for the transaction, its completion and `COMMIT AND CHAIN` at the
//! end. While other jobs' commits are flowing, a handler asking for its
//! transaction hands its lock to the next of them instead: that commit
//! sends `EXECUTE complete(..); COMMIT AND CHAIN; EXECUTE lock(..)` and
//! passes its connection, now inside the rider's locked transaction, on.
//! Under load that is one round trip per job.
//!
//! A lock rides only if another job's commit started within the wait it is
//! allowed (so commits are flowing) and another job's transaction is open
//! (so one is coming); one that finds no commit within that wait opens its
//! transaction itself, as it would have without riding.
//!
//! A rider gets its lock only once the commit it rode on has flushed its
//! WAL, later than by a round trip of its own: rides pay when the server's
//! CPU limits the jobs (many handlers), and cost when the handlers' waits
//! do. Hence off by default ([`crate::PgStoreOptions::lock_rides`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio::sync::oneshot;

/// How a ride ended, as its committer tells the rider.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// The connection, inside the rider's transaction with its row locked.
    Locked(PoolConnection<Postgres>),
    /// The lock found the row no longer this claim's.
    NotHeld,
    /// The commit it rode on failed first: the rider locks by itself.
    Missed,
}

/// A lock waiting for a commit to ride on.
#[derive(Debug)]
pub(crate) struct Ride {
    number: u64,
    /// `EXECUTE lock(..)` for the rider's job.
    pub(crate) lock: String,
    reply: oneshot::Sender<Arrival>,
}

impl Ride {
    /// Tells the rider how its ride ended; the arrival comes back if the
    /// rider is gone (its connection is then the committer's to clean up).
    pub(crate) fn deliver(self, arrival: Arrival) -> Result<(), Arrival> {
        self.reply.send(arrival)
    }
}

/// The rides of one store, and what decides whether a lock should ride.
#[derive(Debug)]
pub(crate) struct Rides {
    waiting: Mutex<VecDeque<Ride>>,
    /// How long a lock waits for a commit to ride on.
    wait: Duration,
    /// Job transactions open (locked, not yet ended).
    open: AtomicUsize,
    /// When the last commit started, in microseconds since `epoch`.
    last_commit: AtomicU64,
    epoch: Instant,
    numbers: AtomicU64,
}

/// A boarded lock: how the rider waits for its arrival.
#[derive(Debug)]
pub(crate) struct Ticket {
    number: u64,
    arrival: oneshot::Receiver<Arrival>,
}

/// Counts a job transaction as open until dropped.
#[derive(Debug)]
pub(crate) struct OpenGuard(Arc<Rides>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Rides {
    /// Rides whose locks wait up to `wait` for a commit.
    pub(crate) fn new(wait: Duration) -> Arc<Rides> {
        Arc::new(Rides {
            waiting: Mutex::new(VecDeque::new()),
            wait,
            open: AtomicUsize::new(0),
            // No commit yet: far enough in the past.
            last_commit: AtomicU64::new(0),
            epoch: Instant::now(),
            numbers: AtomicU64::new(0),
        })
    }

    fn now_micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Counts a job transaction as open while the guard lives.
    pub(crate) fn opened(self: &Arc<Self>) -> OpenGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenGuard(self.clone())
    }

    /// Whether a lock asked for now should ride: another job's transaction
    /// is open and the last commit started within the wait.
    pub(crate) fn worth_riding(&self) -> bool {
        if self.open.load(Ordering::Acquire) == 0 {
            return false;
        }
        let last = self.last_commit.load(Ordering::Acquire);
        let wait = u64::try_from(self.wait.as_micros()).unwrap_or(u64::MAX);
        last != 0 && self.now_micros().saturating_sub(last) < wait
    }

    /// Queues `lock` for the next commit.
    pub(crate) fn board(&self, lock: String) -> Ticket {
        let number = self.numbers.fetch_add(1, Ordering::Relaxed);
        let (reply, arrival) = oneshot::channel();
        self.lock().push_back(Ride {
            number,
            lock,
            reply,
        });
        Ticket { number, arrival }
    }

    /// For a commit about to start: the longest-waiting ride, if any (and
    /// notes that commits are flowing).
    pub(crate) fn take(&self) -> Option<Ride> {
        self.last_commit
            .store(self.now_micros().max(1), Ordering::Release);
        self.lock().pop_front()
    }

    /// Waits for the ticket's ride; `Missed` if no commit took it within
    /// the wait (it is then taken off the queue).
    pub(crate) async fn arrive(&self, mut ticket: Ticket) -> Arrival {
        if let Ok(arrival) = tokio::time::timeout(self.wait, &mut ticket.arrival).await {
            return arrival.unwrap_or(Arrival::Missed);
        }
        let withdrawn = {
            let mut waiting = self.lock();
            let at = waiting.iter().position(|r| r.number == ticket.number);
            at.and_then(|at| waiting.remove(at)).is_some()
        };
        if withdrawn {
            return Arrival::Missed;
        }
        // A commit took it just now: its answer is on the way (or the
        // committer was dropped, which is a miss).
        ticket.arrival.await.unwrap_or(Arrival::Missed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Ride>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lock_rides_only_while_commits_flow_and_a_transaction_is_open() {
        let rides = Rides::new(Duration::from_millis(50));
        assert!(!rides.worth_riding(), "no transaction open, no commit yet");
        let open = rides.opened();
        assert!(!rides.worth_riding(), "no commit yet");
        assert!(rides.take().is_none());
        assert!(rides.worth_riding(), "a commit just started");
        drop(open);
        assert!(!rides.worth_riding(), "no transaction open");
        let _open = rides.opened();
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            !rides.worth_riding(),
            "the last commit is older than the wait"
        );
    }

    #[tokio::test]
    async fn the_longest_waiting_ride_goes_first_and_gets_its_answer() {
        let rides = Rides::new(Duration::from_secs(5));
        let first = rides.board("EXECUTE lock(1)".into());
        let _second = rides.board("EXECUTE lock(2)".into());
        let ride = rides.take().expect("a ride waits");
        assert_eq!(ride.lock, "EXECUTE lock(1)");
        assert!(ride.deliver(Arrival::NotHeld).is_ok());
        assert!(matches!(rides.arrive(first).await, Arrival::NotHeld));
        assert_eq!(rides.lock().len(), 1);
    }

    #[tokio::test]
    async fn a_ride_no_commit_takes_is_withdrawn_after_the_wait() {
        let rides = Rides::new(Duration::from_millis(5));
        let ticket = rides.board("EXECUTE lock(1)".into());
        assert!(matches!(rides.arrive(ticket).await, Arrival::Missed));
        assert!(rides.take().is_none(), "withdrawn from the queue");
    }

    #[tokio::test]
    async fn a_ride_whose_rider_is_gone_hands_the_arrival_back() {
        let rides = Rides::new(Duration::from_secs(5));
        drop(rides.board("EXECUTE lock(1)".into()));
        let ride = rides.take().expect("a ride waits");
        assert!(matches!(
            ride.deliver(Arrival::NotHeld),
            Err(Arrival::NotHeld)
        ));
    }
}
