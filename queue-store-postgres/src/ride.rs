//! Locks that ride on another job's commit (transactional mode).
//!
//! A job's transaction costs two round trips: its lock when the handler
//! asks for the transaction, its completion and `COMMIT AND CHAIN` at the
//! end. A lock can instead go along with another job's commit, which sends
//! `EXECUTE complete(..); COMMIT AND CHAIN; EXECUTE lock(..)` and passes its
//! connection, now inside the rider's locked transaction, on: one round
//! trip per job.
//!
//! - **Early rides** (always, with prepared job statements): a claimed job
//!   about to wait for a handler boards its lock ([`EarlyLock`]), if its
//!   kind's last job asked for its transaction. The worker keeps a
//!   handler's slot until its job's commit returns and hands it to the
//!   longest-waiting job, which is the one whose lock the commit carried:
//!   the rider waits for no flush it would not have waited for anyway. A
//!   job that starts before any commit took its lock withdraws it and
//!   locks by itself; one that never asks for its transaction has a lock
//!   that arrived rolled back, and so has one that asks over a second
//!   after it arrived (it then locks afresh). At most half the pool's
//!   connections wait, locked, for their jobs' handlers.
//! - **Late rides** ([`crate::PgStoreOptions::lock_rides`], off by
//!   default): a handler asking for its transaction while other jobs'
//!   commits flow hands its lock to the next of them, if another job's
//!   commit started within the wait it is allowed (so commits are flowing)
//!   and another job's transaction is open (so one is coming); one that
//!   finds no commit within that wait opens its transaction itself. Such a
//!   rider gets its lock only once the commit it rode on has flushed its
//!   WAL, later than by a round trip of its own: late rides pay when the
//!   server's CPU limits the jobs (many handlers), and cost when the
//!   handlers' waits do.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::Postgres;
use sqlx_core::transaction::TransactionManager;
use tokio::sync::oneshot;

use crate::stash::{Lent, Stash};

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
    /// Boarded by a job waiting for a handler ([`EarlyLock`]).
    early: bool,
    /// `EXECUTE lock(..)` for the rider's job.
    pub(crate) lock: String,
    reply: oneshot::Sender<Delivered>,
}

