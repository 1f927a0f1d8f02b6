//! Connections the store keeps between its own statements.
//!
//! sqlx pings every connection it takes back into the pool, a round trip
//! each time. The store's hot paths (claims, batched completions, job
//! transactions, the read of the next due time whenever the claim loop
//! pauses) hand their connections back here instead and take them
//! again while they are fresh; a sweeper returns those left unused for a
//! second to the pool, so an idle store holds at most one for long: the
//! newest, kept warm for a minute while the pool has other connections to
//! give ([`WARM_FOR`]).
//!
//! A job transaction's connection may come back still inside the empty
//! transaction its `COMMIT AND CHAIN` opened ("chained"), for the next job
//! to use without a `BEGIN`: job transactions take chained connections
//! first, every other statement clean ones first. Whenever a chained
//! connection goes elsewhere, its rollback is queued first (it goes out with
//! the connection's next statement, or the pool's ping).
//!
//! The stash also remembers which connections hold the job transaction's
//! prepared statements ([`Lent::prepared`]), so a job on one of them sends
//! no `PREPARE`, and a job on any other prepares them without provoking an
//! error on the server (see [`crate::job_transaction`]).
//!
//! A connection whose backend died while it waited here (killed, server
//! restarted) would make sqlx warn when it pings it back into the pool; the
//! stash pings stale connections itself and closes the dead ones quietly,
//! and a connection whose statement failed for its connection is closed,
//! not pinged ([`Stash::put_after`]).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use sqlx_core::transaction::TransactionManager;

use queue_core::StoreError;

use crate::error::store_error;

/// How long a connection handed back stays in the stash unused.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// How long the newest connection stays in the stash unused, outside a
/// transaction, while the pool has another connection idle or room for
/// one: the claim of a worker woken after a quiet second takes it, instead
/// of a connection from the pool that must answer a ping first (a round
/// trip on an idle backend) and may never have prepared the claim (one
/// more).
const WARM_FOR: Duration = Duration::from_secs(60);

/// A connection lent out by the stash.
#[derive(Debug)]
pub(crate) struct Lent {
    pub conn: PoolConnection<Postgres>,
    /// Whether the connection is known to hold the job transaction's
    /// prepared statements (a connection new to the stash may hold them
    /// too; preparing them again is harmless).
    pub prepared: bool,
}

impl Lent {
    /// A connection from the pool, of which nothing is known.
    fn pooled(conn: PoolConnection<Postgres>) -> Lent {
        Lent {
            conn,
            prepared: false,
        }
    }
}

/// A connection handed back, and when.
struct Idle {
    conn: Option<PoolConnection<Postgres>>,
    prepared: bool,
    since: Instant,
}

