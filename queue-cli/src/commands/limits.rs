//! `limit` and `limits`: how many jobs of a kind run at once and start per
//! second, in every worker process together.

use std::io::Write;

use anyhow::{bail, Result};
use chrono::Utc;
use queue_core::KindLimits;

use crate::output::{self, printable_line, relative, Table};
use crate::serve::TextAdmin;
use crate::Context;

/// `queue limit`.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// The kind to limit. A kind with no jobs yet can be limited.
    pub kind: String,
    /// At most this many of its jobs run at once, in every process
    /// together.
    #[arg(long, value_name = "N")]
    pub concurrency: Option<u32>,
    /// At most this many of its jobs start per second, on average (a
    /// fraction, such as 0.5, for one every two seconds).
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<f64>,
    /// How many may start at once after a quiet spell (default: one
    /// second's worth of the rate).
    #[arg(long, value_name = "N", requires = "rate")]
    pub burst: Option<u32>,
    /// Remove the kind's limits.
    #[arg(long, conflicts_with_all = ["concurrency", "rate", "burst"])]
    pub clear: bool,
}

pub async fn limit(
    admin: &TextAdmin,
    context: &Context,
    args: &LimitArgs,
    out: &mut impl Write,
) -> Result<()> {
    let mut limits = KindLimits::default();
    if let Some(n) = args.concurrency {
        limits = limits.max_running(n);
    }
    if let Some(rate) = args.rate {
        limits = limits.per_second(rate, args.burst);
    }
    if !args.clear && !limits.any() {
        bail!("give --concurrency N, --rate PER_SECOND (and --burst N), or --clear");
    }
    let set = admin
        .set_limits(&args.kind, &limits, &context.actor)
        .await?;
    if context.json {
        return output::json(
            out,
            &serde_json::json!({ "kind": args.kind, "limits": set }),
        );
    }
    let kind = printable_line(&args.kind);
    match set {
        Some(set) => writeln!(
            out,
            "limited {kind} to {}, in every worker process from within a second",
            set.limits.describe()
        )?,
        None => writeln!(out, "{kind} has no limits now")?,
    }
    Ok(())
}

pub async fn limits(admin: &TextAdmin, context: &Context, out: &mut impl Write) -> Result<()> {
    let limits = admin.limits().await?;
    if context.json {
        return output::json(out, &limits);
    }
    if limits.is_empty() {
        writeln!(out, "no kind has limits")?;
        return Ok(());
    }
    let mut table = Table::new(vec!["KIND", "LIMITS", "SET", "BY"]);
    for limit in &limits {
        table.row(vec![
            printable_line(&limit.kind),
            limit.limits.describe(),
            relative(Some(limit.set_at), Utc::now()),
            printable_line(&limit.set_by),
        ]);
    }
    Ok(table.print(out)?)
}
