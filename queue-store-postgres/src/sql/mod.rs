//! Every SQL statement of the store, built once from the options and the
//! catalog when the store is created. Identifiers are always quoted
//! ([`Ident`](crate::Ident)); every value is a `$n` bind, named by a
//! [`Param`] so that optional columns can drop out of a statement without
//! leaving an unbound parameter behind.

pub(crate) mod admin;
pub(crate) mod catalog;
pub(crate) mod default_table;
#[cfg(test)]
mod plans;
pub(crate) mod prepared;

use std::collections::BTreeMap;

use queue_core::JobState;

use crate::conditions::PgCondition;
use crate::options::{ClaimCommit, Column, CompletedJobs, PgStoreOptions};
use prepared::{exactly_one, Prepared};

/// A named input of a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param {
    /// The stored value of a state (text, cast to the state column's type).
    State(JobState),
    Now,
    Worker,
    Id,
    Token,
    Ids,
    Tokens,
    /// Batched finish columns.
    TargetStates,
    FinishedAts,
    /// Single-row finish columns.
    TargetState,
    FinishedAt,
    Message,
    ProcessAfter,
    FailureIncrement,
    Messages,
    ProcessAfters,
    FailureIncrements,
    /// A log entry (json).
    Entry,
    StalledBefore,
    MaxResets,
    AtMostOnce,
    MaxResetsMessage,
    AtMostOnceMessage,
    /// Where a claim with the cursor starts: the priority (int8) and the key
    /// of the last job the previous claim took.
    CursorPriority,
    CursorKey,
    /// The admin contract's inputs: a notification channel, a filter's
    /// fields, a page's size and start, and an enqueue's arrays.
    Channel,
    FilterStates,
    FilterKinds,
    QueuedFrom,
    QueuedBefore,
    FinishedFrom,
    FinishedBefore,
    FailureText,
    Limit,
    After,
    /// The length of a timeline's interval, in whole seconds (int8).
    BucketSeconds,
    /// An enqueue's unique keys (text[], NULL for none) and whether each
    /// holds forever (bool[]).
    UniqueKeys,
    UniqueForevers,
    /// An enqueue's per-job attempt limits (int8[], NULL for none), expiry
    /// times (timestamptz[]) and at-most-once flags (bool[]).
    MaxAttemptses,
    ExpiresAts,
    AtMostOnces,
    Kinds,
    Payloads,
    Priorities,
}

/// A statement and the inputs its `$n` placeholders stand for, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Statement {
    pub text: String,
    pub params: Vec<Param>,
}

/// Builds statement text, numbering each distinct [`Param`] once.
#[derive(Default)]
struct Builder {
    text: String,
    params: Vec<Param>,
}

impl Builder {
    fn push(&mut self, sql: &str) -> &mut Self {
        self.text.push_str(sql);
        self
    }

    /// The placeholder of `param`, reusing its number if already used.
    fn p(&mut self, param: Param) -> String {
        let n = match self.params.iter().position(|p| *p == param) {
            Some(i) => i + 1,
            None => {
                self.params.push(param);
                self.params.len()
            }
        };
        format!("${n}")
    }

    fn build(self) -> Statement {
        Statement {
            text: self.text,
            params: self.params,
        }
    }
}

/// A string literal for a configured value (a state value, a channel name),
/// for statement text that cannot bind it. The `E''` form reads the same
/// whatever `standard_conforming_strings` says.
pub(crate) fn literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// `(SELECT CAST(input AS ty))`: an input of a batched statement that the
/// planner plans without, custom plan or generic. A batched statement joins
/// its arrays (`unnest`) to the table, and its guard compares the state with
/// the processing value. Seen by the planner, those values let it scan the
/// partial index of processing rows whole and hash the batch against it
/// (statistics taken before the jobs were claimed say it is nearly empty),
/// or with the state hidden alone, scan the table and hash: both read every
/// index entry or row, not the batch's, and the processing index keeps an
/// entry for every job claimed since the last vacuum. Unseen, the arrays
/// count as a few rows and the state as any value: one probe by key per
/// row, the plan Postgres then caches.
fn unseen(input: &str, ty: &str) -> String {
    format!("(SELECT CAST({input} AS {ty}))")
}

/// `unnest(..)` over a batched statement's arrays, each [`unseen`]: inputs
/// with their array types.
fn unnest_unseen(arrays: &[(&str, &str)]) -> String {
    let arrays: Vec<String> = arrays.iter().map(|(a, ty)| unseen(a, ty)).collect();
    format!("unnest({})", arrays.join(", "))
}

/// The name of the claim's last column when the cursor needs each job's
/// priority.
pub(crate) const CURSOR_PRIORITY_COLUMN: &str = "__queue_priority";
/// The claim's column of a job's own attempt limit (with
/// [`Column::MaxAttempts`]).
pub(crate) const MAX_ATTEMPTS_COLUMN: &str = "__queue_max_attempts";
/// The claim's column of whether a job is at-most-once (with
/// [`Column::AtMostOnce`]).
pub(crate) const AT_MOST_ONCE_COLUMN: &str = "__queue_at_most_once";

