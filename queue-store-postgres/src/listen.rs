//! Wake-ups: LISTEN on a dedicated connection outside the pool.
//!
//! The insert trigger NOTIFYs the channel; Postgres delivers notifications
//! only after the inserting transaction commits, so workers never wake for
//! rows they cannot see. Workers also poll (their poll interval), which
//! covers notifications lost while the listener reconnects; while it is
//! down, no wait for news lasts longer than [`DEAF_WAIT`].
//!
//! The same connection listens for changes of the paused and limited
//! kinds (the kinds table's trigger, from its version 3), so that claims
//! go on the rules they read until one comes (see
//! [`PAUSES_HOLD`](crate::kinds::PAUSES_HOLD)).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::kinds::ClaimRules;

/// News of jobs for the workers of one store: the notifications received,
/// counted, and the count the latest claim started after. A worker whose
/// claim came back short waits only when no notification came since a
/// claim started: the job of one that came before is that claim's to see.
/// (A permit left on a `Notify` for a worker about to wait sent one claim
/// more after every notification, which found nothing when the claim the
/// notification woke had taken the job.)
#[derive(Default)]
pub(crate) struct Wake {
    notify: Notify,
    /// Notifications received so far.
    received: AtomicU64,
    /// The most notifications any claim had been sent after.
    seen: AtomicU64,
    /// The LISTEN connection is up: a notification can end a wait.
    listening: AtomicBool,
}

/// The longest a worker waits for news while the LISTEN connection is
/// down (at start-up, after the server restarted, behind a pooler that
/// drops it): nothing could end a longer wait early. After a 10 s server
/// restart, workers waited out their 5 s poll interval while the listener
/// reconnected, and completions resumed 4-5 s after the server was back.
pub(crate) const DEAF_WAIT: Duration = Duration::from_millis(500);

