//! `migrate`: the versioned migrations of the tables the store owns: the
//! default table and its kinds and audit tables, or the bookkeeping, kinds
//! and audit tables beside a table of your own (never that table itself).

use std::io::Write;

use anyhow::{bail, Result};
use sqlx::PgPool;

use queue_store_postgres::{
    migrate_beside, migrations_beside, FinishPartitions, JobTable, Migration, PgStoreOptions,
    QualifiedName,
};

use crate::output::{self, Table};
use crate::Context;

/// `queue migrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct MigrateArgs {
    /// List the versions, applied and pending, and change nothing.
    #[arg(long, conflicts_with = "dry_run")]
    pub status: bool,
    /// Print the SQL of the pending versions and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The table's schema (default: the config's, else public).
    #[arg(long)]
    pub schema: Option<String>,
    /// The table (default: the config's, else queue_jobs).
    #[arg(long)]
    pub table: Option<String>,
    /// Create the default table partitioned by state, its finished jobs by
    /// finish time in partitions this many hours wide (24: a partition a
    /// day), so that retention drops whole partitions. Only when the table
    /// is created: one that exists unpartitioned is refused.
    #[arg(long, value_name = "HOURS")]
    pub partition_hours: Option<u32>,
    /// Lay the default table out so that claims update jobs in place
    /// (experimental; new or existing plain tables; see "Claims in place"
    /// in docs/job-lifecycle.md). A table once converted stays so.
    #[arg(long, conflicts_with = "partition_hours")]
    pub in_place_claims: bool,
    /// How long each try of a version that changes the table in use waits
    /// for its lock before it gives way to the jobs queued behind it and
    /// tries again (claims and enqueues wait at most this long).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::age_std, default_value = "1s")]
    pub lock_wait: std::time::Duration,
    /// When the tries stop: the migration then fails, naming the sessions
    /// that hold locks on the table. A concurrent index build still
    /// waiting for a session idle in a transaction after this long is
    /// stopped too.
    #[arg(long, value_name = "DURATION", value_parser = crate::args::age_std, default_value = "10m")]
    pub give_up_after: std::time::Duration,
}

/// The tables a migration is for.
enum Target {
    /// The default table, and the kinds and audit tables beside it.
    Default(JobTable),
    /// A table of the user's: the tables the store keeps beside it (the
    /// bookkeeping table, if named; the kinds table, if it has kinds; the
    /// audit table).
    Own(Box<PgStoreOptions>),
}

impl Target {
    /// The job table the migrated tables belong to.
    fn name(&self) -> QualifiedName {
        match self {
            Target::Default(table) => table.name().clone(),
            Target::Own(options) => options.table_name().clone(),
        }
    }

    async fn migrations(&self, pool: &PgPool) -> Result<Vec<Migration>> {
        Ok(match self {
            Target::Default(table) => table.migrations(pool).await?,
            Target::Own(options) => migrations_beside(pool, options).await?,
        })
    }

    async fn migrate(&self, pool: &PgPool) -> Result<Vec<Migration>> {
        Ok(match self {
            Target::Default(table) => table.migrate(pool).await?,
            Target::Own(options) => migrate_beside(pool, options).await?,
        })
    }
}

pub async fn run(
    context: &Context,
    pool: &PgPool,
    args: &MigrateArgs,
    out: &mut impl Write,
) -> Result<()> {
    let target = if context.config.is_default_table() {
        let table = context.config.job_table()?;
        let table = match (&args.schema, &args.table) {
            (None, None) => table,
            (schema, name) => JobTable::new(
                schema.as_deref().unwrap_or(table.name().schema.as_str()),
                name.as_deref().unwrap_or(table.name().name.as_str()),
            )?,
        };
        let table = match args.partition_hours {
            Some(hours) => table.partitioned_by_finish_time(FinishPartitions::hours(hours)?),
            None => table,
        };
        let table = if args.in_place_claims {
            table.in_place_claims()
        } else {
            table
        };
        Target::Default(table.migration_lock_wait(args.lock_wait, args.give_up_after))
    } else {
        let options = context.config.store_options()?;
        if args.schema.is_some()
            || args.table.is_some()
            || args.partition_hours.is_some()
            || args.in_place_claims
        {
            bail!("--schema, --table, --partition-hours and --in-place-claims are for the default table; the tables beside a table of your own follow from the config file");
        }
        Target::Own(Box::new(options))
    };
    let table = &target;
    if args.status || args.dry_run {
        let all = table.migrations(pool).await?;
        if args.dry_run {
            let pending: Vec<_> = all.iter().filter(|m| m.applied_at.is_none()).collect();
            if context.json {
                return output::json(
                    out,
                    &pending
                        .iter()
                        .map(|m| serde_json::json!({"table": m.table.to_string(), "version": m.version, "name": m.name, "sql": m.statements}))
                        .collect::<Vec<_>>(),
                );
            }
            if pending.is_empty() {
                writeln!(out, "-- {} is up to date", table.name())?;
            }
            for m in pending {
                writeln!(out, "-- {} version {}: {}", m.table, m.version, m.name)?;
                for statement in &m.statements {
                    writeln!(out, "{statement};")?;
                }
            }
            return Ok(());
        }
        if context.json {
            return output::json(
                out,
                &all.iter()
                    .map(|m| serde_json::json!({"table": m.table.to_string(), "version": m.version, "name": m.name, "applied_at": m.applied_at}))
                    .collect::<Vec<_>>(),
            );
        }
        let mut rows = Table::new(vec!["TABLE", "VERSION", "APPLIED", "NAME"]).right(1);
        for m in &all {
            rows.row(vec![
                m.table.to_string(),
                m.version.to_string(),
                m.applied_at.map_or("pending".into(), |at| {
                    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
                }),
                m.name.clone(),
            ]);
        }
        return Ok(rows.print(out)?);
    }
    let applied = table.migrate(pool).await?;
    if context.json {
        return output::json(
            out,
            &serde_json::json!({
                "table": table.name().to_string(),
                "applied": applied.iter().map(|m| serde_json::json!({"table": m.table.to_string(), "version": m.version, "name": m.name})).collect::<Vec<_>>(),
            }),
        );
    }
    if applied.is_empty() {
        writeln!(out, "{} is up to date", table.name())?;
    }
    for m in &applied {
        writeln!(
            out,
            "{}: applied version {} ({})",
            m.table, m.version, m.name
        )?;
    }
    Ok(())
}