/// What the catalog told about the table.
#[derive(Debug, Clone)]
pub(crate) struct TableShape {
    /// `format_type` of the state column (`text`, or the enum's name).
    pub state_type: String,
    /// `format_type` of the key column.
    pub key_type: String,
    /// Element type of the execution-log array: `json` or `jsonb`.
    pub log_element: String,
    /// `format_type` of the payload column, if the table has one.
    pub payload_type: Option<String>,
    /// Whether the table has the default table's notify trigger.
    pub notify_trigger: bool,
    /// `json` or `jsonb` when the failure column is one (it then holds an
    /// object with the message, the attempt and the time; see
    /// [`failure_value`]); `None` for text.
    pub failure_json: Option<String>,
    /// Every column of the table, enum columns cast to text, if it has
    /// any (unqualified names after the alias).
    pub text_select: Option<String>,
    /// The archive purged jobs move to, quoted, and the table's columns
    /// (quoted), which it has too; `None` without one.
    pub archive: Option<(String, Vec<String>)>,
}

/// What a write puts in the failure column for `message` (an SQL text
/// expression; NULL writes NULL): the text itself, or in a `json`/`jsonb`
/// column the object `{"message": .., "attempt": .., "at": ..}`, the
/// attempt being the one that failed (`attempt`, an SQL integer
/// expression, or null when the table counts none) and the time the
/// database's.
pub(crate) fn failure_value(shape: &TableShape, message: &str, attempt: Option<&str>) -> String {
    match &shape.failure_json {
        None => message.to_owned(),
        Some(json) => format!(
            "CASE WHEN {message} IS NULL THEN NULL ELSE CAST(jsonb_build_object('message', {message}, \
             'attempt', {attempt}, 'at', now()) AS {json}) END",
            attempt = attempt.unwrap_or("NULL")
        ),
    }
}

/// The failure message as text, from the failure column at `at`.
pub(crate) fn failure_text(shape: &TableShape, at: &str) -> String {
    match &shape.failure_json {
        None => format!("CAST({at} AS text)"),
        Some(_) => format!("({at} ->> 'message')"),
    }
}

/// All statements of one store.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// The claim, up to the place where extra conditions go.
    claim_head: String,
    /// The claim's order, up to its (literal) limit.
    claim_order: String,
    /// The claim after the extra conditions.
    claim_tail: String,
    claim_params: Vec<Param>,
    /// With the claim cursor: the condition that starts the claim's scan
    /// after the cursor, numbered after `claim_params`, and its inputs.
    claim_after: Option<(String, Vec<Param>)>,
    pub select_view: Option<Statement>,
    /// Claimed rows by key with enum columns cast to text, for a record
    /// type that reads them as strings; `None` without enum columns (or
    /// with a view or select list of the user's).
    pub select_text: Option<Statement>,
    pub lock: Statement,
    /// The lock of a job's transaction, prepared: fails ([`prepared::NOT_HELD`])
    /// unless it locked the claim's row.
    pub held_lock: Prepared,
    /// The completion inside a job's transaction, prepared: fails
    /// ([`prepared::NOT_HELD`]) unless it completed the claim's row.
    pub held_complete: Prepared,
    /// Prepares the two above on a connection that lacks them, without an
    /// error on one that has them (see [`prepared::prepare_missing`]).
    pub prepare_held: String,
    /// The earliest `process_after` of a waiting job later than
    /// [`Param::Now`]; `None` without the column.
    pub next_due: Option<Statement>,
    pub finish: Statement,
    /// The same for one attempt, without arrays (cheaper to plan and run).
    pub finish_one: Statement,
    /// The finish of attempts that succeeded (many, and one): it sets the
    /// completed state and the finish time, or with
    /// [`CompletedJobs::Delete`] deletes their rows.
    pub finish_succeeded: (Statement, Statement),
    pub heartbeat: Statement,
    pub append_log: Option<Statement>,
}

/// Quoted column names, by standard column, for the present ones.
#[derive(Debug, Clone)]
struct Names {
    alias: String,
    cols: BTreeMap<Column, String>,
}

impl Names {
    fn get(&self, c: Column) -> Option<&str> {
        self.cols.get(&c).map(String::as_str)
    }

    /// `alias."column"`.
    fn at(&self, c: Column) -> Option<String> {
        self.get(c).map(|name| format!("{}.{}", self.alias, name))
    }

    fn must(&self, c: Column) -> String {
        // Id and state can never be absent (checked by the options).
        self.at(c)
            .unwrap_or_else(|| format!("{}.\"{}\"", self.alias, c.standard_name()))
    }
}

