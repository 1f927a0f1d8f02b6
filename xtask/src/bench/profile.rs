//! Where a job's time goes: each mode's drain on a cluster of its own with
//! pg_stat_statements loaded (its bookkeeping would tax every other
//! scenario), with the CPU per job of the worker, of Postgres and of the
//! rest of the machine, and the statements the worker sent, ranked by
//! their wall time in Postgres (on busy cores it includes waiting for one,
//! so it ranks the statements rather than splitting the CPU).

use anyhow::{Context, Result};
use sqlx::postgres::PgPoolOptions;

use super::cluster::warm_up;
use super::drain::{drain_beside, Beside, Statement, StoreSetup, LEASE, TRANSACTIONAL};
use super::report::Results;
use super::Sizes;
use crate::pg::{ClusterOptions, Postgres};

/// The statements listed for each mode, the most costly first.
const STATEMENTS_SHOWN: usize = 5;

/// Both modes' drains at 16 handlers, profiled.
pub(super) async fn where_the_time_goes(sizes: &Sizes, results: &mut Results) -> Result<()> {
    let mut pg = Postgres::start_local(ClusterOptions {
        durable: true,
        statements: true,
    })
    .context(
        "the profile runs on a cluster of its own with pg_stat_statements loaded, \
         started from the local PostgreSQL binaries (initdb, pg_ctl)",
    )?;
    pg.url = super::tls::without_tls(&pg.url);
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(100)
        .connect(&pg.url)
        .await
        .context("connecting to the profile's cluster")?;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .context(
            "creating pg_stat_statements in the profile's cluster (Debian's postgresql \
             package ships it; elsewhere install PostgreSQL's contrib modules)",
        )?;
    warm_up(&pool, sizes).await?;
    let modes: [(StoreSetup, &str); 2] = [
        (LEASE, "lease, 16 handlers"),
        (TRANSACTIONAL, "transactional, 16 handlers"),
    ];
    for (setup, mode) in modes {
        let n = sizes.drain_jobs;
        let drained = drain_beside(
            &pool,
            setup,
            16,
            n,
            Beside {
                statements: true,
                ..Beside::default()
            },
        )
        .await?;
        let per_job = |ms: f64| ms * 1000.0 / n as f64;
        let exec: f64 = drained.statements.iter().map(|s| per_job(s.exec_ms)).sum();
        let plan: f64 = drained.statements.iter().map(|s| per_job(s.plan_ms)).sum();
        let Some(cpu) = drained.cpu else {
            anyhow::bail!("the profile needs Linux's /proc to read CPU times");
        };
        results.add(
            "profile",
            format!("{mode}: worker"),
            cpu.worker_us,
            "µs/job",
            format!(
                "{:.0} in the kernel; {:.0} jobs/s, {n} jobs",
                cpu.worker_kernel_us, drained.jobs_per_second
            ),
        );
        results.add(
            "profile",
            format!("{mode}: Postgres"),
            cpu.postgres_us,
            "µs/job",
            format!(
                "{:.0} in the kernel; the statements' wall time {exec:.0} µs/job executing and \
                 {plan:.0} planning (waits for a core included, so not a part of the CPU)",
                cpu.postgres_kernel_us,
            ),
        );
        results.add(
            "profile",
            format!("{mode}: rest of machine"),
            cpu.rest_us,
            "µs/job",
            "the kernel's loopback work charged to no process, and other processes",
        );
        for statement in drained.statements.iter().take(STATEMENTS_SHOWN) {
            results.add(
                "profile",
                format!("{mode}: {}", label(statement)),
                per_job(statement.exec_ms + statement.plan_ms),
                "µs/job",
                format!(
                    "{:.3} calls/job, {:.1} rows/call, {:.1} µs/call, planning {:.1} µs/job",
                    statement.calls as f64 / n as f64,
                    statement.rows as f64 / statement.calls.max(1) as f64,
                    statement.exec_ms * 1000.0 / statement.calls.max(1) as f64,
                    per_job(statement.plan_ms)
                ),
            );
        }
    }
    Ok(())
}

/// A statement's text on one line, short enough for a row of the table,
/// without characters that would break a Markdown table.
fn label(statement: &Statement) -> String {
    const LONGEST: usize = 60;
    let flat = statement
        .query
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "¦")
        .replace('`', "'");
    if flat.chars().count() <= LONGEST {
        format!("`{flat}`")
    } else {
        let cut: String = flat.chars().take(LONGEST - 1).collect();
        format!("`{cut}…`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(query: &str) -> Statement {
        Statement {
            query: query.into(),
            calls: 1,
            rows: 1,
            exec_ms: 1.0,
            plan_ms: 0.0,
        }
    }

    #[test]
    fn a_label_is_one_line_of_at_most_sixty_characters_without_pipes() {
        let long = format!("SELECT a || b\n  FROM t WHERE {}", "x = 1 AND ".repeat(20));
        let shown = label(&statement(&long));
        assert_eq!(shown.chars().count(), 62, "{shown}");
        assert!(
            shown.starts_with("`SELECT a ¦¦ b FROM t WHERE x = 1"),
            "{shown}"
        );
        assert!(shown.ends_with("…`"), "{shown}");
        assert_eq!(label(&statement("COMMIT")), "`COMMIT`");
    }
}
