//! `enqueue`: adding jobs by hand or from a file.

use std::io::Write;

use anyhow::{anyhow, Context as _, Result};
use chrono::{DateTime, Utc};
use queue_core::{Enqueued, NewJob, UniqueScope};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::args::future;
use crate::output::{self, jobs, printable_line, progress};
use crate::serve::TextAdmin;
use crate::Context;

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

pub async fn run(
    admin: &TextAdmin,
    context: &Context,
    args: &EnqueueArgs,
    out: &mut impl Write,
) -> Result<()> {
    let done = match args.payload.as_deref() {
        Some("-") if args.unique_key.is_some() => {
            return Err(anyhow!(
                "--unique-key gives one key, so it cannot apply to every line of standard input; enqueue those jobs one by one"
            ))
        }
        Some("-") => {
            let stdin = tokio::io::BufReader::new(tokio::io::stdin());
            return from_lines(admin, context, args, stdin, out).await;
        }
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
        let ids: Vec<&String> = done.iter().map(|e| &e.id).collect();
        let inserted: Vec<bool> = done.iter().map(|e| e.inserted).collect();
        return output::json(
            out,
            &serde_json::json!({ "ids": ids, "inserted": inserted }),
        );
    }
    for e in &done {
        print_key(out, e)?;
    }
    Ok(())
}

/// One enqueued job's key, marked if it was there already.
fn print_key<Id: std::fmt::Display>(out: &mut impl Write, e: &Enqueued<Id>) -> Result<()> {
    let id = printable_line(&e.id.to_string());
    if e.inserted {
        writeln!(out, "{id}")?;
    } else {
        writeln!(out, "{id} (already there: it holds the unique key)")?;
    }
    Ok(())
}

/// Enqueues one job per line of `input` in batches, read without blocking
/// the runtime. Each batch's keys are written as soon as it commits (with
/// `--json`, one object per job: its line, key and whether it was
/// inserted), so nothing is held until the end. A line that is not JSON,
/// or a batch the database refuses, stops the command: the error says how
/// many jobs were enqueued and from which line to resume.
async fn from_lines(
    admin: &TextAdmin,
    context: &Context,
    args: &EnqueueArgs,
    input: impl AsyncBufRead + Unpin,
    out: &mut impl Write,
) -> Result<()> {
    let bar = progress(0, "enqueueing", !context.json);
    let mut lines = input.lines();
    let mut batch = Vec::with_capacity(BATCH);
    // The line of each job in the batch, and the jobs enqueued so far.
    let mut batch_lines = Vec::with_capacity(BATCH);
    let mut enqueued = 0u64;
    let mut number = 0usize;
    loop {
        let line = lines
            .next_line()
            .await
            .with_context(|| stopped_at(number + 1, enqueued, "reading standard input failed"))?;
        let end = line.is_none();
        if let Some(line) = line {
            number += 1;
            if line.trim().is_empty() {
                continue;
            }
            let payload: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
                anyhow!(stopped_at(
                    batch_lines.first().copied().unwrap_or(number),
                    enqueued,
                    &format!("line {number} of standard input is not JSON ({e})")
                ))
            })?;
            batch.push(args.job(payload));
            batch_lines.push(number);
        }
        if batch.len() == BATCH || (end && !batch.is_empty()) {
            let first = batch_lines.first().copied().unwrap_or(number);
            let done = admin.enqueue(&batch).await.map_err(|e| {
                anyhow!(stopped_at(
                    first,
                    enqueued,
                    &format!(
                        "enqueueing the jobs of lines {first}-{} failed ({e})",
                        batch_lines.last().copied().unwrap_or(first)
                    )
                ))
            })?;
            for (e, line) in done.iter().zip(&batch_lines) {
                if context.json {
                    serde_json::to_writer(
                        &mut *out,
                        &serde_json::json!({ "line": line, "id": &e.id, "inserted": e.inserted }),
                    )?;
                    writeln!(out)?;
                } else {
                    print_key(out, e)?;
                }
            }
            out.flush()?;
            enqueued += done.len() as u64;
            bar.inc(done.len() as u64);
            batch.clear();
            batch_lines.clear();
        }
        if end {
            break;
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// Why an NDJSON enqueue stopped, with what was done and where to resume.
fn stopped_at(resume_from: usize, enqueued: u64, what: &str) -> String {
    format!(
        "{what}; {} enqueued before it (their keys are printed above); to go on, fix the input and resume from line {resume_from}: tail -n +{resume_from} FILE | queue enqueue KIND -",
        jobs(enqueued)
    )
}
