//! `retry`, `cancel`, `fail` and `delete`: by key, or every job matching a
//! filter in batches, after a confirmation.

use std::io::Write;

use anyhow::{bail, Result};
use queue_core::{ActionReport, JobFilter, NewOperation, OperationAction, RetryParams, Targets};

use crate::args::FilterArgs;
use crate::commands::ops::{self, Started};
use crate::output::{self, jobs, printable_line};

/// `n running jobs`, or `1 running job`.
fn running(n: u64) -> String {
    jobs(n).replacen("job", "running job", 1)
}
use crate::serve::TextAdmin;
use crate::{keys, Context};

/// The keys or filter of `cancel` and `delete`.
#[derive(Debug, Clone, clap::Args)]
pub struct BulkArgs {
    /// Job keys; without any, every job matching the filter options.
    #[arg(value_name = "ID")]
    pub ids: Vec<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Jobs changed per statement when working by filter: each batch is
    /// one short transaction.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub batch: usize,
    /// By filter: record the operation and return at once; a running
    /// `queue serve` carries it out (follow it with `queue ops`).
    #[arg(long)]
    pub detach: bool,
}

/// `queue retry`.
#[derive(Debug, Clone, clap::Args)]
pub struct RetryArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,
    /// Also set the failure and reset counts back to zero, so each job gets
    /// its whole retry budget again (otherwise one more attempt).
    #[arg(long)]
    pub reset_attempts: bool,
}

/// `queue fail`.
#[derive(Debug, Clone, clap::Args)]
pub struct FailArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,
    /// Why: the failure message the jobs end with.
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

/// A write of this module.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// `queue retry`.
    Retry(RetryParams),
    /// `queue cancel`.
    Cancel,
    /// `queue fail`, with the reason.
    Fail(&'a str),
    /// `queue delete`.
    Delete,
}

impl Action<'_> {
    fn verb(self) -> &'static str {
        match self {
            Action::Retry(_) => "retry",
            Action::Cancel => "cancel",
            Action::Fail(_) => "fail",
            Action::Delete => "delete",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Retry(_) => "retried",
            Action::Cancel => "canceled",
            Action::Fail(_) => "failed",
            Action::Delete => "deleted",
        }
    }

    /// The same write as a bulk operation's action.
    fn operation(self) -> OperationAction {
        match self {
            Action::Retry(params) => OperationAction::Retry {
                reset_attempts: params.reset_attempts,
            },
            Action::Cancel => OperationAction::Cancel,
            Action::Fail(reason) => OperationAction::Fail {
                reason: reason.to_owned(),
            },
            Action::Delete => OperationAction::Delete,
        }
    }

    async fn apply(
        self,
        admin: &TextAdmin,
        targets: &Targets<String>,
    ) -> Result<ActionReport<String>> {
        Ok(match self {
            Action::Retry(params) => admin.retry(targets, params).await?,
            Action::Cancel => admin.cancel(targets).await?,
            Action::Fail(reason) => admin.force_fail(targets, reason).await?,
            Action::Delete => admin.delete(targets).await?,
        })
    }
}

pub async fn retry(
    admin: &TextAdmin,
    context: &Context,
    args: &RetryArgs,
    out: &mut impl Write,
) -> Result<()> {
    let params = RetryParams {
        reset_attempts: args.reset_attempts,
    };
    run(admin, context, &args.bulk, Action::Retry(params), out).await
}

/// `queue fail`.
pub async fn fail(
    admin: &TextAdmin,
    context: &Context,
    args: &FailArgs,
    out: &mut impl Write,
) -> Result<()> {
    if args.reason.trim().is_empty() {
        bail!("--reason must say why the jobs are failed");
    }
    if args.reason.contains('\0') {
        bail!("--reason holds a NUL character, which Postgres cannot store");
    }
    run(admin, context, &args.bulk, Action::Fail(&args.reason), out).await
}

