//! Connections the store keeps between its own statements.
//!
//! sqlx pings every connection it takes back into the pool, a round trip
//! each time. The store's hot paths (claims, batched completions, job
//! transactions) hand their connections back here instead and take them
//! again while they are fresh; a sweeper returns those left unused for a
//! second to the pool, so an idle store holds none for long.
//!
//! A job transaction's connection may come back still inside the empty
//! transaction its `COMMIT AND CHAIN` opened ("chained"), for the next job
//! to use without a `BEGIN`: job transactions take chained connections
//! first, every other statement clean ones first. Whenever a chained
//! connection goes elsewhere, its rollback is queued first (it goes out with
//! the connection's next statement, or the pool's ping).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{PgPool, Postgres, TransactionManager};

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

    fn chained(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|conn| PgTransactionManager::get_transaction_depth(conn) > 0)
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
    /// A stash over `pool` keeping at most half its connections, swept
    /// until it is dropped.
    pub(crate) fn new(pool: PgPool) -> Arc<Stash> {
        let capacity = (pool.options().get_max_connections() as usize / 2).max(1);
        let stash = Arc::new(Stash {
            pool,
            idle: Mutex::new(Vec::new()),
            capacity,
        });
        tokio::spawn(sweep_until_dropped(Arc::downgrade(&stash)));
        stash
    }

    /// A fresh connection out of any transaction (a chained one only if
    /// none is clean, its transaction then rolled back), or one from the
    /// pool.
    pub(crate) async fn take(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let mut conn = self.take_preferring(false).await?;
        end_transactions(&mut conn);
        Ok(conn)
    }

    /// For a job's transaction: a fresh chained connection if there is one,
    /// else a clean one, else one from the pool.
    pub(crate) async fn take_for_job(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        self.take_preferring(true).await
    }

    /// The newest fresh connection that is `chained` or not as asked, else
    /// the newest fresh one, else one from the pool; stale ones go back to
    /// the pool.
    async fn take_preferring(
        &self,
        chained: bool,
    ) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let (fresh, stale) = {
            let mut idle = self.lock();
            let first_stale = idle.partition_point(|entry| entry.since.elapsed() >= FRESH_FOR);
            let stale: Vec<Idle> = idle.drain(..first_stale).collect();
            let pick = idle
                .iter()
                .rposition(|entry| entry.chained() == chained)
                .or_else(|| idle.len().checked_sub(1));
            (pick.and_then(|i| idle.remove(i).take()), stale)
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