impl Statements {
    /// The statements for the table `options` describe, less the columns
    /// the catalog found `absent`.
    pub(crate) fn new(
        options: &PgStoreOptions,
        shape: &TableShape,
        absent: &[Column],
    ) -> Statements {
        let names = Names {
            alias: options.alias.quoted(),
            cols: Column::ALL
                .iter()
                .filter(|c| !absent.contains(c))
                .filter_map(|c| options.column_name(*c).map(|i| (*c, i.quoted())))
                .collect(),
        };
        let table = options.table.quoted();
        let a = names.alias.clone();
        let st = &shape.state_type;
        let kt = &shape.key_type;
        let id = names.must(Column::Id);
        let id_name = names.get(Column::Id).unwrap_or("\"id\"").to_owned();
        let state = names.must(Column::State);
        let state_name = names.get(Column::State).unwrap_or("\"state\"").to_owned();
        let token = match names.at(Column::ClaimToken) {
            Some(token) => token,
            None => format!(
                "(extract(epoch from {}) * 1000000)::int8",
                names.must(Column::StartedAt)
            ),
        };
        let failures = names
            .at(Column::NumFailures)
            .map(|f| format!("{f}::int8"))
            .unwrap_or_else(|| "0::int8".into());
        let select = options.select.clone().unwrap_or_else(|| format!("{a}.*"));
        let order = options
            .order_by
            .clone()
            .unwrap_or_else(|| match names.at(Column::Priority) {
                Some(priority) => format!("{priority} DESC, {id}"),
                None => id.clone(),
            });

        // Claim: lock up to $limit eligible rows, skipping locked ones, and
        // mark them processing in the same statement. The update finds the
        // rows by key (`= ANY(ARRAY(..))`), which keeps large batches on the
        // primary key instead of a join the planner may turn into a scan of
        // the table; `__queue_rank` restores the claim order. The store reads
        // the four `__queue_*` columns by position: keep them first, in order.
        //
        // The claimable states and the batch size are literals, not binds:
        // only with the state values in its text can a cached generic plan
        // use a partial index on them, and only with a known limit is that
        // plan as cheap as a custom one, so each claim size is planned a few
        // times per connection instead of on every call (0.1-0.15 ms each;
        // the worker claims in a few sizes only). Both come from the options
        // and the caller, never from job data.
        let mut b = Builder::default();
        let (queued, errored) = (
            literal(options.states.get(JobState::Queued)),
            literal(options.states.get(JobState::Errored)),
        );
        b.push(&format!(
            "WITH candidates AS (SELECT {id} FROM {table} AS {a} WHERE {state} IN (CAST({queued} AS {st}), CAST({errored} AS {st}))"
        ));
        if options.claim_commit == ClaimCommit::Async {
            // An initplan run once per claim; `true`: for the statement's
            // own transaction only, so it holds at its commit and is gone
            // after.
            b.push(" AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'");
        }
        if let Some(after) = names.at(Column::ProcessAfter) {
            let now = b.p(Param::Now);
            b.push(&format!(" AND ({after} IS NULL OR {after} <= {now})"));
        }
        if let Some(expires) = names.at(Column::ExpiresAt) {
            // Expired jobs are never started; the resetter's sweep ends them.
            let now = b.p(Param::Now);
            b.push(&format!(" AND ({expires} IS NULL OR {expires} > {now})"));
        }
        let claim_head = std::mem::take(&mut b.text);
        let claim_order = format!(" ORDER BY {order} LIMIT ");
        let processing = b.p(Param::State(JobState::Processing));
        let mut sets = vec![format!("{state_name} = CAST({processing} AS {st})")];
        for c in [Column::StartedAt, Column::LastHeartbeatAt] {
            if let Some(name) = names.get(c) {
                let now = b.p(Param::Now);
                sets.push(format!("{name} = {now}"));
            }
        }
        if let Some(name) = names.get(Column::WorkerHostname) {
            let worker = b.p(Param::Worker);
            sets.push(format!("{name} = {worker}"));
        }
        if let (Some(name), Some(at)) =
            (names.get(Column::ClaimToken), names.at(Column::ClaimToken))
        {
            // A random step (up to 2^30): a claim made again after a claim
            // the server forgot in a crash gets a token of its own.
            sets.push(format!(
                "{name} = {at} + 1 + floor(random() * 1073741824)::int8"
            ));
        }
        if let Some(name) = names.get(Column::ExecutionLogs) {
            sets.push(format!("{name} = '{{}}'"));
        }
        let mut returning_record = if options.view.is_none() {
            format!(", {select}")
        } else {
            String::new()
        };
        // The cursor needs an order it can start in the middle of with one
        // index condition: by key within one priority.
        let cursor = options.cursor_rescan_after().is_some();
        let cursor_priority = names.at(Column::Priority).filter(|_| cursor);
        if let Some(priority) = &cursor_priority {
            // Last, so that a decoder reading the record by position is not
            // disturbed.
            returning_record.push_str(&format!(
                ", {priority}::int8 AS \"{}\"",
                CURSOR_PRIORITY_COLUMN
            ));
        }
        // A job's own limits, read by name where the table keeps them.
        if let Some(max) = names.at(Column::MaxAttempts) {
            returning_record.push_str(&format!(", {max}::int8 AS \"{MAX_ATTEMPTS_COLUMN}\""));
        }
        if let Some(amo) = names.at(Column::AtMostOnce) {
            returning_record.push_str(&format!(", ({amo}) IS TRUE AS \"{AT_MOST_ONCE_COLUMN}\""));
        }
        b.push(&format!(
            " FOR UPDATE SKIP LOCKED) \
             UPDATE {table} AS {a} SET {sets} WHERE {id} = ANY(ARRAY(SELECT {id_name} FROM candidates)) \
             RETURNING {id} AS \"__queue_id\", {token} AS \"__queue_token\", {failures} AS \"__queue_failures\", \
             array_position(ARRAY(SELECT {id_name} FROM candidates), {id}) AS \"__queue_rank\"{returning_record}",
            sets = sets.join(", ")
        ));
        let claim_tail = b.text;
        let claim_params = b.params;
        let claim_after = cursor.then(|| {
            let n = claim_params.len() + 1;
            let mut params = claim_params.clone();
            let condition = match &cursor_priority {
                Some(priority) => {
                    params.extend([Param::CursorPriority, Param::CursorKey]);
                    format!(" AND {priority} = ${n} AND {id} > ${}", n + 1)
                }
                None => {
                    params.push(Param::CursorKey);
                    format!(" AND {id} > ${n}")
                }
            };
            (condition, params)
        });

        let select_view = options.view.as_ref().map(|view| {
            let mut b = Builder::default();
            let ids = b.p(Param::Ids);
            b.push(&format!(
                "SELECT {id} AS \"__queue_id\", {select} FROM {view} AS {a} WHERE {id} = ANY(CAST({ids} AS {kt}[]))",
                view = view.quoted()
            ));
            b.build()
        });

        let select_text = shape
            .text_select
            .as_ref()
            .filter(|_| options.select.is_none() && options.view.is_none())
            .map(|list| {
                let mut b = Builder::default();
                let ids = b.p(Param::Ids);
                b.push(&format!(
                    "SELECT {id} AS \"__queue_id\", {list} FROM {table} AS {a} WHERE {id} = ANY(CAST({ids} AS {kt}[]))"
                ));
                b.build()
            });

        // Guards shared by the per-job statements.
        let held = |b: &mut Builder| {
            let (i, p, t) = (
                b.p(Param::Id),
                b.p(Param::State(JobState::Processing)),
                b.p(Param::Token),
            );
            format!("{id} = {i} AND {state} = CAST({p} AS {st}) AND {token} = {t}")
        };

        let mut b = Builder::default();
        let guard = held(&mut b);
        // FOR KEY SHARE: proves liveness to the resetter (whose FOR UPDATE
        // skips the row) without blocking heartbeats, cancel flags and log
        // appends, which update non-key columns only.
        b.push(&format!(
            "SELECT 1 FROM {table} AS {a} WHERE {guard} FOR KEY SHARE"
        ));
        let lock = b.build();

        // The same guard with the processing state spelled out, for the
        // prepared statements of a job's transaction (their arguments are
        // the key, the token and the time only).
        let processing = literal(options.states.get(JobState::Processing));
        let held_literally = |b: &mut Builder| {
            let (i, t) = (b.p(Param::Id), b.p(Param::Token));
            format!("{id} = {i} AND {state} = CAST({processing} AS {st}) AND {token} = {t}")
        };
        let mut b = Builder::default();
        let guard = held_literally(&mut b);
        b.push(&exactly_one(&format!(
            "(SELECT 1 FROM {table} AS {a} WHERE {guard} FOR KEY SHARE) AS \"__queue_held\""
        )));
        let held_lock = Prepared::new("lock", b.build());

        let deleting = options.completed_jobs == CompletedJobs::Delete;
        let mut b = Builder::default();
        let guard = held_literally(&mut b);
        let done = if deleting {
            format!("DELETE FROM {table} AS {a} WHERE {guard} RETURNING 1")
        } else {
            let completed = literal(options.states.get(JobState::Completed));
            let mut sets = vec![format!("{state_name} = CAST({completed} AS {st})")];
            if let Some(n) = names.get(Column::FinishedAt) {
                sets.push(format!("{n} = {}", b.p(Param::FinishedAt)));
            }
            format!(
                "UPDATE {table} AS {a} SET {sets} WHERE {guard} RETURNING 1",
                sets = sets.join(", ")
            )
        };
        b.push(&format!(
            "WITH \"__queue_done\" AS ({done}) {}",
            exactly_one("\"__queue_done\"")
        ));
        let held_complete = Prepared::new("complete", b.build());

        // Finish: many attempts in one statement, each guarded by its lease,
        // or one attempt with plain parameters.
        let finish_sets = |b: &mut Builder, batch: bool| {
            let mut value = |one: Param, field: &str| {
                if batch {
                    format!("u.{field}")
                } else {
                    b.p(one)
                }
            };
            let target = value(Param::TargetState, "target");
            let mut sets = vec![format!("{state_name} = CAST({target} AS {st})")];
            if let (Some(n), Some(at)) =
                (names.get(Column::FinishedAt), names.at(Column::FinishedAt))
            {
                let v = value(Param::FinishedAt, "finished_at");
                sets.push(format!("{n} = COALESCE({v}, {at})"));
            }
            if let (Some(n), Some(at)) = (
                names.get(Column::FailureMessage),
                names.at(Column::FailureMessage),
            ) {
                let v = value(Param::Message, "message");
                let attempt = names.at(Column::NumFailures).map(|f| format!("{f} + 1"));
                let v = failure_value(shape, &v, attempt.as_deref());
                sets.push(format!("{n} = COALESCE({v}, {at})"));
            }
            if let (Some(n), Some(at)) = (
                names.get(Column::ProcessAfter),
                names.at(Column::ProcessAfter),
            ) {
                let v = value(Param::ProcessAfter, "process_after");
                sets.push(format!("{n} = COALESCE({v}, {at})"));
            }
            if let (Some(n), Some(at)) = (
                names.get(Column::NumFailures),
                names.at(Column::NumFailures),
            ) {
                let v = value(Param::FailureIncrement, "failed");
                sets.push(format!("{n} = {at} + {v}"));
            }
            sets.join(", ")
        };
        let mut b = Builder::default();
        let (ids, tokens, targets, finished, messages, afters, incs, processing) = (
            b.p(Param::Ids),
            b.p(Param::Tokens),
            b.p(Param::TargetStates),
            b.p(Param::FinishedAts),
            b.p(Param::Messages),
            b.p(Param::ProcessAfters),
            b.p(Param::FailureIncrements),
            b.p(Param::State(JobState::Processing)),
        );
        let sets = finish_sets(&mut b, true);
        // The guard of the batched statements over `unnest(..) AS u(id,
        // token, ..)`, their inputs [`unseen`]: joined on the key alone, so
        // that the plan looks each outcome's row up by key. A second
        // condition `{id} = ANY(ids)` made the cached plan read the batch's
        // rows once and compare every outcome with every row: 14 ms for 500
        // outcomes, where probing takes 2-4.
        let held_batch = |processing: &str| {
            format!(
                "{id} = u.id AND {state} = {} AND {token} = u.token",
                unseen(processing, st)
            )
        };
        let guard = held_batch(&processing);
        let keys = format!("{kt}[]");
        b.push(&format!(
            "UPDATE {table} AS {a} SET {sets} FROM {} \
             AS u(id, token, target, finished_at, message, process_after, failed) \
             WHERE {guard} RETURNING {id}",
            unnest_unseen(&[
                (&ids, &keys),
                (&tokens, "int8[]"),
                (&targets, "text[]"),
                (&finished, "timestamptz[]"),
                (&messages, "text[]"),
                (&afters, "timestamptz[]"),
                (&incs, "int4[]"),
            ]),
        ));
        let finish = b.build();

        let mut b = Builder::default();
        let guard = held(&mut b);
        let sets = finish_sets(&mut b, false);
        b.push(&format!(
            "UPDATE {table} AS {a} SET {sets} WHERE {guard} RETURNING {id}"
        ));
        let finish_one = b.build();

        // Attempts that succeeded: a completion writes the state and the
        // finish time only, so it unnests three arrays instead of seven
        // (unnesting the other four took about a quarter of the statement,
        // ~1 µs a row). Or, with `CompletedJobs::Delete`, deletes the rows:
        // the same guards.
        let finish_succeeded = if deleting {
            let mut b = Builder::default();
            let (ids, tokens, processing) = (
                b.p(Param::Ids),
                b.p(Param::Tokens),
                b.p(Param::State(JobState::Processing)),
            );
            let guard = held_batch(&processing);
            b.push(&format!(
                "DELETE FROM {table} AS {a} USING {} AS u(id, token) \
                 WHERE {guard} RETURNING {id}",
                unnest_unseen(&[(&ids, &keys), (&tokens, "int8[]")]),
            ));
            let many = b.build();
            let mut b = Builder::default();
            let guard = held(&mut b);
            b.push(&format!(
                "DELETE FROM {table} AS {a} WHERE {guard} RETURNING {id}"
            ));
            (many, b.build())
        } else {
            let mut b = Builder::default();
            let (ids, tokens, finished, completed, processing) = (
                b.p(Param::Ids),
                b.p(Param::Tokens),
                b.p(Param::FinishedAts),
                b.p(Param::State(JobState::Completed)),
                b.p(Param::State(JobState::Processing)),
            );
            let mut sets = vec![format!("{state_name} = CAST({completed} AS {st})")];
            if let (Some(n), Some(at)) =
                (names.get(Column::FinishedAt), names.at(Column::FinishedAt))
            {
                sets.push(format!("{n} = COALESCE(u.finished_at, {at})"));
            }
            let guard = held_batch(&processing);
            b.push(&format!(
                "UPDATE {table} AS {a} SET {sets} FROM {} \
                 AS u(id, token, finished_at) WHERE {guard} RETURNING {id}",
                unnest_unseen(&[
                    (&ids, &keys),
                    (&tokens, "int8[]"),
                    (&finished, "timestamptz[]"),
                ]),
                sets = sets.join(", ")
            ));
            (b.build(), finish_one.clone())
        };

        // Heartbeat: report which leases still hold (and their cancel flag);
        // bump the heartbeat of those no transaction has locked (a locked
        // row is alive by its lock).
        let mut b = Builder::default();
        let (ids, tokens, processing) = (
            b.p(Param::Ids),
            b.p(Param::Tokens),
            b.p(Param::State(JobState::Processing)),
        );
        let cancel = names.at(Column::Cancel).unwrap_or_else(|| "false".into());
        // Its inputs [`unseen`], as in the batched finishes.
        let leases = unnest_unseen(&[(&ids, &keys), (&tokens, "int8[]")]);
        let processing = unseen(&processing, st);
        b.push(&format!(
            "WITH leases AS (SELECT * FROM {leases} AS l(id, token)), \
             held AS (SELECT {id} AS id, ({cancel}) IS TRUE AS cancel FROM {table} AS {a} JOIN leases l ON {id} = l.id \
             WHERE {state} = {processing} AND {token} = l.token)"
        ));
        if let (Some(n), Some(_)) = (
            names.get(Column::LastHeartbeatAt),
            names.at(Column::LastHeartbeatAt),
        ) {
            let now = b.p(Param::Now);
            b.push(&format!(
                ", bumped AS (UPDATE {table} AS {a} SET {n} = {now} WHERE {id} IN (\
                 SELECT {id} FROM {table} AS {a} JOIN leases l ON {id} = l.id \
                 WHERE {state} = {processing} AND {token} = l.token FOR NO KEY UPDATE OF {a} SKIP LOCKED))"
            ));
        }
        b.push(" SELECT id, cancel FROM held");
        let heartbeat = b.build();

        // The earliest time a waiting job comes due after $now (the default
        // table's due index answers it with one probe).
        let next_due = names.at(Column::ProcessAfter).map(|after| {
            let mut b = Builder::default();
            let now = b.p(Param::Now);
            b.push(&format!(
                "SELECT min({after}) FROM {table} AS {a} WHERE {state} IN (CAST({queued} AS {st}), CAST({errored} AS {st})) \
                 AND {after} IS NOT NULL AND {after} > {now}",
                state = names.must(Column::State),
            ));
            b.build()
        });

        let append_log = names.get(Column::ExecutionLogs).map(|n| {
            let mut b = Builder::default();
            let guard = held(&mut b);
            let entry = b.p(Param::Entry);
            let at = names.must(Column::ExecutionLogs);
            let el = &shape.log_element;
            b.push(&format!(
                "UPDATE {table} AS {a} SET {n} = array_append(COALESCE({at}, '{{}}'), CAST({entry} AS {el})) WHERE {guard}"
            ));
            b.build()
        });

        Statements {
            claim_head,
            claim_order,
            claim_tail,
            claim_params,
            claim_after,
            select_view,
            select_text,
            lock,
            prepare_held: prepared::prepare_missing(&[&held_lock, &held_complete]),
            next_due,
            held_lock,
            held_complete,
            finish,
            finish_one,
            finish_succeeded,
            heartbeat,
            append_log,
        }
    }

