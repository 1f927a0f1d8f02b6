//! The `queue` operator commands, as a library so they can be tested: each
//! command writes to a passed-in `impl Write`.
//!
//! Every command but `migrate` and `version` runs over the admin contract
//! ([`queue_core::Admin`]), so it works the same on the default table and
//! on a foreign table a config file describes ([`PgConfig`]).

mod args;
mod commands;
pub mod output;
mod schedules;
pub mod serve;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use queue_core::Admin;
use queue_store_postgres::{PgConfig, PgKeyType};
use sqlx::postgres::PgPoolOptions;
use sqlx::ConnectOptions as _;
use sqlx::PgPool;

pub use crate::args::FilterArgs;
use crate::commands::{audit, bulk, enqueue, limits, maintenance, migrate, ops, pause, read};

/// Operate a job queue.
#[derive(Debug, Parser)]
#[command(
    name = "queue",
    version,
    about = "Look at and repair a Postgres job queue: the default table, or your own table described by a config file"
)]
pub struct Cli {
    /// A TOML file describing the table (see docs/cli.md); without one,
    /// the default table public.queue_jobs.
    #[arg(long, global = true, env = "QUEUE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The database; else DATABASE_URL, else the config file's
    /// database_url. `sslmode=require` works.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// More log output on standard error (-v: info, -vv: debug); warnings
    /// are always shown.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Answer yes to confirmations (needed for bulk changes when standard
    /// input is not a terminal).
    #[arg(short = 'y', long, global = true)]
    pub yes: bool,
    /// Who is acting, as the audit log and pauses record it; default: the
    /// OS user.
    #[arg(long, global = true, env = "QUEUE_ACTOR", value_name = "NAME")]
    pub actor: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Counts of jobs per state and kind, the oldest waiting job's age and
    /// the stalled jobs.
    Stats(read::StatsArgs),
    /// A page of jobs, newest first.
    List(read::ListArgs),
    /// One job, every column.
    Show(read::ShowArgs),
    /// Add a job of KIND with a JSON payload, or many from NDJSON on
    /// standard input (one payload per line) with `-`.
    Enqueue(enqueue::EnqueueArgs),
    /// Make failed, errored or canceled jobs queued and due now: by key, or
    /// every job matching a filter.
    Retry(bulk::RetryArgs),
    /// Cancel jobs: waiting ones end canceled, running ones are asked to
    /// stop. By key, or every job matching a filter.
    Cancel(bulk::BulkArgs),
    /// Delete jobs, by key or every job matching a filter.
    Delete(bulk::BulkArgs),
    /// Fail jobs now with a reason, running ones included: each running
    /// attempt is fenced out (its late completion changes nothing). By key,
    /// or every job matching a filter.
    Fail(bulk::FailArgs),
    /// Reset stalled jobs once, as the resetter does.
    ResetStalled(maintenance::ResetArgs),
    /// Delete finished jobs older than an age, in batches.
    Purge(maintenance::PurgeArgs),
    /// Pause a kind: no worker claims its jobs until it is resumed. The
    /// pause is kept in the database, for every worker process.
    Pause(pause::PauseArgs),
    /// Resume a paused kind: workers claim its jobs again.
    Resume(pause::ResumeArgs),
    /// The paused kinds: since when, and by whom.
    Paused,
    /// Limit a kind, in every worker process together: how many of its
    /// jobs run at once (--concurrency), how many start per second (--rate,
    /// --burst); or --clear its limits.
    Limit(limits::LimitArgs),
    /// The kinds with limits.
    Limits,
    /// The audit log, newest first: every write of the CLI and the HTTP
    /// API, who made it, on which jobs, and how it ended.
    Audit(audit::AuditArgs),
    /// Bulk operations by filter (retry, cancel, fail, delete, purge):
    /// list them, show or follow one, abort one, or resume one here.
    Ops(ops::OpsArgs),
    /// Create or upgrade the default jobs table, or the tables the store
    /// keeps beside a table of your own (the bookkeeping table a config
    /// file names, the kinds table where pauses are kept): versioned
    /// migrations.
    Migrate(migrate::MigrateArgs),
    /// Serve the HTTP API (OpenAPI document at /openapi.json) and
    /// Prometheus metrics at /metrics.
    Serve(serve::ServeArgs),
    /// Print the version of the queue crates this binary was built with.
    Version,
}

