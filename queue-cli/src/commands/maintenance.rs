//! `reset-stalled` and `purge`: the resetter's and the pruner's work, by
//! hand.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Result};
use chrono::{TimeDelta, Utc};
use queue_core::{Delivery, JobFilter, JobState, NewOperation, OperationAction, ResetParams};

use crate::args::{age, states_named};
use crate::commands::ops::{self, Started};
use crate::commands::read::stalled_max_age;
use crate::output::{self, jobs, printable_line};
use crate::serve::TextAdmin;
use crate::Context;

/// `queue reset-stalled`.
#[derive(Debug, Clone, clap::Args)]
pub struct ResetArgs {
    /// Processing jobs silent for longer than this are stalled (default:
    /// the config's resetter.stalled_max_age, else 60s).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::age_std)]
    pub stalled_max_age: Option<Duration>,
    /// Resets a job may have before it fails instead (default: the
    /// config's resetter.max_resets, else 3).
    #[arg(long, value_name = "N")]
    pub max_resets: Option<u32>,
    /// Fail stalled jobs instead of running them again.
    #[arg(long)]
    pub at_most_once: bool,
}

/// `queue purge`.
#[derive(Debug, Clone, clap::Args)]
pub struct PurgeArgs {
    /// Delete jobs that finished longer ago than this (90s, 12h, 30d).
    #[arg(long, value_name = "AGE", value_parser = age)]
    pub older_than: TimeDelta,
    /// Only jobs in these finished states (default: completed, failed and
    /// canceled). Repeat, or separate with commas.
    #[arg(long = "state", value_name = "STATE", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Jobs deleted per statement: each batch is one short transaction, so
    /// claims never wait on a purge for long.
    #[arg(long, default_value_t = queue_core::DEFAULT_PURGE_BATCH as usize, value_name = "N")]
    pub batch: usize,
    /// Record the purge and return at once; a running `queue serve`
    /// carries it out (follow it with `queue ops`).
    #[arg(long)]
    pub detach: bool,
}

pub async fn reset(
    admin: &TextAdmin,
    context: &Context,
    args: &ResetArgs,
    out: &mut impl Write,
) -> Result<()> {
    let defaults = queue_worker::ResetterOptions::default();
    let resetter = &context.config.resetter;
    let now = Utc::now();
    let max_age = TimeDelta::from_std(stalled_max_age(context, args.stalled_max_age)?)?;
    let delivery = if args.at_most_once {
        Delivery::AtMostOnce
    } else {
        resetter.delivery.unwrap_or(defaults.delivery)
    };
    let report = admin
        .reset(ResetParams {
            stalled_before: now - max_age,
            max_resets: args
                .max_resets
                .or(resetter.max_resets)
                .unwrap_or(defaults.max_resets),
            delivery,
            now,
        })
        .await?;
    if context.json {
        return output::json(out, &report);
    }
    writeln!(
        out,
        "{} queued again, {} failed (reset limit reached, or at most once)",
        jobs(report.reset.len() as u64),
        report.failed.len()
    )?;
    for id in &report.reset {
        writeln!(out, "  reset  {}", printable_line(&id.to_string()))?;
    }
    for id in &report.failed {
        writeln!(out, "  failed {}", printable_line(&id.to_string()))?;
    }
    Ok(())
}

pub async fn purge(
    admin: &TextAdmin,
    context: &Context,
    args: &PurgeArgs,
    out: &mut impl Write,
) -> Result<()> {
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let mut states = Vec::new();
    for name in &args.states {
        // Refused before anything is counted: a purge takes finished jobs
        // only, and would otherwise count, ask, then delete none.
        for state in states_named(admin, name)? {
            if !state.is_terminal() {
                bail!(
                    "--state {name}: only finished jobs can be purged, and {state} jobs have not finished; choose among completed, failed and canceled"
                );
            }
            states.push(state);
        }
    }
    if states.is_empty() {
        states = vec![JobState::Completed, JobState::Failed, JobState::Canceled];
    }
    states.dedup();
    let now = Utc::now();
    let cutoff = now - args.older_than;
    let filter = JobFilter::default()
        .states(states.iter().copied())
        .finished_before(cutoff);
    let total = admin.count(&filter).await?;
    if total > 0 {
        let names: Vec<String> = states.iter().map(|s| admin.stored_state(*s)).collect();
        let question = format!(
            "Delete {} ({}) that finished before {}?",
            jobs(total),
            names.join(", "),
            cutoff.to_rfc3339()
        );
        if !context.confirm(&question)? {
            bail!("nothing purged: not confirmed");
        }
    }
    if total == 0 {
        if context.json {
            return output::json(out, &serde_json::json!({ "purged": 0, "batches": 0 }));
        }
        writeln!(out, "no jobs match; nothing purged")?;
        return Ok(());
    }
    let batch = u32::try_from(args.batch).unwrap_or(u32::MAX);
    let new = NewOperation::new(OperationAction::Purge, filter, context.actor.clone(), total)
        .batch(batch);
    let (op, batches) = match ops::start(admin, context, new, args.detach).await? {
        Started::Detached(op) => return ops::print_detached(out, context, &op),
        Started::Done(op, batches) => (op, batches),
    };
    let purged = op.done;
    if context.json {
        return output::json(
            out,
            &serde_json::json!({ "purged": purged, "batches": batches, "operation": op.id }),
        );
    }
    writeln!(out, "purged {} in {batches} batches", jobs(purged))?;
    Ok(())
}
