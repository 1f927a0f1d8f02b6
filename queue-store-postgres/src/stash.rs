//! Connections the store keeps between its own statements.
//!
//! sqlx pings every connection it takes back into the pool, a round trip
//! each time. The store's hot paths (claims, batched completions, job
//! transactions) hand their connections back here instead and take them
//! again while they are fresh; a sweeper returns those left unused for a
//! second to the pool, so an idle store holds none for long.
//!
//! A job transaction's connection may come back still inside the empty
//! transaction its `COMMIT AND CHAIN` opened, for the next job to use
//! without a `BEGIN`; whenever such a connection leaves the stash for the
//! pool, its rollback is queued first (it goes out with the pool's ping).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{PgPool, Postgres, TransactionManager};
use tokio::task::JoinHandle;

/// How long a connection handed back stays in the stash unused.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// A connection handed back, and when.
struct Idle {
    conn: Option<PoolConnection<Postgres>>,
    since: Instant,
}

impl Idle {
    fn take(mut self) -> Option<PoolConnection<Postgres>> {
        self.conn.take()
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        // Back to the pool: out of any transaction first.
        if let Some(conn) = self.conn.as_mut() {
            end_transactions(conn);
        }
    }
}

/// Queues the rollback of whatever transactions sqlx counts on `conn`.
fn end_transactions(conn: &mut PoolConnection<Postgres>) {
    while PgTransactionManager::get_transaction_depth(conn) > 0 {
        PgTransactionManager::start_rollback(conn);
    }
}

/// Connections between uses, taken newest first.
pub(crate) struct Stash {
    pool: PgPool,
    idle: Mutex<Vec<Idle>>,
    capacity: usize,
}

impl std::fmt::Debug for Stash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stash")
            .field("idle", &self.lock().len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Stash {
    /// A stash over `pool` keeping at most half its connections, and the
    /// task that sweeps it (it ends when the stash is dropped).
    pub(crate) fn new(pool: PgPool) -> (Arc<Stash>, JoinHandle<()>) {
        let capacity = (pool.options().get_max_connections() as usize / 2).max(1);
        let stash = Arc::new(Stash {
            pool,
            idle: Mutex::new(Vec::new()),
            capacity,
        });
        let sweeper = tokio::spawn(sweep_until_dropped(Arc::downgrade(&stash)));
        (stash, sweeper)
    }

    /// A fresh connection from the stash, or one from the pool.
    pub(crate) async fn take(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let (fresh, stale) = {
            let mut idle = self.lock();
            let mut stale = Vec::new();
            let mut fresh = None;
            while let Some(entry) = idle.pop() {
                if entry.since.elapsed() < FRESH_FOR {
                    fresh = entry.take();
                    break;
                }
                stale.push(entry);
            }
            (fresh, stale)
        };
        // Back to the pool outside the lock.
        drop(stale);
        match fresh {
            Some(conn) => Ok(conn),
            None => self.pool.acquire().await,
        }
    }

    /// Hands back a connection that finished its statements cleanly: no
    /// transaction open, or only the empty one a `COMMIT AND CHAIN` opened.
    pub(crate) fn put(&self, mut conn: PoolConnection<Postgres>) {
        let mut idle = self.lock();
        if idle.len() < self.capacity {
            idle.push(Idle {
                conn: Some(conn),
                since: Instant::now(),
            });
        } else {
            // Beyond capacity: back to the pool.
            end_transactions(&mut conn);
        }
    }

    /// Returns the connections unused for `FRESH_FOR` to the pool.
    fn sweep(&self) {
        let stale: Vec<Idle> = {
            let mut idle = self.lock();
            let (stale, fresh) = std::mem::take(&mut *idle)
                .into_iter()
                .partition(|entry| entry.since.elapsed() >= FRESH_FOR);
            *idle = fresh;
            stale
        };
        drop(stale);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn sweep_until_dropped(stash: Weak<Stash>) {
    loop {
        tokio::time::sleep(FRESH_FOR).await;
        match stash.upgrade() {
            Some(stash) => stash.sweep(),
            None => return,
        }
    }
}
