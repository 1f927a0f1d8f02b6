//! Bulk operations from the CLI: a `retry`, `cancel`, `fail`, `delete` or
//! `purge` by filter is recorded as an operation and carried out here with
//! a progress bar, or, with `--detach`, left to a running `queue serve`;
//! and `queue ops` lists, shows, follows, aborts and resumes operations.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Result};
use chrono::Utc;
use queue_core::{
    run_operation, AbortOutcome, CancellationToken, NewOperation, Operation, OperationParams,
    OperationState, RunOptions, StopAs, StoreError, TakeOperation, MAX_OPERATION_PAGE,
};

use crate::output::{self, jobs, printable_line, progress, relative, Table};
use crate::serve::TextAdmin;
use crate::Context;

/// How often following an operation run elsewhere reads it again.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// `queue ops`.
#[derive(Debug, Clone, clap::Args)]
pub struct OpsArgs {
    #[command(subcommand)]
    pub command: Option<OpsCommand>,
    /// Operations per page, newest first.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Operations before this id (the `next` of the previous page).
    #[arg(long, value_name = "ID")]
    pub before: Option<i64>,
    /// Only operations that have not ended: pending, running, interrupted.
    #[arg(long)]
    pub open: bool,
}

/// What `queue ops` does to one operation.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum OpsCommand {
    /// One operation: what it does, to which jobs, how far it got.
    Show {
        /// The operation's id.
        id: i64,
        /// Follow it until it ends, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// Abort an operation: its runner stops after the batch under way; the
    /// jobs already changed stay changed.
    Abort {
        /// The operation's id.
        id: i64,
    },
    /// Carry an interrupted operation (or one whose runner died) on here,
    /// in the foreground, from where it stopped.
    Resume {
        /// The operation's id.
        id: i64,
    },
}

/// How a started operation came out.
pub(crate) enum Started {
    /// Recorded for `queue serve` to carry out.
    Detached(Operation<String>),
    /// Carried out here, to the end: the operation and how many batches.
    Done(Operation<String>, u64),
}

/// This process's name as a runner.
fn runner() -> String {
    format!("queue-cli:{}", queue_worker::default_worker_name())
}

/// Records `new` and carries it out here (or leaves it to `queue serve`
/// with `detach`). Where the store has nowhere to keep operations (the
/// operations table not created), it runs untracked, saying so, unless
/// `detach` asks for what only a recorded operation can do.
pub(crate) async fn start(
    admin: &TextAdmin,
    context: &Context,
    new: NewOperation,
    detach: bool,
) -> Result<Started> {
    new.check()?;
    let runner = runner();
    let op = match admin.create_operation(&new).await {
        Ok(op) => op,
        Err(StoreError::Refused(why)) if !detach => {
            eprintln!(
                "{}",
                printable_line(&format!(
                    "warning: {why}; this runs untracked: nothing else can follow, abort or resume it"
                ))
            );
            let mut op = Operation::new(0, new, Utc::now());
            op.state = OperationState::Running;
            op.runner = Some(runner.clone());
            let (op, batches) = run_here(admin, context, op, &runner, false).await?;
            return Ok(Started::Done(ended(op)?, batches));
        }
        Err(error) => return Err(error.into()),
    };
    if detach {
        return Ok(Started::Detached(op));
    }
    let Some(taken) = admin
        .take_operation(&TakeOperation::id(runner.clone(), op.id))
        .await?
    else {
        // A `queue serve` took it first: follow it there.
        let op = follow(admin, context, op.id).await?;
        return Ok(Started::Done(ended(op)?, 0));
    };
    let (op, batches) = run_here(admin, context, taken, &runner, true).await?;
    Ok(Started::Done(ended(op)?, batches))
}

/// What a detached operation's start prints.
pub(crate) fn print_detached(
    out: &mut impl Write,
    context: &Context,
    op: &Operation<String>,
) -> Result<()> {
    if context.json {
        return output::json(out, op);
    }
    writeln!(
        out,
        "recorded operation {id}: {} {}; a running `queue serve` carries it out \
         (follow it with `queue ops show {id} --wait`, abort it with `queue ops abort {id}`, \
         or run it here with `queue ops resume {id}`)",
        op.action.name(),
        jobs(op.total),
        id = op.id
    )?;
    Ok(())
}

