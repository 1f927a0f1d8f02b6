//! Which protocol the bench's clients speak: plain text unless the URL
//! says otherwise ([`without_tls`]); and the lease drain over TLS against
//! the same drain in plain text, alternating on one server. sqlx-core
//! 0.9.0 left Nagle's algorithm on, and over TLS every batched completion
//! (longer than one TLS record) then waited for the server's delayed
//! acknowledgement: the drain ran at a third of its plain rate
//! (vendor/README.md). This keeps that in view.

use anyhow::Result;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::alternating::rotating;
use super::drain::{drain, LEASE};
use super::report::{rows, Results};
use super::Sizes;

/// `url` with TLS turned off, unless it names an `sslmode` itself. Every
/// client of the bench connects through it: this queue's pool, `queue
/// serve`, the peers and pgbench. Under the default `sslmode=prefer`, a
/// client built with TLS speaks it to a server that offers it (the
/// throwaway cluster does), and one built without does not, so the same
/// drain measured two costs (graphile_worker's cold drain of 20,000 jobs
/// 18,200 jobs/s with TLS and 26,500 without), and pgbench, through libpq,
/// took the ceiling with TLS (10,500 and 10,800 tps against 11,700 and
/// 11,600 without) where this queue's drains ran without. TLS is measured
/// apart, in `drain-tls` ([`lease_drain_over_tls`]).
pub(super) fn without_tls(url: &str) -> String {
    if url.contains("sslmode=") {
        return url.to_owned();
    }
    with_sslmode(url, "disable")
}

/// `url` with its `sslmode` set to `mode`, replacing one it names.
fn with_sslmode(url: &str, mode: &str) -> String {
    if let Some(start) = url.find("sslmode=") {
        let value = start + "sslmode=".len();
        let end = url[value..].find('&').map_or(url.len(), |i| value + i);
        return format!("{}{mode}{}", &url[..value], &url[end..]);
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode={mode}")
}

/// The lease drain at 16 handlers through `pool` (the bench's, plain unless
/// its URL names a mode) and through a pool of the same shape connected
/// with `sslmode=require`, alternating for up to three rounds, medians.
/// Without a TLS connection to the server (one that offers none), it is
/// reported and skipped.
pub(super) async fn lease_drain_over_tls(
    url: &str,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let tls_url = with_sslmode(url, "require");
    let tls_pool = match PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(100)
        .connect(&tls_url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => {
            println!("drain-tls: not measured, no TLS connection to the server: {e}");
            return Ok(());
        }
    };
    let pools = [pool, &tls_pool];
    let [plain, tls] = rotating("TLS drains", sizes.rounds.min(3), |which| {
        let pool = pools[which];
        async move {
            Ok(drain(pool, LEASE, 16, sizes.drain_jobs)
                .await?
                .jobs_per_second)
        }
    })
    .await?;
    results.add_median("drain", rows::LEASE_PLAIN_BESIDE_TLS, "jobs/s", &plain);
    results.add_median("drain", rows::LEASE_TLS, "jobs/s", &tls);
    tls_pool.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{with_sslmode, without_tls};

    /// Every client of the bench (this queue, `queue serve`, the peers,
    /// pgbench) gets the same URL, plain unless it says otherwise.
    #[test]
    fn the_bench_connects_without_tls_unless_the_url_says_otherwise() {
        assert_eq!(
            without_tls("postgres://u@h:5/db"),
            "postgres://u@h:5/db?sslmode=disable"
        );
        assert_eq!(
            without_tls("postgres://u@h:5/db?application_name=x"),
            "postgres://u@h:5/db?application_name=x&sslmode=disable"
        );
        assert_eq!(
            without_tls("postgres://u@h:5/db?sslmode=require"),
            "postgres://u@h:5/db?sslmode=require"
        );
    }

    #[test]
    fn sslmode_is_added_or_replaced() {
        let url = "postgres://u@h:5432/db";
        assert_eq!(
            with_sslmode(url, "require"),
            format!("{url}?sslmode=require")
        );
        assert_eq!(
            with_sslmode(&format!("{url}?application_name=a"), "require"),
            format!("{url}?application_name=a&sslmode=require")
        );
        assert_eq!(
            with_sslmode(
                &format!("{url}?sslmode=disable&application_name=a"),
                "require"
            ),
            format!("{url}?sslmode=require&application_name=a")
        );
        assert_eq!(
            with_sslmode(&format!("{url}?a=b&sslmode=prefer"), "disable"),
            format!("{url}?a=b&sslmode=disable")
        );
    }
}
