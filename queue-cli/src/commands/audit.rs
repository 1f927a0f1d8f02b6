//! `audit`: reading the audit log; and recording each write command in it
//! (who, what, on which jobs, how it ended).

use std::io::Write;

use anyhow::Result;
use chrono::Utc;
use queue_core::{AuditParams, NewAuditEntry};
use serde_json::{json, Value};

use crate::output::{self, printable_line, relative, Table};
use crate::serve::TextAdmin;
use crate::{Command, Context};

/// How much of a command's output an entry keeps as its outcome.
const OUTCOME_BYTES: usize = 4000;

/// `queue audit`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Entries per page, newest first.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Entries before this id (the `next` of the previous page).
    #[arg(long, value_name = "ID")]
    pub before: Option<i64>,
    /// Only this actor's entries.
    #[arg(long = "by", value_name = "ACTOR")]
    pub by: Option<String>,
}

pub async fn read(
    admin: &TextAdmin,
    context: &Context,
    args: &AuditArgs,
    out: &mut impl Write,
) -> Result<()> {
    if args.limit == 0 || args.limit > queue_core::MAX_AUDIT_PAGE {
        anyhow::bail!(
            "--limit must be between 1 and {}",
            queue_core::MAX_AUDIT_PAGE
        );
    }
    let entries = admin
        .audit(
            &AuditParams::newest(args.limit)
                .before(args.before)
                .actor(args.by.clone()),
        )
        .await?;
    if context.json {
        return output::json(out, &entries);
    }
    if entries.is_empty() {
        writeln!(out, "no entries")?;
        return Ok(());
    }
    let mut table = Table::new(vec!["ID", "WHEN", "BY", "ACTION", "TARGET", "OUTCOME"]).right(0);
    let now = Utc::now();
    for e in &entries {
        let outcome = if e.entry.ok {
            e.entry.outcome.clone()
        } else {
            format!("FAILED: {}", e.entry.outcome)
        };
        table.row(vec![
            e.id.to_string(),
            relative(Some(e.at), now),
            printable_line(&e.entry.actor),
            printable_line(&e.entry.action),
            output::cut(&printable_line(&e.entry.target.to_string()), 60),
            output::cut(&printable_line(outcome.lines().next().unwrap_or("")), 60),
        ]);
    }
    table.print(out)?;
    if entries.len() == args.limit {
        if let Some(last) = entries.last() {
            writeln!(out, "next page: --before {}", last.id)?;
        }
    }
    Ok(())
}

/// What `command` does and to what, as the audit log records it; `None`
/// for a command that changes nothing.
pub(crate) fn target(command: &Command) -> Option<(&'static str, Value)> {
    let jobs = |bulk: &super::bulk::BulkArgs| {
        if bulk.ids.is_empty() {
            json!({ "filter": bulk.filter.describe(), "detach": bulk.detach })
        } else {
            json!({ "ids": bulk.ids })
        }
    };
    Some(match command {
        Command::Enqueue(a) => (
            "enqueue",
            json!({ "kind": a.kind, "from_stdin": a.payload.as_deref() == Some("-") }),
        ),
        Command::Retry(a) => {
            let mut target = jobs(&a.bulk);
            target["reset_attempts"] = json!(a.reset_attempts);
            ("retry", target)
        }
        Command::Cancel(a) => ("cancel", jobs(a)),
        Command::Delete(a) => ("delete", jobs(a)),
        Command::Fail(a) => {
            let mut target = jobs(&a.bulk);
            target["reason"] = json!(a.reason);
            ("fail", target)
        }
        Command::ResetStalled(a) => (
            "reset-stalled",
            json!({
                "stalled_max_age_secs": a.stalled_max_age.map(|d| d.as_secs()),
                "max_resets": a.max_resets,
                "at_most_once": a.at_most_once,
            }),
        ),
        Command::Purge(a) => (
            "purge",
            json!({
                "older_than_secs": a.older_than.num_seconds(),
                "states": a.states,
                "detach": a.detach,
            }),
        ),
        Command::Pause(a) => ("pause", json!({ "kind": a.kind })),
        Command::Resume(a) => ("resume", json!({ "kind": a.kind })),
        Command::Limit(a) => (
            "limit",
            json!({
                "kind": a.kind,
                "concurrency": a.concurrency,
                "rate": a.rate,
                "burst": a.burst,
                "clear": a.clear,
            }),
        ),
        Command::Ops(a) => match a.command {
            Some(super::ops::OpsCommand::Abort { id }) => ("abort-operation", json!({ "id": id })),
            Some(super::ops::OpsCommand::Resume { id }) => {
                ("resume-operation", json!({ "id": id }))
            }
            _ => return None,
        },
        _ => return None,
    })
}

/// Records that `context.actor` did `action` to `target` and how it ended
/// (`output`, the start of what it printed, or its error). A log that
/// cannot be written is said on standard error; the write stands.
pub(crate) async fn record(
    admin: &TextAdmin,
    context: &Context,
    (action, target): (&str, Value),
    output: &[u8],
    result: &Result<()>,
) {
    let (ok, outcome) = match result {
        Ok(()) => (true, String::from_utf8_lossy(output).trim().to_owned()),
        Err(error) => (false, format!("{error:#}")),
    };
    let entry = NewAuditEntry::new(context.actor.clone(), action, target, ok, outcome);
    if let Err(error) = admin.append_audit(std::slice::from_ref(&entry)).await {
        eprintln!("queue: warning: this {action} is not in the audit log: {error}");
    }
}

/// Writes to `out` and keeps the first [`OUTCOME_BYTES`] for the audit
/// entry, so that a command's output still streams.
pub(crate) struct Tee<'a, W> {
    pub out: &'a mut W,
    pub kept: Vec<u8>,
}

impl<W: Write> Write for Tee<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        let room = OUTCOME_BYTES.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&buf[..n.min(room)]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
