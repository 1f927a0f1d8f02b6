//! `cargo xtask test-pg`: every test of the workspace, with a real Postgres.
//!
//! The server comes from [`crate::pg`]. Tests read `DATABASE_URL`, and
//! `QUEUE_TEST_REQUIRE_POSTGRES=1` turns a missing database into a failure
//! instead of an announced skip, so under test-pg no Postgres test is ever
//! skipped. After the tests, the HTTP API is fuzzed from its OpenAPI
//! document on the same server ([`crate::fuzz_api`]), and the dashboard
//! is driven in headless Chromium ([`crate::dashboard_test`]), and
//! PostgreSQL is stopped mid-drain ([`crate::faults`]).

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::pg::{ClusterOptions, Postgres};

pub async fn run(extra: &[String]) -> Result<()> {
    let pg = Postgres::start(ClusterOptions {
        durable: false,
        statements: false,
    })
    .await?;
    eprintln!("test-pg: Postgres from {}", pg.origin);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["test", "--workspace"])
        .args(extra)
        .env("DATABASE_URL", &pg.url)
        .env("QUEUE_TEST_REQUIRE_POSTGRES", "1");
    if pg.tls {
        // The cluster serves TLS: the TLS test must run, not skip.
        command.env("QUEUE_TEST_REQUIRE_TLS", "1");
    }
    let status = tokio::task::spawn_blocking(move || command.status())
        .await?
        .context("running cargo test")?;
    if !status.success() {
        drop(pg);
        bail!("tests failed ({status})");
    }
    // The diesel features: their test and the doctests of docs/diesel.md,
    // built only here so that normal builds never compile diesel.
    for target in [&["--test", "diesel"][..], &["--doc"]] {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .args([
                "test",
                "-p",
                "queue-store-postgres",
                "--features",
                "diesel,diesel-async",
            ])
            .args(target)
            .env("DATABASE_URL", &pg.url)
            .env("QUEUE_TEST_REQUIRE_POSTGRES", "1");
        let status = tokio::task::spawn_blocking(move || command.status())
            .await?
            .context("running cargo test with the diesel features")?;
        if !status.success() {
            drop(pg);
            bail!("the diesel features' tests failed ({status})");
        }
    }
    // The HTTP API, fuzzed from its OpenAPI document on the same server.
    let url = pg.url.clone();
    let fuzzed = tokio::task::spawn_blocking(move || crate::fuzz_api::run(&url, 60)).await?;
    if fuzzed.is_err() {
        drop(pg);
        return fuzzed;
    }
    // The dashboard, in headless Chromium.
    let browsed =
        crate::dashboard_test::run(&pg.url, &crate::dashboard_test::default_shots()).await;
    drop(pg);
    browsed?;
    // Faults: PostgreSQL stopped mid-drain, on clusters of their own.
    crate::faults::run(&[]).await
}