    /// The claim statement for up to `limit` jobs with `conditions`
    /// spliced in; condition placeholders are numbered after the statement's
    /// own parameters.
    pub(crate) fn claim(&self, conditions: &[PgCondition], limit: usize) -> Statement {
        let mut text = self.claim_head.clone();
        let mut next = self.claim_params.len() + 1;
        for condition in conditions {
            text.push_str(" AND (");
            text.push_str(&condition.numbered(&mut next));
            text.push(')');
        }
        text.push_str(&self.claim_order);
        text.push_str(&limit.to_string());
        text.push_str(&self.claim_tail);
        Statement {
            text,
            params: self.claim_params.clone(),
        }
    }

    /// The claim of up to `limit` jobs after the cursor (no extra
    /// conditions), if the store keeps one.
    pub(crate) fn claim_after_cursor(&self, limit: usize) -> Option<Statement> {
        let (condition, params) = self.claim_after.as_ref()?;
        Some(Statement {
            text: format!(
                "{}{condition}{}{limit}{}",
                self.claim_head, self.claim_order, self.claim_tail
            ),
            params: params.clone(),
        })
    }

    /// Whether claims return the priority of each job for the cursor (as
    /// their last column, [`CURSOR_PRIORITY_COLUMN`]).
    pub(crate) fn cursor_reads_priority(&self) -> bool {
        self.claim_after
            .as_ref()
            .is_some_and(|(_, params)| params.contains(&Param::CursorPriority))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> TableShape {
        TableShape {
            state_type: "text".into(),
            key_type: "bigint".into(),
            log_element: "json".into(),
            payload_type: Some("jsonb".into()),
            notify_trigger: true,
            failure_json: None,
            text_select: None,
            archive: None,
        }
    }

    #[test]
    fn job_transaction_statements_spell_out_states_and_take_key_token_and_time() {
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .state_value(JobState::Processing, "it's");
        let s = Statements::new(&options, &shape(), &[]);
        let lock = s.held_lock.text();
        assert!(lock.contains("CAST(E'it''s' AS text)"), "{lock}");
        assert!(lock.contains("FOR KEY SHARE"), "{lock}");
        let args = |p: Param| Some(format!("{p:?}"));
        assert_eq!(
            s.held_lock.execute(args).unwrap(),
            format!("EXECUTE {}(Id, Token)", s.held_lock.name)
        );
        let complete = s.held_complete.text();
        assert!(
            complete.contains("SET \"state\" = CAST(E'completed' AS text), \"finished_at\" = $3"),
            "{complete}"
        );
        assert_eq!(
            s.held_complete.execute(args).unwrap(),
            format!("EXECUTE {}(Id, Token, FinishedAt)", s.held_complete.name)
        );
        assert_ne!(s.held_lock.name, s.held_complete.name);
    }

    #[test]
    fn default_claim_quotes_names_binds_values_and_spells_out_states_and_limit() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let claim = Statements::new(&options, &shape(), &[]).claim(&[], 32);
        assert_eq!(
            claim.text,
            "WITH candidates AS (SELECT \"jobs\".\"id\" FROM \"public\".\"jobs\" AS \"jobs\" \
             WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
             AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off' \
             AND (\"jobs\".\"process_after\" IS NULL OR \"jobs\".\"process_after\" <= $1) \
             AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $1) \
             ORDER BY \"jobs\".\"priority\" DESC, \"jobs\".\"id\" LIMIT 32 FOR UPDATE SKIP LOCKED) \
             UPDATE \"public\".\"jobs\" AS \"jobs\" SET \"state\" = CAST($2 AS text), \"started_at\" = $1, \
             \"last_heartbeat_at\" = $1, \"worker_hostname\" = $3, \"claim_token\" = \"jobs\".\"claim_token\" + 1 + floor(random() * 1073741824)::int8, \
             \"execution_logs\" = '{}' WHERE \"jobs\".\"id\" = ANY(ARRAY(SELECT \"id\" FROM candidates)) \
             RETURNING \"jobs\".\"id\" AS \"__queue_id\", \"jobs\".\"claim_token\" AS \"__queue_token\", \
             \"jobs\".\"num_failures\"::int8 AS \"__queue_failures\", \
             array_position(ARRAY(SELECT \"id\" FROM candidates), \"jobs\".\"id\") AS \"__queue_rank\", \"jobs\".*, \
             \"jobs\".\"priority\"::int8 AS \"__queue_priority\", \
             \"jobs\".\"max_attempts\"::int8 AS \"__queue_max_attempts\", \
             (\"jobs\".\"at_most_once\") IS TRUE AS \"__queue_at_most_once\""
        );
        assert_eq!(
            claim.params,
            [
                Param::Now,
                Param::State(JobState::Processing),
                Param::Worker
            ]
        );
    }

