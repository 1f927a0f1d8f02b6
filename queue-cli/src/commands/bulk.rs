//! `retry`, `cancel`, `fail` and `delete`: by key, or every job matching a
//! filter in batches, after a confirmation.

use std::io::Write;

use anyhow::{bail, Result};
use chrono::Utc;
use queue_core::{ActionReport, JobFilter, JobState, RetryParams, Targets};

use crate::args::FilterArgs;
use crate::output::{self, jobs, printable_line, progress};

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

    /// The states the write applies to; `None` for any.
    fn states(self, admin: &TextAdmin) -> Option<Vec<JobState>> {
        match self {
            Action::Retry(_) => Some(admin.retryable_states()),
            Action::Cancel | Action::Fail(_) => Some(vec![
                JobState::Queued,
                JobState::Errored,
                JobState::Processing,
            ]),
            Action::Delete => None,
        }
    }

    async fn apply(
        self,
        admin: &TextAdmin,
        targets: &Targets<String>,
    ) -> Result<ActionReport<String>> {
        Ok(match self {
            Action::Retry(params) => admin.retry(targets, params, Utc::now()).await?,
            Action::Cancel => admin.cancel(targets, Utc::now()).await?,
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
    let report = if args.ids.is_empty() {
        let filter = args.filter.to_filter(admin)?;
        match by_filter(admin, context, filter, args.batch, action).await? {
            Some(report) => report,
            None => {
                if context.json {
                    return output::json(out, &ActionReport::<String>::default());
                }
                writeln!(out, "no jobs match; nothing {}", action.done())?;
                return Ok(());
            }
        }
    } else {
        let ids = keys::<String>(&args.ids)?;
        action.apply(admin, &Targets::Ids(ids)).await?
    };
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

/// Applies `action` to the jobs matching `filter`, `batch` at a time, after
/// a confirmation naming how many; `None` if none match.
async fn by_filter(
    admin: &TextAdmin,
    context: &Context,
    mut filter: JobFilter,
    batch: usize,
    action: Action<'_>,
) -> Result<Option<ActionReport<String>>> {
    // Count what the write can apply to: the filter's states within the
    // action's.
    let mut counted = filter.clone();
    if let Some(states) = action.states(admin) {
        let within: Vec<JobState> = match &filter.states {
            Some(chosen) => chosen
                .iter()
                .copied()
                .filter(|s| states.contains(s))
                .collect(),
            None => states.to_vec(),
        };
        counted.states = Some(within);
    }
    let total = admin.count(&counted).await?;
    if total == 0 {
        return Ok(None);
    }
    let described = describe(admin, &counted);
    if !context.confirm(&format!(
        "{} {} ({described})?",
        capitalised(action.verb()),
        jobs(total)
    ))? {
        bail!("nothing {}: not confirmed", action.done());
    }
    filter.states = counted.states;
    let bar = progress(total, action.verb(), !context.json);
    let mut report = ActionReport::default();
    let targets = |limit| Targets::Matching {
        filter: filter.clone(),
        limit,
    };
    // Never more than was confirmed, even if matching jobs keep coming.
    while report.changed + report.stop_requested < total {
        let left = usize::try_from(total - report.changed - report.stop_requested).unwrap_or(batch);
        let limit = batch.min(left);
        let done = action.apply(admin, &targets(limit)).await?;
        let moved = done.changed + done.stop_requested;
        report.changed += done.changed;
        report.stop_requested += done.stop_requested;
        bar.inc(moved);
        // Only an empty batch ends it: a retry's batch can come back short
        // while more jobs match (of two jobs with one unique key it queues
        // one, and the next batch passes over the other, now held).
        if moved == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    Ok(Some(report))
}

fn capitalised(verb: &str) -> String {
    let mut chars = verb.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The filter in words, with the store's state names.
fn describe(admin: &TextAdmin, filter: &JobFilter) -> String {
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