impl Ride {
    /// Tells the rider how its ride ended; the arrival comes back if the
    /// rider is gone (its connection is then the committer's to clean up).
    ///
    /// An early lock that arrived parks its connection until its job gets
    /// a handler; when as many as allowed are parked already (commits that
    /// took their rides before the last ones parked), it comes back too,
    /// and the rider, told nothing, locks by itself.
    pub(crate) fn deliver(self, arrival: Arrival, rides: &Rides) -> Result<(), Arrival> {
        // Counted before the rider can see it, uncounted if it never does.
        let parks = self.early && matches!(arrival, Arrival::Locked(_));
        if parks && !rides.park() {
            return Err(arrival);
        }
        let sent = self.reply.send(Delivered {
            arrival,
            at: Instant::now(),
        });
        if parks && sent.is_err() {
            rides.parked.fetch_sub(1, Ordering::AcqRel);
        }
        sent.map_err(|returned| returned.arrival)
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
    /// Whether a handler asking for its transaction may board (late rides,
    /// as configured); jobs waiting for a handler board early regardless.
    late: bool,
    /// Early locks that arrived and wait for their jobs' handlers, each
    /// holding a connection.
    parked: AtomicUsize,
    /// The most of them at once.
    max_parked: usize,
    /// Per kind: whether its last job asked for its transaction.
    asks: Mutex<HashMap<String, bool>>,
}

/// An arrival and when it was sent.
#[derive(Debug)]
pub(crate) struct Delivered {
    arrival: Arrival,
    at: Instant,
}

/// The longest an early lock waits for its job's handler to ask for the
/// transaction before it is rolled back and taken afresh: a connection
/// left idle in a transaction longer may have been ended by the server
/// (`idle_in_transaction_session_timeout`; the docs ask for over 2 s,
/// which the chained connections of the stash need too).
const PARKED_AT_MOST: Duration = Duration::from_secs(1);

/// A boarded lock: how the rider waits for its arrival.
#[derive(Debug)]
pub(crate) struct Ticket {
    number: u64,
    arrival: oneshot::Receiver<Delivered>,
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
    /// Early rides, with at most `max_parked` locks waiting for their
    /// handlers at once; late rides too if `late` is `Some`, their locks
    /// waiting up to that long for a commit.
    pub(crate) fn new(late: Option<Duration>, max_parked: usize) -> Arc<Rides> {
        Arc::new(Rides {
            late: late.is_some(),
            parked: AtomicUsize::new(0),
            max_parked,
            asks: Mutex::new(HashMap::new()),
            waiting: Mutex::new(VecDeque::new()),
            wait: late.unwrap_or_default(),
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
        if !self.late || self.open.load(Ordering::Acquire) == 0 {
            return false;
        }
        let last = self.last_commit.load(Ordering::Acquire);
        let wait = u64::try_from(self.wait.as_micros()).unwrap_or(u64::MAX);
        last != 0 && self.now_micros().saturating_sub(last) < wait
    }

    /// Queues `lock` for the next commit.
    pub(crate) fn board(&self, lock: String) -> Ticket {
        self.board_as(lock, false)
    }

    fn board_as(&self, lock: String, early: bool) -> Ticket {
        let number = self.numbers.fetch_add(1, Ordering::Relaxed);
        let (reply, arrival) = oneshot::channel();
        self.lock().push_back(Ride {
            number,
            early,
            lock,
            reply,
        });
        Ticket { number, arrival }
    }

    /// For a commit about to start: the longest-waiting ride, if any (and
    /// notes that commits are flowing). An early ride stays while as many
    /// early locks as allowed wait for their handlers.
    pub(crate) fn take(&self) -> Option<Ride> {
        self.last_commit
            .store(self.now_micros().max(1), Ordering::Release);
        let mut waiting = self.lock();
        if waiting.front()?.early && self.parked.load(Ordering::Acquire) >= self.max_parked {
            return None;
        }
        waiting.pop_front()
    }

    /// Counts one more early lock parked, unless as many as allowed are:
    /// whether it may park. (A lock that parks holds a connection while its
    /// job waits for a handler; running jobs that lock by themselves need
    /// the rest of the pool.)
    fn park(&self) -> bool {
        self.parked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |parked| {
                (parked < self.max_parked).then_some(parked + 1)
            })
            .is_ok()
    }

    /// Takes the ride off the queue unless a commit took it: whether it
    /// was still there.
    fn withdraw(&self, number: u64) -> bool {
        let mut waiting = self.lock();
        let at = waiting.iter().position(|r| r.number == number);
        at.and_then(|at| waiting.remove(at)).is_some()
    }

    /// Whether a claimed job of `kind` is likely to ask for its
    /// transaction: its kind's last job did.
    pub(crate) fn predicts(&self, kind: &str) -> bool {
        self.asks_lock().get(kind).copied().unwrap_or(false)
    }

    /// Remembers whether a job of `kind` asked for its transaction.
    pub(crate) fn learn(&self, kind: &str, asked: bool) {
        let mut asks = self.asks_lock();
        match asks.get_mut(kind) {
            Some(last) => *last = asked,
            None => {
                asks.insert(kind.to_owned(), asked);
            }
        }
    }

    fn asks_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.asks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the ticket's ride; `Missed` if no commit took it within
    /// the wait (it is then taken off the queue).
    pub(crate) async fn arrive(&self, mut ticket: Ticket) -> Arrival {
        if let Ok(arrival) = tokio::time::timeout(self.wait, &mut ticket.arrival).await {
            return arrival.map_or(Arrival::Missed, |d| d.arrival);
        }
        if self.withdraw(ticket.number) {
            return Arrival::Missed;
        }
        // A commit took it just now: its answer is on the way (or the
        // committer was dropped, which is a miss).
        ticket.arrival.await.map_or(Arrival::Missed, |d| d.arrival)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Ride>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A claimed job's lock, boarded as the job began to wait for a handler:
/// the next commit may carry it before the job even starts (the slot it
/// waits for frees only when that commit returns, so the rider waits for
/// no flush it would not have waited for anyway). Settled when the handler asks for its
/// transaction; dropped otherwise, which rolls back a lock that arrived.
#[derive(Debug)]
pub(crate) struct EarlyLock {
    ticket: Option<Ticket>,
    rides: Arc<Rides>,
    stash: Arc<Stash>,
}

impl EarlyLock {
    /// Boards `lock` for the commits to come.
    pub(crate) fn board(rides: &Arc<Rides>, stash: &Arc<Stash>, lock: String) -> EarlyLock {
        EarlyLock {
            ticket: Some(rides.board_as(lock, true)),
            rides: rides.clone(),
            stash: stash.clone(),
        }
    }

    /// For the handler asking for its transaction: how the ride ended if a
    /// commit took it (waiting for that commit), `None` if none did (the
    /// ride is withdrawn; the job locks by itself).
    pub(crate) async fn settle(mut self) -> Option<Arrival> {
        let ticket = self.ticket.take()?;
        if self.rides.withdraw(ticket.number) {
            return None;
        }
        let Ok(Delivered { arrival, at }) = ticket.arrival.await else {
            return Some(Arrival::Missed);
        };
        let Arrival::Locked(mut conn) = arrival else {
            return Some(arrival);
        };
        self.rides.parked.fetch_sub(1, Ordering::AcqRel);
        if at.elapsed() <= PARKED_AT_MOST {
            return Some(Arrival::Locked(conn));
        }
        // Parked too long to trust: rolled back (a connection the server
        // ended is closed), and the job locks by itself.
        match PgTransactionManager::rollback(&mut conn).await {
            Ok(()) => self.stash.put(Lent {
                conn,
                prepared: true,
            }),
            Err(_) => conn.close_on_drop(),
        }
        Some(Arrival::Missed)
    }
}

impl Drop for EarlyLock {
    fn drop(&mut self) {
        let Some(mut ticket) = self.ticket.take() else {
            return;
        };
        if self.rides.withdraw(ticket.number) {
            return;
        }
        // A commit took it. Closed, a commit still on its way finds the
        // rider gone and rolls the lock back itself; one that delivered
        // already left the locked connection here.
        ticket.arrival.close();
        if let Ok(Delivered {
            arrival: Arrival::Locked(mut conn),
            ..
        }) = ticket.arrival.try_recv()
        {
            self.rides.parked.fetch_sub(1, Ordering::AcqRel);
            PgTransactionManager::start_rollback(&mut conn);
            self.stash.return_checked(Lent {
                conn,
                prepared: true,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lock_rides_only_while_commits_flow_and_a_transaction_is_open() {
        let rides = Rides::new(Some(Duration::from_millis(50)), 1);
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

    #[test]
    fn without_late_rides_no_handler_boards() {
        let rides = Rides::new(None, 1);
        let _open = rides.opened();
        assert!(rides.take().is_none());
        assert!(
            !rides.worth_riding(),
            "commits flow, but late rides are off"
        );
    }

    #[test]
    fn an_early_ride_stays_while_the_parked_locks_are_at_their_limit() {
        let rides = Rides::new(None, 1);
        let _ticket = rides.board_as("EXECUTE lock(1)".into(), true);
        rides.parked.store(1, Ordering::Release);
        assert!(rides.take().is_none(), "one lock parked already");
        rides.parked.store(0, Ordering::Release);
        let ride = rides.take().expect("room for one");
        assert_eq!(ride.lock, "EXECUTE lock(1)");
        assert!(ride.deliver(Arrival::NotHeld, &rides).is_ok());
        assert_eq!(
            rides.parked.load(Ordering::Acquire),
            0,
            "only a lock that arrived parks"
        );
    }

    #[test]
    fn no_more_early_locks_park_than_allowed() {
        let rides = Rides::new(None, 2);
        assert!(rides.park());
        assert!(rides.park());
        assert!(!rides.park(), "two parked already");
        assert_eq!(rides.parked.load(Ordering::Acquire), 2);
        rides.parked.fetch_sub(1, Ordering::AcqRel);
        assert!(rides.park(), "room again once one settled");
    }

    #[tokio::test]
    async fn the_longest_waiting_ride_goes_first_and_gets_its_answer() {
        let rides = Rides::new(Some(Duration::from_secs(5)), 1);
        let first = rides.board("EXECUTE lock(1)".into());
        let _second = rides.board("EXECUTE lock(2)".into());
        let ride = rides.take().expect("a ride waits");
        assert_eq!(ride.lock, "EXECUTE lock(1)");
        assert!(ride.deliver(Arrival::NotHeld, &rides).is_ok());
        assert!(matches!(rides.arrive(first).await, Arrival::NotHeld));
        assert_eq!(rides.lock().len(), 1);
    }

    #[tokio::test]
    async fn a_ride_no_commit_takes_is_withdrawn_after_the_wait() {
        let rides = Rides::new(Some(Duration::from_millis(5)), 1);
        let ticket = rides.board("EXECUTE lock(1)".into());
        assert!(matches!(rides.arrive(ticket).await, Arrival::Missed));
        assert!(rides.take().is_none(), "withdrawn from the queue");
    }

    #[tokio::test]
    async fn a_ride_whose_rider_is_gone_hands_the_arrival_back() {
        let rides = Rides::new(Some(Duration::from_secs(5)), 1);
        drop(rides.board("EXECUTE lock(1)".into()));
        let ride = rides.take().expect("a ride waits");
        assert!(matches!(
            ride.deliver(Arrival::NotHeld, &rides),
            Err(Arrival::NotHeld)
        ));
    }
}
