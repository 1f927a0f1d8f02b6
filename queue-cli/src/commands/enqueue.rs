//! `enqueue`: adding jobs by hand or from a file.

use std::io::{BufRead, Write};

use anyhow::{anyhow, Context as _, Result};
use chrono::{DateTime, Utc};
use queue_core::{Admin, NewJob};

use crate::args::future;
use crate::output::{self, progress};
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
}

impl EnqueueArgs {
    fn job(&self, payload: serde_json::Value) -> NewJob {
        let job = NewJob::new(self.kind.clone(), payload).priority(self.priority);
        match self.run_at {
            Some(at) => job.process_after(at),
            None => job,
        }
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
    let ids = match args.payload.as_deref() {
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
        return output::json(out, &serde_json::json!({ "ids": ids }));
    }
    for id in &ids {
        writeln!(out, "{id}")?;
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
) -> Result<Vec<A::Id>> {
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