/// What every command gets besides its own arguments.
pub(crate) struct Context {
    pub config: PgConfig,
    pub json: bool,
    pub yes: bool,
    /// Who is acting: `--actor`, else the OS user.
    pub actor: String,
}

impl Context {
    /// Whether a person is at the terminal to answer a confirmation.
    pub fn interactive(&self) -> bool {
        std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
    }

    /// Asks `question` on the terminal; `--yes` answers it. Without a
    /// terminal and without `--yes`, refuses.
    pub fn confirm(&self, question: &str) -> Result<bool> {
        if self.yes {
            return Ok(true);
        }
        if !self.interactive() {
            anyhow::bail!(
                "not confirmed: {} Standard input is not a terminal, so pass --yes to go ahead",
                question.replace('?', ".")
            );
        }
        eprint!("{question} [y/N] ");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
    }
}

/// What a job key must support to be named on the command line and printed.
pub trait CliKey:
    FromStr<Err: std::fmt::Display>
    + std::fmt::Display
    + serde::Serialize
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> CliKey for T
where
    T: FromStr + std::fmt::Display + serde::Serialize + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Display,
{
}

/// A store's admin contract whose keys the CLI can read and print.
pub trait CliAdmin: Admin<Id: CliKey> {}

impl<A> CliAdmin for A where A: Admin<Id: CliKey> {}

/// Runs `cli`, writing its output to `out`.
pub async fn run(cli: Cli, out: &mut impl Write) -> Result<()> {
    let config = match &cli.config {
        Some(path) => PgConfig::load(path)?,
        None => PgConfig::default(),
    };
    let context = Context {
        json: cli.json,
        yes: cli.yes,
        config,
        actor: actor(cli.actor.as_deref())?,
    };
    if let Command::Version = cli.command {
        let version = env!("CARGO_PKG_VERSION");
        if context.json {
            return output::json(out, &serde_json::json!({ "version": version }));
        }
        writeln!(out, "queue {version}")?;
        return Ok(());
    }
    let url = cli
        .database_url
        .clone()
        .or_else(|| context.config.database_url.clone())
        .context("no database: pass --database-url, set DATABASE_URL, or give database_url in the config file")?;
    let serving = matches!(cli.command, Command::Serve(_));
    let pool = connect(&url, if serving { 16 } else { 2 }).await?;
    if let Command::Migrate(args) = &cli.command {
        return migrate::run(&context, &pool, args, out).await;
    }
    let options = context.config.store_options()?;
    let key = match context.config.key_type {
        Some(key) => key,
        None => PgKeyType::detect(&pool, &options).await?,
    };
    if let Command::Serve(args) = &cli.command {
        return serve::run(&context, pool, options, key, args, out).await;
    }
    let admin = serve::open_admin(pool, options, key).await?;
    admin_command(&*admin, &context, cli.command, out).await
}

/// Who is acting: `flag` (`--actor`), else the OS user (`USER`, else
/// `LOGNAME`), else `cli`.
fn actor(flag: Option<&str>) -> Result<String> {
    if let Some(name) = flag {
        if name.trim().is_empty() {
            anyhow::bail!("--actor is empty: give a name that says who is acting");
        }
        return Ok(name.to_owned());
    }
    Ok(["USER", "LOGNAME"]
        .into_iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "cli".to_owned()))
}

