//! The `queue` operator commands, as a library so they can be tested: each
//! command writes to a passed-in `impl Write`.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use queue_store_postgres::JobTable;

/// Operate a job queue.
#[derive(Debug, Parser)]
#[command(name = "queue", version, about = "Operate a Postgres job queue")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version of the queue crates this binary was built with.
    Version,
    /// Create (or complete) the default jobs table: columns, indexes and the
    /// notify trigger. Idempotent.
    Migrate {
        /// The database.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        /// The schema of the table.
        #[arg(long, default_value = "public")]
        schema: String,
        /// The table name.
        #[arg(long, default_value = "queue_jobs")]
        table: String,
    },
}

/// Runs `cli`, writing its output to `out`.
pub async fn run(cli: Cli, out: &mut impl Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => writeln!(out, "queue {}", env!("CARGO_PKG_VERSION"))?,
        Command::Migrate {
            database_url,
            schema,
            table,
        } => {
            let table = JobTable::new(&schema, &table)?;
            let pool = sqlx::PgPool::connect(&database_url)
                .await
                .context("connecting to the database (check --database-url / DATABASE_URL)")?;
            table.migrate(&pool).await?;
            writeln!(out, "migrated {}", table.name())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn version_prints_the_crate_version() {
        let mut out = Vec::new();
        run(Cli::parse_from(["queue", "version"]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("queue {}\n", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn help_lists_the_commands() {
        let err = Cli::try_parse_from(["queue", "--help"]).unwrap_err();
        let help = err.to_string();
        assert!(
            help.contains("version") && help.contains("migrate"),
            "{help}"
        );
    }

    #[tokio::test]
    async fn migrate_creates_the_default_table() {
        let Some(url) = queue_core::testkit::database_url("migrate_creates_the_default_table")
        else {
            return;
        };
        let schema = format!("cli migrate {}", std::process::id());
        let args = [
            "queue",
            "migrate",
            "--database-url",
            &url,
            "--schema",
            &schema,
        ];
        for _ in 0..2 {
            let mut out = Vec::new();
            run(Cli::parse_from(args), &mut out).await.unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("migrated \"{schema}\".\"queue_jobs\"\n"),
                "migrate is idempotent"
            );
        }
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let exists: bool = sqlx::query_scalar(
            "SELECT to_regclass(format('%I.%I', $1::text, 'queue_jobs')) IS NOT NULL",
        )
        .bind(&schema)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(exists);
    }
}