/// Runs `op`, taken by `runner`, to its end here, with a progress bar;
/// Ctrl-C interrupts it after the batch under way. Returns it as it ended
/// and how many batches ran.
async fn run_here(
    admin: &TextAdmin,
    context: &Context,
    op: Operation<String>,
    runner: &str,
    tracked: bool,
) -> Result<(Operation<String>, u64)> {
    let stop = CancellationToken::new();
    let on_interrupt = stop.clone();
    let interrupt = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });
    let bar = progress(op.total, op.action.name(), !context.json);
    bar.set_position(op.done);
    let mut options = RunOptions::new(Duration::ZERO, StopAs::Interrupted);
    if !tracked {
        options = options.untracked();
    }
    let mut batches = 0;
    let ran = run_operation(admin, op, runner, &stop, options, |op| {
        batches += 1;
        bar.set_position(op.done);
    })
    .await;
    interrupt.abort();
    bar.finish_and_clear();
    Ok((ran?, batches))
}

/// Follows operation `id`, run elsewhere, until it ends (or Ctrl-C stops
/// the following, not the operation).
async fn follow(admin: &TextAdmin, context: &Context, id: i64) -> Result<Operation<String>> {
    let Some(mut op) = admin.operation(id).await? else {
        bail!("there is no operation {id}");
    };
    let bar = progress(op.total, op.action.name(), !context.json);
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    while matches!(op.state, OperationState::Pending | OperationState::Running) {
        bar.set_position(op.done);
        tokio::select! {
            _ = &mut interrupt => {
                bar.finish_and_clear();
                bail!("stopped following operation {id}, which goes on ({} of {} jobs so far)", op.done, op.total);
            }
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        op = match admin.operation(id).await? {
            Some(op) => op,
            None => bail!("operation {id} was removed while it ran"),
        };
    }
    bar.finish_and_clear();
    Ok(op)
}

/// `op` if it is done; otherwise the error that says how it ended and
/// what can be done about it.
fn ended(op: Operation<String>) -> Result<Operation<String>> {
    let id = op.id;
    let (done, total) = (op.done, op.total);
    let why = op.message.as_deref().unwrap_or("no reason given");
    let name = if id == 0 {
        "the operation".to_owned()
    } else {
        format!("operation {id}")
    };
    match op.state {
        OperationState::Done => Ok(op),
        OperationState::Interrupted if id == 0 => {
            bail!("interrupted after {done} of {}", jobs(total))
        }
        OperationState::Interrupted => bail!(
            "interrupted after {done} of {}: operation {id} waits; `queue ops resume {id}` carries it on, `queue ops abort {id}` ends it",
            jobs(total)
        ),
        OperationState::Aborted => bail!("{name} was aborted after {done} of {}: {why}", jobs(total)),
        OperationState::Failed => bail!("{name} failed after {done} of {}: {why}", jobs(total)),
        other => bail!(
            "{name} was taken over by {} after {done} of {} and is {other}",
            op.runner.as_deref().unwrap_or("another runner"),
            jobs(total)
        ),
    }
}

/// `queue ops`.
pub async fn run(
    admin: &TextAdmin,
    context: &Context,
    args: &OpsArgs,
    out: &mut impl Write,
) -> Result<()> {
    match &args.command {
        None => list(admin, context, args, out).await,
        Some(OpsCommand::Show { id, wait }) => {
            let op = if *wait {
                follow(admin, context, *id).await?
            } else {
                match admin.operation(*id).await? {
                    Some(op) => op,
                    None => bail!("there is no operation {id}"),
                }
            };
            show(out, context, &op)
        }
        Some(OpsCommand::Abort { id }) => {
            let op = match admin.abort_operation(*id, &context.actor).await? {
                None => bail!("there is no operation {id}"),
                Some(AbortOutcome::Aborted(op)) => op,
                Some(ended) => bail!(
                    "operation {id} had already ended: it is {}",
                    ended.operation().state
                ),
            };
            if context.json {
                return output::json(out, &op);
            }
            writeln!(
                out,
                "aborted operation {id} after {} of {}; its runner stops after the batch under way",
                op.done,
                jobs(op.total)
            )?;
            Ok(())
        }
        Some(OpsCommand::Resume { id }) => {
            let runner = runner();
            let Some(taken) = admin
                .take_operation(&TakeOperation::id(runner.clone(), *id))
                .await?
            else {
                match admin.operation(*id).await? {
                    None => bail!("there is no operation {id}"),
                    Some(op) => bail!(
                        "operation {id} cannot be resumed: it is {}{}",
                        op.state,
                        match (op.state, &op.runner) {
                            (OperationState::Running, Some(r)) =>
                                format!(", run by {r}, which was heard from lately"),
                            _ => String::new(),
                        }
                    ),
                }
            };
            let (op, _) = run_here(admin, context, taken, &runner, true).await?;
            let op = ended(op)?;
            if context.json {
                return output::json(out, &op);
            }
            writeln!(
                out,
                "{} {} (operation {id})",
                op.action.done(),
                jobs(op.done)
            )?;
            Ok(())
        }
    }
}

async fn list(
    admin: &TextAdmin,
    context: &Context,
    args: &OpsArgs,
    out: &mut impl Write,
) -> Result<()> {
    if args.limit == 0 || args.limit > MAX_OPERATION_PAGE {
        bail!("--limit must be between 1 and {MAX_OPERATION_PAGE}");
    }
    let mut params = OperationParams::newest(args.limit).before(args.before);
    if args.open {
        params = params.states([
            OperationState::Pending,
            OperationState::Running,
            OperationState::Interrupted,
        ]);
    }
    let ops = admin.operations(&params).await?;
    if context.json {
        return output::json(out, &ops);
    }
    if ops.is_empty() {
        writeln!(out, "no operations")?;
        return Ok(());
    }
    let now = Utc::now();
    let mut table = Table::new(vec![
        "ID", "ACTION", "STATE", "DONE", "BY", "STARTED", "JOBS", "NOTE",
    ])
    .right(0)
    .right(3);
    for op in &ops {
        table.row(vec![
            op.id.to_string(),
            op.action.name().to_owned(),
            op.state.to_string(),
            format!("{}/{}", op.done, op.total),
            op.by.clone(),
            relative(Some(op.created_at), now),
            output::cut(&super::bulk::describe(admin, &op.filter), 50),
            output::cut(op.message.as_deref().unwrap_or(""), 50),
        ]);
    }
    table.print(out)?;
    if ops.len() == args.limit {
        if let Some(last) = ops.last() {
            writeln!(out, "next page: --before {}", last.id)?;
        }
    }
    Ok(())
}

fn show(out: &mut impl Write, context: &Context, op: &Operation<String>) -> Result<()> {
    if context.json {
        return output::json(out, op);
    }
    let now = Utc::now();
    let when = |at| relative(at, now);
    let mut lines = vec![
        ("id", op.id.to_string()),
        ("action", op.action.name().to_owned()),
        ("state", op.state.to_string()),
        (
            "done",
            format!(
                "{} of {} ({:.0}%)",
                op.done,
                jobs(op.total),
                op.progress() * 100.0
            ),
        ),
        ("jobs", serde_json::to_string(&op.filter)?),
        ("by", op.by.clone()),
        ("batch", op.batch.to_string()),
        ("runner", op.runner.clone().unwrap_or_else(|| "-".into())),
        ("recorded", when(Some(op.created_at))),
        ("started", when(op.started_at)),
        ("last batch", when(Some(op.updated_at))),
        ("ended", when(op.finished_at)),
    ];
    if let queue_core::OperationAction::Fail { reason } = &op.action {
        lines.push(("reason", reason.clone()));
    }
    if let Some(message) = &op.message {
        lines.push(("note", message.clone()));
    }
    for (label, value) in lines {
        writeln!(out, "{label:>10}  {}", printable_line(&value))?;
    }
    Ok(())
}
