//! Shared by the CLI's tests: the test database, a fresh schema per test
//! (with an awkward name, so every command also exercises quoting), a
//! config file for it, and the `queue` binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use assert_cmd::Command;
use sqlx::PgPool;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A test's database, schema and config file.
pub struct Setup {
    pub url: String,
    pub pool: PgPool,
    /// The schema, unquoted.
    pub schema: String,
    /// The schema, quoted for SQL.
    pub s: String,
    pub dir: tempfile::TempDir,
}

impl Setup {
    /// `None` (announced) without a test database.
    pub async fn new(test: &str) -> Option<Setup> {
        let url = queue_core::testkit::database_url(test)?;
        let pool = PgPool::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{test}: cannot connect to DATABASE_URL: {e}"));
        let schema = format!(
            "cli \"S\" select {}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let s = format!("\"{}\"", schema.replace('"', "\"\""));
        // A schema of the same name left by an earlier run whose process
        // had the same id: its rows must not leak into this test.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {s} CASCADE"
        )))
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("{test}: dropping a stale schema: {e}"));
        Some(Setup {
            url,
            pool,
            schema,
            s,
            dir: tempfile::tempdir().expect("a temporary directory"),
        })
    }

    /// Writes a config file naming this test's schema, then `rest`.
    pub fn config(&self, rest: &str) -> PathBuf {
        let path = self.dir.path().join("queue.toml");
        let schema = self.schema.replace('\\', "\\\\").replace('"', "\\\"");
        std::fs::write(&path, format!("schema = \"{schema}\"\n{rest}")).expect("config file");
        path
    }

    /// `queue --config <config> ARGS` against the test database.
    pub fn queue(&self, config: &PathBuf, args: &[&str]) -> Command {
        let mut command = Command::cargo_bin("queue").expect("the queue binary");
        command
            .env("DATABASE_URL", &self.url)
            .env_remove("QUEUE_CONFIG")
            .env_remove("RUST_LOG")
            .arg("--config")
            .arg(config)
            .args(args);
        command
    }

    /// Runs SQL (several statements) in the test database.
    pub async fn sql(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Standard output of a command that must succeed.
pub fn ok(command: &mut Command) -> String {
    let output = command.output().expect("the queue binary runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// Standard error of a command that must fail, which must be one line.
pub fn fails(command: &mut Command) -> String {
    let output = command.output().expect("the queue binary runs");
    assert!(
        !output.status.success(),
        "{command:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    let stderr = String::from_utf8(output.stderr).expect("utf-8 output");
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("queue: "), "{stderr}");
    last
}

/// Standard output parsed as JSON.
pub fn json(command: &mut Command) -> serde_json::Value {
    let text = ok(command);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}
