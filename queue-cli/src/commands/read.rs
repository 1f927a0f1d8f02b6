//! `stats`, `list` and `show`: reading a queue.

use std::io::Write;
use std::time::Duration;

use anyhow::{anyhow, Result};
use chrono::Utc;
use queue_core::{JobState, JobView, ListOrder, ListParams, StatsParams};

use crate::args::FilterArgs;
use crate::output::{self, cut, printable, printable_line, relative, span, Table};
use crate::serve::TextAdmin;
use crate::{keys, Context};

/// `queue stats`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatsArgs {
    /// Processing jobs silent for longer than this count as stalled
    /// (default: the config's resetter.stalled_max_age, else 60s).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::age_std)]
    pub stalled_max_age: Option<Duration>,
    /// Count every job, however big the table. Without it, a big table's
    /// finished jobs (and a backlog past `exact_counts_below`) are
    /// estimated from the planner's statistics, shown with `~`.
    #[arg(long)]
    pub exact: bool,
}

/// `queue list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Jobs per page.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Start after this key (the `next` of the previous page).
    #[arg(long, value_name = "ID")]
    pub after: Option<String>,
    /// Longest queued first instead of most recently queued first.
    #[arg(long)]
    pub oldest_first: bool,
}

/// `queue show`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    /// The job's key.
    pub id: String,
}

/// A state as the table stores it, with the standard name beside it where
/// they differ: `pending (queued)`.
pub fn state_label(stored: &str, state: Option<JobState>) -> String {
    match state {
        Some(s) if s.as_str() != stored => format!("{stored} ({s})"),
        Some(_) => stored.to_owned(),
        None => format!("{stored} (unmapped)"),
    }
}

/// The stalled age: the flag, else the config's, else the resetter's
/// default; refused if out of range (a config's `300000y`).
pub(crate) fn stalled_max_age(context: &Context, flag: Option<Duration>) -> Result<Duration> {
    let age = flag
        .or(context.config.resetter.stalled_max_age)
        .unwrap_or_else(|| queue_worker::ResetterOptions::default().stalled_max_age);
    crate::args::within_range(age).map_err(|e| anyhow!("the stalled age: {e}"))
}

pub async fn stats(
    admin: &TextAdmin,
    context: &Context,
    args: &StatsArgs,
    out: &mut impl Write,
) -> Result<()> {
    let now = Utc::now();
    let max_age = stalled_max_age(context, args.stalled_max_age)?;
    let stalled_before = now - chrono::TimeDelta::from_std(max_age)?;
    let mut params = StatsParams::new(now, stalled_before);
    if args.exact {
        params = params.exact();
    }
    let stats = admin.stats(params).await?;
    if context.json {
        #[derive(serde::Serialize)]
        struct Json<'a> {
            #[serde(flatten)]
            stats: &'a queue_core::QueueStats,
            oldest_claimable_age_secs: Option<f64>,
        }
        let age = stats
            .oldest_claimable_age()
            .map(|d| d.num_milliseconds() as f64 / 1000.0);
        return output::json(
            out,
            &Json {
                stats: &stats,
                oldest_claimable_age_secs: age,
            },
        );
    }
    let mut table = Table::new(vec!["STATE", "KIND", "COUNT"]).right(2);
    for count in &stats.counts {
        table.row(vec![
            state_label(&count.stored_state, count.state),
            count.kind.clone().unwrap_or_else(|| "-".into()),
            if count.estimated {
                format!("~{}", count.count)
            } else {
                count.count.to_string()
            },
        ]);
    }
    table.print(out)?;
    let total: u64 = stats.counts.iter().map(|c| c.count).sum();
    let total = if stats.estimated() {
        format!("~{total}")
    } else {
        total.to_string()
    };
    let waiting = match stats.oldest_claimable_age() {
        Some(age) => format!("the oldest waiting job has waited {}", span(age)),
        None => "no job is waiting".into(),
    };
    let stalled = match stats.stalled {
        Some(n) => format!(
            "{n} stalled (silent for over {})",
            humantime::format_duration(max_age)
        ),
        None => "stalled jobs unknown (the table keeps no heartbeat or start time)".into(),
    };
    writeln!(out, "\n{total} jobs; {waiting}; {stalled}")?;
    if stats.estimated() {
        writeln!(
            out,
            "~ estimated from the planner's statistics (the table is big); --exact counts every job"
        )?;
    }
    for pause in &stats.paused {
        writeln!(
            out,
            "{} is paused: {}",
            crate::output::printable_line(&pause.kind),
            super::pause::since(pause)
        )?;
    }
    Ok(())
}