    #[test]
    fn the_cursor_claim_starts_after_a_key_within_a_priority() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let s = Statements::new(&options, &shape(), &[]);
        let from_start = s.claim(&[], 32);
        let after = s.claim_after_cursor(32).expect("a cursor by default");
        assert_eq!(
            after.text,
            from_start.text.replacen(
                " ORDER BY",
                " AND \"jobs\".\"priority\" = $4 AND \"jobs\".\"id\" > $5 ORDER BY",
                1
            ),
            "the claim from the start with one more condition, numbered after its inputs"
        );
        assert_eq!(after.params[3..], [Param::CursorPriority, Param::CursorKey]);
        assert!(s.cursor_reads_priority());

        let by_key = Statements::new(
            &options.clone().without(Column::Priority).unwrap(),
            &shape(),
            &[],
        );
        let after = by_key.claim_after_cursor(8).expect("a cursor by key alone");
        assert!(
            after
                .text
                .contains(" AND \"jobs\".\"id\" > $4 ORDER BY \"jobs\".\"id\" LIMIT 8"),
            "{}",
            after.text
        );
        assert_eq!(after.params[3..], [Param::CursorKey]);
        assert!(!by_key.cursor_reads_priority());
        assert!(!by_key.claim(&[], 8).text.contains("__queue_priority"));

