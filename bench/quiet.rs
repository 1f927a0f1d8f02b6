//! Quiet before a latency scenario, shared by `cargo xtask bench` and the
//! peers it measures (`bench/peers`), so that every queue's wake latency is
//! measured alike: on a server that is not vacuuming or checkpointing the
//! rows of the scenarios before.

use std::time::Duration;

/// `VACUUM ANALYZE` the database (so that no autovacuum of an earlier
/// scenario's rows starts during the next one), `CHECKPOINT` (so that none
/// is due during it), then a second's pause. Wake latency measured right
/// after the enqueue scenario, without this, had a p99 of 2.4-4.8 ms
/// against 1.3-1.7 ms alone.
pub async fn quiesce(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("VACUUM ANALYZE").execute(pool).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    Ok(())
}