/// Connects with a pool of `size`: a command runs a few statements at a
/// time, the server more.
async fn connect(url: &str, size: u32) -> Result<PgPool> {
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .context("the database URL is not a valid postgres:// URL")?;
    // A purge or a migration's index build runs for seconds by design:
    // sqlx's slow-statement warning would read as a fault. Kept for -vv.
    let options = sqlx::ConnectOptions::log_slow_statements(
        options,
        log::LevelFilter::Debug,
        Duration::from_secs(1),
    );
    let target = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("")
    );
    // One connection first, so that a refused or failed connection reports
    // its own cause (the pool would only say that it timed out).
    let first = tokio::time::timeout(Duration::from_secs(10), options.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10s"))
        .and_then(|connected| connected.map_err(anyhow::Error::from))
        .with_context(|| format!("cannot connect to the database at {target}"))?;
    drop(first);
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options))
}

/// Runs a command over the admin contract of any store; a write is
/// recorded in the audit log, with how it ended.
pub(crate) async fn admin_command(
    admin: &serve::TextAdmin,
    context: &Context,
    command: Command,
    out: &mut impl Write,
) -> Result<()> {
    let Some(target) = audit::target(&command) else {
        return run_admin_command(admin, context, command, out).await;
    };
    let mut tee = audit::Tee {
        out,
        kept: Vec::new(),
    };
    let result = run_admin_command(admin, context, command, &mut tee).await;
    audit::record(admin, context, target, &tee.kept, &result).await;
    result
}

async fn run_admin_command(
    admin: &serve::TextAdmin,
    context: &Context,
    command: Command,
    out: &mut impl Write,
) -> Result<()> {
    match command {
        Command::Stats(args) => read::stats(admin, context, &args, out).await,
        Command::List(args) => read::list(admin, context, &args, out).await,
        Command::Show(args) => read::show(admin, context, &args, out).await,
        Command::Enqueue(args) => enqueue::run(admin, context, &args, out).await,
        Command::Retry(args) => bulk::retry(admin, context, &args, out).await,
        Command::Cancel(args) => bulk::run(admin, context, &args, bulk::Action::Cancel, out).await,
        Command::Delete(args) => bulk::run(admin, context, &args, bulk::Action::Delete, out).await,
        Command::Fail(args) => bulk::fail(admin, context, &args, out).await,
        Command::ResetStalled(args) => maintenance::reset(admin, context, &args, out).await,
        Command::Purge(args) => maintenance::purge(admin, context, &args, out).await,
        Command::Pause(args) => pause::pause(admin, context, &args, out).await,
        Command::Resume(args) => pause::resume(admin, context, &args, out).await,
        Command::Paused => pause::paused(admin, context, out).await,
        Command::Limit(args) => limits::limit(admin, context, &args, out).await,
        Command::Limits => limits::limits(admin, context, out).await,
        Command::Audit(args) => audit::read(admin, context, &args, out).await,
        Command::Ops(args) => ops::run(admin, context, &args, out).await,
        Command::Migrate(_) | Command::Version | Command::Serve(_) => {
            anyhow::bail!("this command does not run over the admin contract")
        }
    }
}

/// Parses job keys given on the command line.
pub(crate) fn keys<K: CliKey>(texts: &[String]) -> Result<Vec<K>> {
    texts
        .iter()
        .map(|t| {
            t.parse::<K>()
                .map_err(|e| anyhow::anyhow!("{t:?} is not a job key of this table: {e}"))
        })
        .collect()
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

    #[tokio::test]
    async fn version_speaks_json_too() {
        let mut out = Vec::new();
        run(Cli::parse_from(["queue", "version", "--json"]), &mut out)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn help_lists_the_commands() {
        let err = Cli::try_parse_from(["queue", "--help"]).unwrap_err();
        let help = err.to_string();
        for command in [
            "stats",
            "list",
            "show",
            "enqueue",
            "retry",
            "cancel",
            "delete",
            "reset-stalled",
            "purge",
            "migrate",
        ] {
            assert!(help.contains(command), "{command}: {help}");
        }
    }
}
