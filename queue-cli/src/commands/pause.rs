//! `pause`, `resume` and `paused`: holding a kind's jobs back from every
//! worker, and letting them go again.

use std::io::Write;

use anyhow::Result;
use chrono::Utc;
use queue_core::PausedKind;

use crate::output::{self, printable_line, relative, Table};
use crate::serve::TextAdmin;
use crate::Context;

/// `queue pause`.
#[derive(Debug, Clone, clap::Args)]
pub struct PauseArgs {
    /// The kind whose jobs no worker claims until it is resumed. A kind
    /// with no jobs yet can be paused.
    pub kind: String,
}

/// `queue resume`.
#[derive(Debug, Clone, clap::Args)]
pub struct ResumeArgs {
    /// The paused kind whose jobs workers claim again.
    pub kind: String,
}

pub async fn pause(
    admin: &TextAdmin,
    context: &Context,
    args: &PauseArgs,
    out: &mut impl Write,
) -> Result<()> {
    // Only for what to say: a pause made meanwhile reads as this one.
    let already = admin.paused().await?.iter().any(|p| p.kind == args.kind);
    let pause = admin.pause(&args.kind, &context.actor).await?;
    if context.json {
        return output::json(out, &pause);
    }
    if already {
        writeln!(
            out,
            "{} was already paused: {}",
            printable_line(&args.kind),
            since(&pause)
        )?;
    } else {
        writeln!(
            out,
            "paused {}: workers claim none of its jobs from within a second; running ones finish",
            printable_line(&args.kind)
        )?;
    }
    Ok(())
}

pub async fn resume(
    admin: &TextAdmin,
    context: &Context,
    args: &ResumeArgs,
    out: &mut impl Write,
) -> Result<()> {
    let ended = admin.resume(&args.kind).await?;
    if context.json {
        return output::json(
            out,
            &serde_json::json!({ "kind": args.kind, "ended": ended }),
        );
    }
    match ended {
        Some(pause) => writeln!(
            out,
            "resumed {} ({}); waiting workers were woken",
            printable_line(&args.kind),
            since(&pause)
        )?,
        None => writeln!(
            out,
            "{} was not paused; nothing changed",
            printable_line(&args.kind)
        )?,
    }
    Ok(())
}

pub async fn paused(admin: &TextAdmin, context: &Context, out: &mut impl Write) -> Result<()> {
    let pauses = admin.paused().await?;
    if context.json {
        return output::json(out, &pauses);
    }
    if pauses.is_empty() {
        writeln!(out, "no kind is paused")?;
        return Ok(());
    }
    let mut table = Table::new(vec!["KIND", "PAUSED", "BY"]);
    for pause in &pauses {
        table.row(vec![
            printable_line(&pause.kind),
            relative(Some(pause.since), Utc::now()),
            printable_line(&pause.by),
        ]);
    }
    Ok(table.print(out)?)
}

/// "paused 3m ago by alice".
pub(crate) fn since(pause: &PausedKind) -> String {
    format!(
        "paused {} by {}",
        relative(Some(pause.since), Utc::now()),
        printable_line(&pause.by)
    )
}