impl Idle {
    fn take(mut self) -> Option<Lent> {
        let prepared = self.prepared;
        self.conn.take().map(|conn| Lent { conn, prepared })
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

impl Drop for Stash {
    fn drop(&mut self) {
        // A dropped store's connections go back to the pool pinged, like
        // stale ones: one whose backend died closes quietly instead of
        // failing the pool's own ping with a warning.
        let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
        retire(std::mem::take(idle));
    }
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
    pub(crate) async fn take(&self) -> Result<Lent, sqlx::Error> {
        let mut lent = self.take_preferring(false).await?;
        end_transactions(&mut lent.conn);
        Ok(lent)
    }

    /// For a job's transaction: a fresh chained connection if there is one,
    /// else a clean one, else one from the pool.
    pub(crate) async fn take_for_job(&self) -> Result<Lent, sqlx::Error> {
        self.take_preferring(true).await
    }

    /// A live connection from the pool (see [`live_from_pool`]), for a
    /// statement to try again after its connection failed.
    pub(crate) async fn take_new(&self) -> Result<Lent, sqlx::Error> {
        live_from_pool(&self.pool).await.map(Lent::pooled)
    }

    /// The newest fresh connection that is `chained` or not as asked, else
    /// the newest fresh one, else one from the pool; stale ones go back to
    /// the pool.
    async fn take_preferring(&self, chained: bool) -> Result<Lent, sqlx::Error> {
        let (fresh, stale) = {
            let mut idle = self.lock();
            // The warm one, if kept, is taken at once: the pool loses
            // nothing by it.
            let stale = stale_of(&mut idle, true);
            let pick = idle
                .iter()
                .rposition(|entry| entry.chained() == chained)
                .or_else(|| idle.len().checked_sub(1));
            (pick.and_then(|i| idle.remove(i).take()), stale)
        };
        retire(stale);
        match fresh {
            Some(lent) => Ok(lent),
            None => self.take_new().await,
        }
    }

    /// A stashed connection (or a live one from the pool) for a statement
    /// the store runs often: handed back with [`Stashed::put_back`], or,
    /// after a failure, [`Stashed::replace_after`].
    pub(crate) async fn lend(&self, context: &'static str) -> Result<Stashed<'_>, StoreError> {
        let lent = self.take().await.map_err(|e| store_error(context, e))?;
        Ok(Stashed {
            stash: self,
            lent,
            context,
            replaced: false,
        })
    }

    /// Hands back a connection that finished its statements cleanly: no
    /// transaction open, or only the empty one a `COMMIT AND CHAIN` opened.
    pub(crate) fn put(&self, lent: Lent) {
        let Lent { conn, prepared } = lent;
        let entry = Idle {
            conn: Some(conn),
            prepared,
            since: Instant::now(),
        };
        let mut idle = self.lock();
        if idle.len() < self.capacity {
            idle.push(entry);
        } else {
            // Beyond capacity: back to the pool, pinged first so that one
            // whose backend died is closed quietly. (Sent straight back,
            // CI under backend kills logged 3 of sqlx's on-release
            // warnings per run, over the fault tests' budget of 2.)
            drop(idle);
            retire(vec![entry]);
        }
    }

    /// Returns a connection to the pool out of any transaction, pinged
    /// first like a stale one (one whose backend died is closed quietly):
    /// for a connection whose last statement failed, or whose attempt was
    /// given up without a word (a job handle dropped with its transaction
    /// open).
    pub(crate) fn return_checked(&self, lent: Lent) {
        retire(vec![Idle {
            conn: Some(lent.conn),
            prepared: lent.prepared,
            since: Instant::now(),
        }]);
    }

    /// Hands back a connection whose statement failed with `error`: closed
    /// if the connection itself failed ([`StoreError::Unavailable`], see
    /// [`crate::error::is_connection_fault`]), else to the pool, out of any
    /// transaction, pinged first (an error that does not say so may still
    /// have come from a connection that died). Returns whether the
    /// connection failed, so the caller may run the statement again on
    /// another.
    pub(crate) fn put_after(&self, lent: Lent, error: &StoreError) -> bool {
        let connection_failed = matches!(error, StoreError::Unavailable { .. });
        if connection_failed {
            let mut conn = lent.conn;
            end_transactions(&mut conn);
            conn.close_on_drop();
        } else {
            self.return_checked(lent);
        }
        connection_failed
    }

    /// Returns the connections unused for [`FRESH_FOR`] to the pool, but
    /// the one kept warm while the pool can spare it ([`WARM_FOR`]). A
    /// pool being closed spares none: its `close()` waits for every
    /// connection, and must not wait for the warm one.
    fn sweep(&self) {
        let spare = !self.pool.is_closed()
            && (self.pool.num_idle() > 0
                || self.pool.size() < self.pool.options().get_max_connections());
        let stale = stale_of(&mut self.lock(), spare);
        retire(stale);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes out of `idle` (oldest first, as handed back) the connections no
/// longer to be lent: those unused for [`FRESH_FOR`], but, if `keep_warm`
/// and no fresher one is left, the newest, while it is younger than
/// [`WARM_FOR`] and outside a transaction (a chained one would keep its
/// transaction open that long).
fn stale_of(idle: &mut Vec<Idle>, keep_warm: bool) -> Vec<Idle> {
    let first_fresh = idle.partition_point(|entry| entry.since.elapsed() >= FRESH_FOR);
    let mut stale: Vec<Idle> = idle.drain(..first_fresh).collect();
    if keep_warm && idle.is_empty() {
        if let Some(newest) = stale.pop() {
            if newest.since.elapsed() < WARM_FOR && !newest.chained() {
                idle.push(newest);
            } else {
                stale.push(newest);
            }
        }
    }
    stale
}

/// A connection lent by [`Stash::lend`].
pub(crate) struct Stashed<'s> {
    stash: &'s Stash,
    lent: Lent,
    context: &'static str,
    /// Whether this connection already replaced one that had died.
    replaced: bool,
}

impl<'s> Stashed<'s> {
    /// The connection to run the statement on.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        &mut self.lent.conn
    }

    /// Hands the connection back: its statements finished cleanly.
    pub(crate) fn put_back(self) {
        self.stash.put(self.lent);
    }

    /// Hands the connection back after its statement failed with `error`
    /// (closed if the connection itself failed). A first connection that
    /// died (its backend killed while it waited) is replaced by a live one,
    /// to run the statement on again; otherwise `error` stands.
    pub(crate) async fn replace_after(self, error: StoreError) -> Result<Stashed<'s>, StoreError> {
        let Stashed {
            stash,
            lent,
            context,
            replaced,
        } = self;
        if !stash.put_after(lent, &error) || replaced {
            return Err(error);
        }
        let lent = stash
            .take_new()
            .await
            .map_err(|e| store_error(context, e))?;
        Ok(Stashed {
            stash,
            lent,
            context,
            replaced: true,
        })
    }
}

/// A statement's connections from a pool: if the first turns out dead (its
/// backend killed while it idled in the pool), it is closed and the
/// statement runs once more on a live one. For the store's periodic
/// statements outside the stash (heartbeats, log entries, resets, clock
/// readings): a fault that killed an idle connection neither fails them nor
/// makes sqlx warn when the dead connection goes back to the pool.
///
/// ```text
/// let mut tries = OnLiveConnection::new(pool, context);
/// let rows = loop {
///     let mut conn = tries.connection().await?;
///     let done = statement.fetch_all(&mut *conn).await.map_err(|e| store_error(context, e));
///     if let Some(done) = tries.settle(conn, done) { break done?; }
/// };
/// ```
pub(crate) struct OnLiveConnection<'p> {
    pool: &'p PgPool,
    context: &'static str,
    /// Connections handed out so far.
    tries: u8,
}

impl<'p> OnLiveConnection<'p> {
    pub(crate) fn new(pool: &'p PgPool, context: &'static str) -> Self {
        OnLiveConnection {
            pool,
            context,
            tries: 0,
        }
    }

