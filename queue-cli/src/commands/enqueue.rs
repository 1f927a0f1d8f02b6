//! `enqueue`: adding jobs by hand or from a file.

use std::io::{BufRead, Write};

use anyhow::{anyhow, Context as _, Result};
use chrono::{DateTime, Utc};
use queue_core::{Admin, Enqueued, NewJob, UniqueScope};

use crate::args::future;
use crate::output::{self, printable_line, progress};
use crate::{CliAdmin, Context};

/// Jobs per enqueue statement when reading many.
const BATCH: usize = 1000;

/// `queue enqueue`.
#[derive(Debug, Clone, clap::Args)]
pub struct EnqueueArgs {
    /// The job's kind (the table's kind column).
    pub kind: String,
    /// The payload as JSON (default `{}`), or `-` to read NDJSON from
    /// standard input: one payload per line, each a job.
    pub payload: Option<String>,
    /// Not before this time: RFC 3339, or a delay such as 10m.
    #[arg(long, value_name = "TIME", value_parser = future)]
    pub run_at: Option<DateTime<Utc>>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// A unique key: if a job holding it waits or runs, nothing is added
    /// and that job's key is printed, marked as already there.
    #[arg(long, value_name = "KEY")]
    pub unique_key: Option<String>,
    /// The unique key holds for as long as the job exists, not only while
    /// it waits or runs.
    #[arg(long, requires = "unique_key")]
    pub unique_forever: bool,
    /// At most this many attempts in all, whatever the workers' retry
    /// policy allows.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    pub max_attempts: Option<u32>,
    /// Not started after this time (RFC 3339, or a delay such as 1h): the
    /// job then ends failed, unrun.
    #[arg(long, value_name = "TIME", value_parser = future)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Never started twice: not retried, and failed rather than run again
    /// after a crash.
    #[arg(long)]
    pub at_most_once: bool,
}

impl EnqueueArgs {
    fn job(&self, payload: serde_json::Value) -> NewJob {
        let mut job = NewJob::new(self.kind.clone(), payload).priority(self.priority);
        if let Some(at) = self.run_at {
            job = job.process_after(at);
        }
        if let Some(n) = self.max_attempts {
            job = job.max_attempts(n);
        }
        if let Some(at) = self.expires_at {
            job = job.expires_at(at);
        }
        if self.at_most_once {
            job = job.at_most_once();
        }
        if let Some(key) = &self.unique_key {
            let scope = if self.unique_forever {
                UniqueScope::Forever
            } else {
                UniqueScope::Active
            };
            job = job.unique(key.clone(), scope);
        }
        job
    }
}

pub async fn run<A>(
    admin: &A,
    context: &Context,
    args: &EnqueueArgs,
    out: &mut impl Write,
) -> Result<()>
where
    A: CliAdmin,
{
    let done = match args.payload.as_deref() {
        Some("-") if args.unique_key.is_some() => {
            return Err(anyhow!(
                "--unique-key gives one key, so it cannot apply to every line of standard input; enqueue those jobs one by one"
            ))
        }
        Some("-") => from_lines(admin, context, args, std::io::stdin().lock()).await?,
        text => {
            let payload = match text {
                Some(text) => serde_json::from_str(text)
                    .with_context(|| format!("the payload is not valid JSON: {text}"))?,
                None => serde_json::json!({}),
            };
            admin.enqueue(&[args.job(payload)]).await?
        }
    };
    if context.json {
        let ids: Vec<&A::Id> = done.iter().map(|e| &e.id).collect();
        let inserted: Vec<bool> = done.iter().map(|e| e.inserted).collect();
        return output::json(
            out,
            &serde_json::json!({ "ids": ids, "inserted": inserted }),
        );
    }
    for e in &done {
        let id = printable_line(&e.id.to_string());
        if e.inserted {
            writeln!(out, "{id}")?;
        } else {
            writeln!(out, "{id} (already there: it holds the unique key)")?;
        }
    }
    Ok(())
}

/// Enqueues one job per line of `input`, in batches; a line that is not
/// JSON stops the command before anything after it is sent, naming it.
async fn from_lines<A: Admin>(
    admin: &A,
    context: &Context,
    args: &EnqueueArgs,
    input: impl BufRead,
) -> Result<Vec<Enqueued<A::Id>>> {
    let bar = progress(0, "enqueueing", !context.json);
    let mut ids = Vec::new();
    let mut batch = Vec::with_capacity(BATCH);
    for (n, line) in input.lines().enumerate() {
        let line = line.context("reading standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        let payload: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            anyhow!(
                "line {} of standard input is not JSON ({e}); {} jobs were enqueued before it",
                n + 1,
                ids.len()
            )
        })?;
        batch.push(args.job(payload));
        if batch.len() == BATCH {
            ids.extend(admin.enqueue(&batch).await?);
            bar.inc(batch.len() as u64);
            batch.clear();
        }
    }
    ids.extend(admin.enqueue(&batch).await?);
    bar.finish_and_clear();
    Ok(ids)
}