        for without in [
            options.clone().claim_cursor(None),
            options.clone().order_by("jobs.queued_at"),
        ] {
            let s = Statements::new(&without, &shape(), &[]);
            assert!(s.claim_after_cursor(32).is_none(), "{without:?}");
            assert!(!s.claim(&[], 32).text.contains("__queue_priority"));
        }
    }

    #[test]
    fn batched_statements_join_on_the_key_alone_with_inputs_the_planner_cannot_see() {
        let keep = Statements::new(&PgStoreOptions::new("jobs").unwrap(), &shape(), &[]);
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .completed_jobs(CompletedJobs::Delete);
        let delete = Statements::new(&options, &shape(), &[]);
        for statement in [
            &keep.finish,
            &keep.finish_succeeded.0,
            &delete.finish_succeeded.0,
        ] {
            assert!(
                statement.text.contains(
                    "WHERE \"jobs\".\"id\" = u.id AND \"jobs\".\"state\" = (SELECT CAST($"
                ),
                "{}",
                statement.text
            );
            // A second condition on the keys misleads the generic plan into
            // comparing every outcome with every row.
            assert!(!statement.text.contains("ANY("), "{}", statement.text);
        }
        for statement in [
            &keep.finish,
            &keep.finish_succeeded.0,
            &delete.finish_succeeded.0,
            &keep.heartbeat,
        ] {
            // Every array reaches `unnest` through an initplan, as does
            // the processing state, whatever else the statement compares.
            let text = &statement.text;
            let unnest = text.find("unnest(").expect("an unnest") + "unnest(".len();
            let arrays = &text[unnest..text[unnest..].find(") AS ").map_or(0, |e| unnest + e)];
            assert!(
                arrays
                    .split(", ")
                    .all(|a| a.starts_with("(SELECT CAST($") && a.ends_with("[]))")),
                "{text}"
            );
            assert!(!text.contains("\"jobs\".\"state\" = CAST($"), "{text}");
        }
    }

    #[test]
    fn a_batch_of_successes_writes_the_state_and_the_finish_time_only() {
        let keep = Statements::new(&PgStoreOptions::new("jobs").unwrap(), &shape(), &[]);
        let (many, one) = &keep.finish_succeeded;
        assert_eq!(
            many.text,
            "UPDATE \"public\".\"jobs\" AS \"jobs\" SET \"state\" = CAST($4 AS text), \
             \"finished_at\" = COALESCE(u.finished_at, \"jobs\".\"finished_at\") \
             FROM unnest((SELECT CAST($1 AS bigint[])), (SELECT CAST($2 AS int8[])), (SELECT CAST($3 AS timestamptz[]))) \
             AS u(id, token, finished_at) WHERE \"jobs\".\"id\" = u.id AND \"jobs\".\"state\" = (SELECT CAST($5 AS text)) \
             AND \"jobs\".\"claim_token\" = u.token RETURNING \"jobs\".\"id\"",
            "a success writes its state and finish time, nothing else"
        );
        assert_eq!(
            many.params,
            [
                Param::Ids,
                Param::Tokens,
                Param::FinishedAts,
                Param::State(JobState::Completed),
                Param::State(JobState::Processing)
            ]
        );
        assert_eq!(one.text, keep.finish_one.text);
    }

    #[test]
    fn deleting_completed_jobs_turns_only_the_completions_into_deletes() {
        let keep = Statements::new(&PgStoreOptions::new("jobs").unwrap(), &shape(), &[]);
        assert!(keep.held_complete.text().contains("UPDATE"));
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .completed_jobs(CompletedJobs::Delete);
        let delete = Statements::new(&options, &shape(), &[]);
        let complete = delete.held_complete.text();
        assert!(
            complete.starts_with("WITH \"__queue_done\" AS (DELETE FROM \"public\".\"jobs\" AS \"jobs\" WHERE \"jobs\".\"id\" = $1"),
            "{complete}"
        );
        assert_eq!(
            delete
                .held_complete
                .execute(|p| Some(format!("{p:?}")))
                .as_deref()
                .map(|e| e.contains("FinishedAt")),
            Some(false)
        );
        let (many, one) = &delete.finish_succeeded;
        for statement in [many, one] {
            assert!(
                statement.text.starts_with("DELETE FROM"),
                "{}",
                statement.text
            );
            assert!(
                statement.text.contains("\"jobs\".\"claim_token\" = "),
                "{}",
                statement.text
            );
        }
        // Failures, retries, cancels and releases still update.
        assert_eq!(delete.finish.text, keep.finish.text);
        assert_eq!(delete.finish_one.text, keep.finish_one.text);
    }

    #[test]
    fn literals_keep_quotes_and_backslashes_as_they_are() {
        assert_eq!(literal("queued"), "E'queued'");
        assert_eq!(literal("it's"), "E'it''s'");
        assert_eq!(
            literal("a\\'); DROP TABLE x; --"),
            "E'a\\\\''); DROP TABLE x; --'"
        );
    }

    #[test]
    fn only_async_claims_turn_synchronous_commit_off() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let asynchronous = Statements::new(&options, &shape(), &[]).claim(&[], 8).text;
        let durable = Statements::new(&options.claim_commit(ClaimCommit::Durable), &shape(), &[])
            .claim(&[], 8)
            .text;
        assert!(asynchronous.contains("set_config('synchronous_commit', 'off', true)"));
        assert!(!durable.contains("synchronous_commit"), "{durable}");
    }

    #[test]
    fn awkward_names_stay_quoted_identifiers() {
        let options = PgStoreOptions::new("select")
            .unwrap()
            .schema("My \"Schema\"")
            .unwrap()
            .column(Column::State, "Status; DROP TABLE x")
            .unwrap();
        let s = Statements::new(&options, &shape(), &[]);
        let claim = s.claim(&[], 8).text;
        assert!(
            claim.contains("FROM \"My \"\"Schema\"\"\".\"select\" AS \"select\""),
            "{claim}"
        );
        assert!(
            claim.contains("\"select\".\"Status; DROP TABLE x\" IN"),
            "{claim}"
        );
        assert!(
            !claim.contains("Status; DROP TABLE x\" =")
                || claim.contains("SET \"Status; DROP TABLE x\" =")
        );
    }

    #[test]
    fn absent_columns_drop_out_without_leaving_parameters() {
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .without(Column::WorkerHostname)
            .unwrap()
            .without(Column::ClaimToken)
            .unwrap()
            .without(Column::ProcessAfter)
            .unwrap();
        let s = Statements::new(&options, &shape(), &[]);
        let claim = s.claim(&[], 8);
        assert!(!claim.params.contains(&Param::Worker));
        assert!(!claim.text.contains("process_after"));
        assert!(claim.text.contains(
            "(extract(epoch from \"jobs\".\"started_at\") * 1000000)::int8 AS \"__queue_token\""
        ));
        for statement in [&s.lock, &s.finish, &s.heartbeat] {
            let highest = (1..=statement.params.len())
                .rev()
                .find(|n| statement.text.contains(&format!("${n}")));
            assert_eq!(highest, Some(statement.params.len()), "{}", statement.text);
        }
    }

    #[test]
    fn conditions_are_numbered_after_the_claims_own_parameters() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let s = Statements::new(&options, &shape(), &[]);
        let cond = PgCondition::new("jobs.cost <= {} AND jobs.kind = {}")
            .bind(5i64)
            .bind("x");
        let claim = s.claim(std::slice::from_ref(&cond), 8);
        assert!(
            claim
                .text
                .contains("AND (jobs.cost <= $4 AND jobs.kind = $5) ORDER BY"),
            "{}",
            claim.text
        );
    }
}