/// How long the listener's connection attempts may take before it says
/// the connection failed and tries again (sqlx's default of 30 s let its
/// own retries back off to 6 s apart).
const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl Wake {
    /// New jobs may be claimable: wakes every waiting worker, and the next
    /// wait of any other returns at once.
    pub(crate) fn all(&self) {
        self.received.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// A claim is about to be sent: it sees the jobs of every notification
    /// received so far (Postgres notifies only after the commit).
    pub(crate) fn claim_starts(&self) {
        self.seen
            .fetch_max(self.received.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// The LISTEN connection came up (`true`) or failed (`false`). A
    /// failure ends every wait, so that none outlasts [`DEAF_WAIT`].
    fn listening(&self, up: bool) {
        self.listening.store(up, Ordering::SeqCst);
        if !up {
            self.all();
        }
    }

    /// Waits for a notification that came after every claim so far was
    /// sent (returns at once if one already has), at most `max_wait`, or
    /// [`DEAF_WAIT`] while the LISTEN connection is down.
    pub(crate) async fn wait(&self, max_wait: Duration) {
        let max_wait = if self.listening.load(Ordering::SeqCst) {
            max_wait
        } else {
            max_wait.min(DEAF_WAIT)
        };
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Registered before the check, so that a notification between the
        // check and the wait still wakes this one.
        notified.as_mut().enable();
        if self.received.load(Ordering::SeqCst) > self.seen.load(Ordering::SeqCst) {
            return;
        }
        let _ = tokio::time::timeout(max_wait, notified).await;
    }
}

/// How often the listener looks again for the kinds table's trigger (and
/// its channel), at the first notification after: `queue migrate` may add
/// it while workers run, or the table be made anew under another oid.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Spawns the listener task; it runs until aborted, reconnecting after
/// errors. With `rules`, it also listens for their changes.
pub(crate) fn spawn(
    pool: &PgPool,
    channel: String,
    wake: Arc<Wake>,
    rules: Option<Arc<ClaimRules>>,
) -> JoinHandle<()> {
    // A pool of one connection, separate from the store's pool, so the
    // listener never takes a connection the workers need.
    // A connection that died under the listener (killed, server restarted)
    // is found dead by this hook and closed quietly, instead of by the
    // pool's own ping, which warns: the listener says itself that it
    // reconnected.
    let dedicated = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(LISTEN_CONNECT_TIMEOUT)
        .after_release(|conn, _| {
            Box::pin(async move {
                use sqlx::Connection;
                Ok(conn.ping().await.is_ok())
            })
        })
        .connect_lazy_with((*pool.connect_options()).clone());
    tokio::spawn(async move {
        // Said once per run of failures, and again when it is back.
        let mut failing = false;
        loop {
            let rules = rules.as_deref();
            if let Err(error) = listen(&dedicated, &channel, &wake, rules, &mut failing).await {
                if let Some(rules) = rules {
                    rules.watching(false);
                }
                wake.listening(false);
                if !failing {
                    tracing::warn!(%error, channel, "LISTEN connection failed; workers poll every {DEAF_WAIT:?} until it is back");
                } else {
                    tracing::debug!(%error, channel, "LISTEN connection still failing");
                }
                failing = true;
            }
            tokio::time::sleep(DEAF_WAIT).await;
        }
    })
}

/// The channel of the kinds table's changes the listener listens on, and
/// when it last looked for it.
struct Changes {
    channel: Option<String>,
    looked: std::time::Instant,
}

impl Changes {
    /// Looks for the channel of the kinds table's trigger and listens on
    /// it instead of the one before (if it changed); tells `rules` whether
    /// the listener now hears every change.
    async fn look(
        listener: &mut PgListener,
        rules: &ClaimRules,
        before: Option<String>,
    ) -> Result<Changes, sqlx::Error> {
        // A lookup that fails leaves the rules unwatched (read every
        // second, as before version 3); a dead connection fails the
        // listener's next step anyway.
        let channel = match rules.changes_channel(&mut *listener).await {
            Ok(channel) => channel,
            Err(error) => {
                tracing::debug!(%error, kinds = %rules.table(), "could not look for the channel of the kinds table's changes");
                None
            }
        };
        if channel != before {
            // Unwatched while the channels change: a change between the two
            // may be heard on neither.
            rules.watching(false);
            if let Some(old) = &before {
                listener.unlisten(old).await?;
            }
            if let Some(new) = &channel {
                listener.listen(new).await?;
                tracing::debug!(channel = new, kinds = %rules.table(), "listening for changes of the paused and limited kinds");
            }
        }
        rules.watching(channel.is_some());
        Ok(Changes {
            channel,
            looked: std::time::Instant::now(),
        })
    }
}

async fn listen(
    pool: &PgPool,
    channel: &str,
    wake: &Wake,
    rules: Option<&ClaimRules>,
    failing: &mut bool,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // The channel of changes first: the jobs' LISTEN is the connection's
    // last statement, by which an operator (or a test) finds it.
    let mut changes = match rules {
        Some(rules) => Some(Changes::look(&mut listener, rules, None).await?),
        None => None,
    };
    listener.listen(channel).await?;
    if std::mem::take(failing) {
        tracing::info!(channel, "LISTEN connection re-established");
    } else {
        tracing::debug!(channel, "listening for new jobs");
    }
    wake.listening(true);
    // Jobs may have arrived while no one listened.
    wake.all();
    loop {
        match listener.try_recv().await? {
            Some(notification) => {
                if let (Some(rules), Some(seen)) = (rules, changes.as_mut()) {
                    if seen.channel.as_deref() == Some(notification.channel()) {
                        // A pause lifted, or a limit raised, may free jobs
                        // too: the workers are woken below.
                        rules.forget();
                    }
                    rules.heard();
                    if seen.looked.elapsed() >= LOOK_AGAIN {
                        *seen = Changes::look(&mut listener, rules, seen.channel.take()).await?;
                    }
                }
                wake.all();
            }
            None => {
                // The connection dropped and was re-established by sqlx
                // (listening again on every channel): notifications in
                // between are lost, so look now, and read the rules again.
                tracing::info!(channel, "LISTEN connection re-established");
                if let (Some(rules), Some(seen)) = (rules, changes.as_ref()) {
                    rules.watching(false);
                    rules.watching(seen.channel.is_some());
                }
                wake.all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const LONG: Duration = Duration::from_secs(5);

    /// The news of a store whose LISTEN connection is up.
    fn listening() -> Wake {
        let wake = Wake::default();
        wake.listening(true);
        wake
    }

    /// How long `wake.wait(LONG)` took.
    async fn waited(wake: &Wake) -> Duration {
        let began = Instant::now();
        wake.wait(LONG).await;
        began.elapsed()
    }

    #[tokio::test]
    async fn a_notification_after_the_last_claim_began_ends_the_next_wait_at_once() {
        let wake = listening();
        wake.claim_starts();
        wake.all();
        assert!(waited(&wake).await < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_notification_the_last_claim_began_after_does_not_end_a_wait() {
        let wake = listening();
        wake.all();
        wake.claim_starts();
        let began = Instant::now();
        wake.wait(Duration::from_millis(200)).await;
        assert!(
            began.elapsed() >= Duration::from_millis(200),
            "the claim saw that notification's jobs: nothing new to wait for"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_notification_wakes_every_waiting_worker() {
        let wake = Arc::new(listening());
        wake.claim_starts();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let wake = wake.clone();
                tokio::spawn(async move { waited(&wake).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        wake.all();
        for waiter in waiters {
            assert!(waiter.await.unwrap() < Duration::from_secs(1));
        }
    }

    #[tokio::test]
    async fn with_the_listener_up_a_wait_lasts_as_long_as_asked() {
        let wake = listening();
        wake.claim_starts();
        let began = Instant::now();
        wake.wait(DEAF_WAIT * 2).await;
        assert!(began.elapsed() >= DEAF_WAIT * 2);
    }

    #[tokio::test]
    async fn while_the_listener_is_down_no_wait_outlasts_the_deaf_wait() {
        let wake = Wake::default();
        wake.claim_starts();
        let took = waited(&wake).await;
        assert!(
            took >= DEAF_WAIT && took < LONG / 2,
            "waited {took:?} with no listener, asked for {LONG:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listener_that_fails_ends_the_waits_in_progress() {
        let wake = Arc::new(listening());
        wake.claim_starts();
        let waiter = {
            let wake = wake.clone();
            tokio::spawn(async move { waited(&wake).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        wake.listening(false);
        assert!(waiter.await.unwrap() < DEAF_WAIT);
    }
}