    /// The pool's next connection; after a dead one, one that answered a
    /// ping.
    pub(crate) async fn connection(&mut self) -> Result<PoolConnection<Postgres>, StoreError> {
        let conn = if self.tries == 0 {
            self.pool.acquire().await
        } else {
            live_from_pool(self.pool).await
        };
        self.tries = self.tries.saturating_add(1);
        conn.map_err(|e| store_error(self.context, e))
    }

    /// What the statement on `conn` came to: `None` to run it again (the
    /// first connection was dead, and is closed), else its result (a
    /// connection that failed is closed rather than pinged back into the
    /// pool).
    pub(crate) fn settle<T>(
        &mut self,
        mut conn: PoolConnection<Postgres>,
        done: Result<T, StoreError>,
    ) -> Option<Result<T, StoreError>> {
        if !matches!(done, Err(StoreError::Unavailable { .. })) {
            return Some(done);
        }
        conn.close_on_drop();
        // Only a dead first connection earns a second try.
        (self.tries > 1).then_some(done)
    }
}

/// A connection from `pool` that answered a ping: dead ones (whatever
/// killed one connection may have killed the pool's idle ones too, and a
/// pool that does not test before acquiring hands them out as they are) are
/// closed; after as many as the pool holds, the last error.
async fn live_from_pool(pool: &PgPool) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let mut tries = pool.options().get_max_connections() + 1;
    loop {
        let mut conn = pool.acquire().await?;
        match conn.ping().await {
            Ok(()) => return Ok(conn),
            Err(error) => {
                conn.close_on_drop();
                tries -= 1;
                if tries == 0 {
                    return Err(error);
                }
            }
        }
    }
}

/// Returns stale connections to the pool, each pinged first: one whose
/// backend died meanwhile is closed here, quietly, rather than failing the
/// pool's own ping on release with a warning.
fn retire(stale: Vec<Idle>) {
    if stale.is_empty() {
        return;
    }
    // Outside a runtime (a store dropped at exit) there is no pinging:
    // they go back to the pool as they are.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        for entry in stale {
            let Some(Lent { mut conn, .. }) = entry.take() else {
                continue;
            };
            end_transactions(&mut conn);
            if conn.ping().await.is_err() {
                conn.close_on_drop();
            }
        }
    });
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
