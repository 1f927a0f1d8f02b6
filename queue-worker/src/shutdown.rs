//! Shutdown signals: a [`CancellationToken`] that fires on SIGINT or SIGTERM.

use queue_core::CancellationToken;

/// A token that is cancelled when the process receives SIGINT (Ctrl-C) or,
/// on Unix, SIGTERM. Pass it to [`Worker::run`](crate::Worker::run) and
/// [`Resetter::run`](crate::Resetter::run) for a graceful shutdown.
///
/// Must be called inside a Tokio runtime.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received; stopping gracefully");
        fire.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the worker");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
