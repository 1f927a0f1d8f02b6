//! Wake-ups: LISTEN on a dedicated connection outside the pool.
//!
//! The insert trigger NOTIFYs the channel; Postgres delivers notifications
//! only after the inserting transaction commits, so workers never wake for
//! rows they cannot see. Workers also poll (their poll interval), which
//! covers notifications lost while the listener reconnects.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Wakes every waiting worker, and leaves a permit for one about to wait.
pub(crate) fn wake_all(wake: &Notify) {
    wake.notify_waiters();
    wake.notify_one();
}

/// Spawns the listener task; it runs until aborted, reconnecting after
/// errors.
pub(crate) fn spawn(pool: &PgPool, channel: String, wake: Arc<Notify>) -> JoinHandle<()> {
    // A pool of one connection, separate from the store's pool, so the
    // listener never takes a connection the workers need.
    // A connection that died under the listener (killed, server restarted)
    // is found dead by this hook and closed quietly, instead of by the
    // pool's own ping, which warns: the listener says itself that it
    // reconnected.
    let dedicated = PgPoolOptions::new()
        .max_connections(1)
        .after_release(|conn, _| {
            Box::pin(async move {
                use sqlx::Connection;
                Ok(conn.ping().await.is_ok())
            })
        })
        .connect_lazy_with((*pool.connect_options()).clone());
    tokio::spawn(async move {
        loop {
            match listen(&dedicated, &channel, &wake).await {
                Ok(()) => {}
                Err(error) => {
                    tracing::warn!(%error, channel, "LISTEN connection failed; workers fall back to polling until it is back");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

async fn listen(pool: &PgPool, channel: &str, wake: &Notify) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    tracing::debug!(channel, "listening for new jobs");
    // Jobs may have arrived while no one listened.
    wake_all(wake);
    loop {
        match listener.try_recv().await? {
            Some(_) => wake_all(wake),
            None => {
                // The connection dropped and was re-established by sqlx:
                // notifications in between are lost, so look now.
                tracing::info!(channel, "LISTEN connection re-established");
                wake_all(wake);
            }
        }
    }
}