/// Applies `action` to the jobs `args` name, or to those its filter matches.
pub async fn run(
    admin: &TextAdmin,
    context: &Context,
    args: &BulkArgs,
    action: Action<'_>,
    out: &mut impl Write,
) -> Result<()> {
    if !args.ids.is_empty() && !args.filter.is_empty() {
        bail!("give job keys or filter options, not both");
    }
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if args.detach && !args.ids.is_empty() {
        bail!("--detach applies to a write by filter; a write by key is done at once");
    }
    if args.ids.is_empty() {
        let filter = args.filter.to_filter(admin)?;
        return by_filter(admin, context, filter, args, action, out).await;
    }
    let ids = keys::<String>(&args.ids)?;
    let report = action.apply(admin, &Targets::Ids(ids)).await?;
    if context.json {
        output::json(out, &report)?;
    } else {
        write!(out, "{} {}", action.done(), jobs(report.changed))?;
        if let Action::Cancel = action {
            write!(out, "; asked {} to stop", running(report.stop_requested))?;
        }
        writeln!(out)?;
    }
    match report.skipped.as_slice() {
        [] => Ok(()),
        [one] => bail!("{}", one.explain(action.done())),
        many => {
            for skipped in many {
                eprintln!("{}", printable_line(&skipped.explain(action.done())));
            }
            bail!(
                "{} of {} were not {}",
                many.len(),
                jobs(args.ids.len() as u64),
                action.done()
            )
        }
    }
}

/// Applies `action` to the jobs matching `filter` as a bulk operation
/// ([`ops::start`]), after a confirmation naming how many: carried out
/// here, `batch` at a time, or left to `queue serve` with `--detach`.
async fn by_filter(
    admin: &TextAdmin,
    context: &Context,
    filter: JobFilter,
    args: &BulkArgs,
    action: Action<'_>,
    out: &mut impl Write,
) -> Result<()> {
    let operation = action.operation();
    // Count what the write can apply to: the filter's states within the
    // action's.
    let counted = operation.narrow(filter, &admin.retryable_states());
    let total = admin.count(&counted).await?;
    if total == 0 {
        if context.json {
            return output::json(out, &ActionReport::<String>::default());
        }
        writeln!(out, "no jobs match; nothing {}", action.done())?;
        return Ok(());
    }
    let described = describe(admin, &counted);
    if !context.confirm(&format!(
        "{} {} ({described})?",
        capitalised(action.verb()),
        jobs(total)
    ))? {
        bail!("nothing {}: not confirmed", action.done());
    }
    let batch = u32::try_from(args.batch).unwrap_or(u32::MAX);
    let new = NewOperation::new(operation, counted, context.actor.clone(), total).batch(batch);
    match ops::start(admin, context, new, args.detach).await? {
        Started::Detached(op) => ops::print_detached(out, context, &op),
        Started::Done(op, _) => {
            if context.json {
                return output::json(out, &op);
            }
            write!(out, "{} {}", action.done(), jobs(op.done))?;
            if let Action::Cancel = action {
                write!(out, " (running ones asked to stop)")?;
            }
            writeln!(out)?;
            Ok(())
        }
    }
}

fn capitalised(verb: &str) -> String {
    let mut chars = verb.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The filter in words, with the store's state names.
pub(crate) fn describe(admin: &TextAdmin, filter: &JobFilter) -> String {
    let mut parts = Vec::new();
    if let Some(states) = &filter.states {
        let names: Vec<String> = states.iter().map(|s| admin.stored_state(*s)).collect();
        parts.push(format!("state {}", names.join(" or ")));
    }
    if let Some(kinds) = &filter.kinds {
        parts.push(format!("kind {}", kinds.join(" or ")));
    }
    if let Some(text) = &filter.failure_contains {
        parts.push(format!("failure containing {text:?}"));
    }
    if let Some(json) = &filter.payload_contains {
        parts.push(format!("payload containing {json}"));
    }
    if let Some(key) = &filter.unique_key {
        parts.push(format!("unique key {key:?}"));
    }
    if let Some(worker) = &filter.worker {
        parts.push(format!("last claimed by {worker:?}"));
    }
    if let Some(at) = filter.started_before {
        parts.push(format!("running since before {}", at.to_rfc3339()));
    }
    for (label, at) in [
        ("enqueued from", filter.queued_from),
        ("enqueued before", filter.queued_before),
        ("finished from", filter.finished_from),
        ("finished before", filter.finished_before),
    ] {
        if let Some(at) = at {
            parts.push(format!("{label} {}", at.to_rfc3339()));
        }
    }
    if parts.is_empty() {
        "every job".into()
    } else {
        parts.join(", ")
    }
}