pub async fn list(
    admin: &TextAdmin,
    context: &Context,
    args: &ListArgs,
    out: &mut impl Write,
) -> Result<()> {
    let after = match &args.after {
        Some(after) => keys::<String>(std::slice::from_ref(after))?.pop(),
        None => None,
    };
    let params = ListParams::first(args.filter.to_filter(admin)?, args.limit)
        .order(if args.oldest_first {
            ListOrder::OldestFirst
        } else {
            ListOrder::NewestFirst
        })
        .after(after);
    let page = admin.list(&params).await?;
    if context.json {
        return output::json(out, &page);
    }
    let now = Utc::now();
    let mut table = Table::new(vec![
        "ID", "KIND", "STATE", "FAILURES", "QUEUED", "FINISHED", "FAILURE",
    ])
    .right(3);
    for job in &page.jobs {
        table.row(vec![
            job.id.to_string(),
            job.kind.clone().unwrap_or_else(|| "-".into()),
            job.stored_state.clone(),
            job.num_failures.map_or("-".into(), |n| n.to_string()),
            relative(job.queued_at, now),
            relative(job.finished_at, now),
            job.failure_message
                .as_deref()
                .map_or(String::new(), |m| cut(m, 60)),
        ]);
    }
    table.print(out)?;
    match (&page.next, page.searched) {
        (Some(next), Some(rows)) => writeln!(
            out,
            "\nsearched {rows} jobs, back to job {next}, without filling the page (no index serves this filter); \
             search on: queue list --after {} …",
            printable_line(&next.to_string())
        )?,
        (Some(next), None) => writeln!(
            out,
            "\nmore: queue list --after {} …",
            printable_line(&next.to_string())
        )?,
        (None, _) if page.jobs.is_empty() => writeln!(out, "\nno jobs match")?,
        (None, _) => {}
    }
    Ok(())
}

pub async fn show(
    admin: &TextAdmin,
    context: &Context,
    args: &ShowArgs,
    out: &mut impl Write,
) -> Result<()> {
    let id = keys::<String>(std::slice::from_ref(&args.id))?
        .pop()
        .ok_or_else(|| anyhow!("no key given"))?;
    let job = admin
        .get(&id)
        .await?
        .ok_or_else(|| anyhow!("there is no job {id}"))?;
    if context.json {
        return output::json(out, &job);
    }
    print_job(&job, out)
}

fn print_job<Id: std::fmt::Display>(job: &JobView<Id>, out: &mut impl Write) -> Result<()> {
    let now = Utc::now();
    let time = |at: Option<chrono::DateTime<Utc>>| match at {
        Some(at) => format!("{} ({})", at.to_rfc3339(), relative(Some(at), now)),
        None => "-".into(),
    };
    let count = |n: Option<i64>| n.map_or("-".into(), |n| n.to_string());
    let mut fields = vec![
        ("id", job.id.to_string()),
        ("kind", job.kind.clone().unwrap_or_else(|| "-".into())),
        ("state", state_label(&job.stored_state, job.state)),
        ("priority", count(job.priority)),
        ("failures", count(job.num_failures)),
        ("resets", count(job.num_resets)),
        ("queued", time(job.queued_at)),
        ("process after", time(job.process_after)),
        ("started", time(job.started_at)),
        ("heartbeat", time(job.last_heartbeat_at)),
        ("finished", time(job.finished_at)),
        (
            "worker",
            job.worker_hostname.clone().unwrap_or_else(|| "-".into()),
        ),
        ("cancel requested", job.cancel.to_string()),
        ("attempt limit", count(job.max_attempts)),
        ("at most once", job.at_most_once.to_string()),
        ("expires", time(job.expires_at)),
        (
            "unique key",
            job.unique_key.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "failure",
            job.failure_message.clone().unwrap_or_else(|| "-".into()),
        ),
    ]; // Only tables that count attempts down have this line.
    if let Some(left) = job.attempts_left {
        let after_limit = fields
            .iter()
            .position(|(name, _)| *name == "attempt limit")
            .map_or(fields.len(), |i| i + 1);
        fields.insert(after_limit, ("attempts left", left.to_string()));
    }

    // Job data is written printable: an escape sequence in it reaches the
    // terminal as text.
    for (name, value) in fields {
        writeln!(out, "{:<17} {}", format!("{name}:"), printable(&value))?;
    }
    writeln!(out, "payload:")?;
    match &job.payload {
        Some(payload) => writeln!(
            out,
            "{}",
            printable(&serde_json::to_string_pretty(payload)?)
        )?,
        None => writeln!(out, "  (the table has no payload column)")?,
    }
    writeln!(out, "execution log:")?;
    if job.execution_logs.is_empty() {
        writeln!(out, "  (empty)")?;
    }
    for entry in &job.execution_logs {
        let at = entry.get("at").and_then(|v| v.as_str()).unwrap_or("");
        let key = entry.get("key").and_then(|v| v.as_str()).unwrap_or("");
        let line = match entry.get("message").and_then(|v| v.as_str()) {
            Some(message) => format!("{at} {key}: {message}"),
            None => entry.to_string(),
        };
        writeln!(out, "  {}", printable(&line))?;
    }
    Ok(())
}
