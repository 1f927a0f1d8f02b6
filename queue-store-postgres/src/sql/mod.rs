//! Every SQL statement of the store, built once from the options and the
//! catalog when the store is created. Identifiers are always quoted
//! ([`Ident`](crate::Ident)); every value is a `$n` bind, named by a
//! [`Param`] so that optional columns can drop out of a statement without
//! leaving an unbound parameter behind.

/// A condition true once per statement that turns `synchronous_commit` off
/// for the statement's own transaction: an initplan run once; `true` in
/// `set_config` keeps it to that transaction, so it holds at its commit
/// and is gone after.
pub(crate) const SYNCHRONOUS_COMMIT_OFF: &str =
    "(SELECT set_config('synchronous_commit', 'off', true)) = 'off'";

pub(crate) mod admin;
pub(crate) mod audit;
pub(crate) mod bookkeeping;
pub(crate) mod catalog;
mod claim;
pub(crate) mod default_table;
pub(crate) mod enqueue;
mod finish;
mod heartbeat;
mod job_transaction;
pub(crate) mod kinds;
pub(crate) mod limited;
pub(crate) mod operations;
#[cfg(test)]
mod plans;
pub(crate) mod prepared;
pub(crate) mod stats;
pub(crate) mod workers;

use std::collections::BTreeMap;
use std::sync::Arc;

use queue_core::JobState;

use crate::conditions::PgCondition;
use crate::options::{Column, PgStoreOptions};
use claim::ClaimStatements;
use prepared::Prepared;

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
    /// An operator's reason (a force-fail's).
    Reason,
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
    /// The paused kinds a claim passes over (text[]).
    PausedKinds,
    /// The one kind a limited kind's claim takes (text).
    OnlyKind,
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
    /// How many jobs a list page reads at most when no index serves its
    /// filter (int8).
    SearchLimit,
    /// The last key of a window of keys a list page reads
    /// ([`admin::ListRead::Windows`]), inclusive (int8).
    WindowEnd,
    FilterPayload,
    FilterUniqueKey,
    FilterWorker,
    StartedBefore,
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
    /// One job's kind (text), payload (jsonb) and priority (int8), for
    /// an enqueue of one; its due time is [`Param::ProcessAfter`].
    Kind,
    Payload,
    Priority,
}

/// A statement and the inputs its `$n` placeholders stand for, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Statement {
    /// Shared, so that each execution hands sqlx the text without a copy.
    pub text: Arc<str>,
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
            text: self.text.into(),
            params: self.params,
        }
    }
}

/// The claim's order: the configured one, or `priority` (highest first)
/// then the key `id`, as the default table's claim index holds jobs.
fn claim_order(options: &PgStoreOptions, priority: Option<String>, id: &str) -> String {
    options.order_by.clone().unwrap_or_else(|| match priority {
        Some(priority) => format!("{priority} DESC, {id}"),
        None => id.to_owned(),
    })
}

/// A job that has not finished, by its times `finished` and `after`: no
/// finish time, or a due time (a failed attempt waiting for its retry
/// keeps its end). The default table's in-place layout names the same in
/// its indexes' predicates.
pub(crate) fn unfinished(finished: &str, after: &str) -> String {
    format!("{finished} IS NULL OR {after} IS NOT NULL")
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

pub(crate) use admin::ListRead;
pub(crate) use claim::{AT_MOST_ONCE_COLUMN, CURSOR_PRIORITY_COLUMN, MAX_ATTEMPTS_COLUMN};

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
    /// When the failure column is `json` or `jsonb` (it then holds an
    /// object with the message, the attempt and the time; see
    /// [`failure_value`]): its type and where in it the message is.
    /// `None` for text.
    pub failure_json: Option<FailureJson>,
    /// Every column of the table, enum columns cast to text, if it has
    /// any (unqualified names after the alias).
    pub text_select: Option<String>,
    /// The archive purged jobs move to, quoted, and the table's columns
    /// (quoted), which it has too; `None` without one.
    pub archive: Option<(String, Vec<String>)>,
    /// Whether claims read the jobs ready now and the jobs whose time came
    /// apart (see [`claim::statements`]): the `process_after` column is
    /// nullable, an index starts with it, and an index's predicate leaves
    /// out the rows that have one (the ready jobs' index).
    pub due_apart: bool,
    /// Why the unique-key column does not keep keys unique, with the fix
    /// (the store's start-up refuses; an admin refuses unique enqueues).
    pub unique_unenforced: Option<String>,
    /// The default expression of the attempts-left column, which a job
    /// enqueued without a limit of its own starts with.
    pub attempts_left_default: Option<String>,
    /// The bookkeeping table and the columns it carries, if the store
    /// keeps one.
    pub side: Option<bookkeeping::Side>,
    /// Whether an index starts with the finish-time column: purges and
    /// retention then take the oldest finished jobs first, reading on from
    /// where the last batch stopped; else by key.
    pub finished_indexed: bool,
    /// Whether a list of some kinds reads finished jobs through the
    /// default table's index of them by kind (version 9), and waiting and
    /// running ones through the claim's indexes, apart; else one scan.
    pub kind_split: bool,
    /// Whether a trigram index (pg_trgm's `gin_trgm_ops` or
    /// `gist_trgm_ops`) serves a search of the failure text; else a list
    /// page with a failure text reads a bounded stretch of the list.
    pub failure_indexed: bool,
    /// Whether an index (of any kind: the default table's is a BRIN)
    /// starts with the queued-time column: a queued-time range a stretch
    /// of the list does not fill is then read through it.
    pub queued_indexed: bool,
    /// Whether Postgres partitions the table: its finished jobs may be in
    /// partitions of finish time that a purge drops whole
    /// ([`crate::partitions`]).
    pub partitioned: bool,
    /// The partitions of a partitioned table that hold every waiting and
    /// running job (the live partition of one partitioned by state): what
    /// the store analyzes for its claims. Empty for a plain table.
    pub live_partitions: Vec<crate::ident::QualifiedName>,
    /// Whether a plain table has inheritance children (the partitioning
    /// of Postgres before version 10): its reads and writes take in their
    /// rows too. Read at start-up with the rest of the shape. A table that
    /// gains its first child later is still read by place, by statements
    /// that name the table alone (`ONLY`), so the child's jobs wait for
    /// its stores to restart.
    pub inherited: bool,
    /// Which of the finish-time and due-time columns may be empty: a claim
    /// empties both, and a write that ends a waiting job its due time
    /// ([`JobState::times_agree`](queue_core::JobState::times_agree)). A
    /// `NOT NULL` one (rickover's `run_after`) keeps its value.
    pub nullable_times: Vec<Column>,
    /// Whether the table is the default table laid out for claims in
    /// place ([`JobTable::in_place_claims`](crate::JobTable::in_place_claims)):
    /// its indexes name the finish and due times where the plain table's
    /// name the state, and a reader of some states adds the times those
    /// states have ([`TableShape::times_of`]) so that the planner can
    /// read them.
    pub in_place_claims: bool,
    /// Whether a table whose claims are in place keeps the ledger of
    /// limited kinds' claims (version 16, [`limited`]), which their
    /// counts of running jobs read.
    pub limited_ledger: bool,
}

impl TableShape {
    /// ` AND ..` the finish and due times every job in one of `states`
    /// has, on a table whose claims are in place (the table's check
    /// constraint holds every row to them), in the form its indexes'
    /// predicates name; empty on any other table, or for states that
    /// share no such condition.
    fn times_of(&self, names: &Names, states: &[JobState]) -> String {
        let Some((finished, after)) = self.in_place_times(names) else {
            return String::new();
        };
        let within =
            |set: &[JobState]| !states.is_empty() && states.iter().all(|s| set.contains(s));
        if within(&[JobState::Processing]) {
            format!(" AND {finished} IS NULL AND {after} IS NULL")
        } else if within(&[JobState::Queued, JobState::Errored, JobState::Processing]) {
            format!(" AND ({})", unfinished(&finished, &after))
        } else if within(&[JobState::Completed, JobState::Failed, JobState::Canceled]) {
            format!(" AND {finished} IS NOT NULL AND {after} IS NULL")
        } else {
            String::new()
        }
    }

    /// `finished IS NULL OR after IS NOT NULL`, the times of a job that
    /// has not finished, on a table whose claims are in place: the arms a
    /// unique key's holder lookup adds to its scope, as the table's unique
    /// index names them.
    fn unfinished_times(&self, names: &Names) -> Option<String> {
        self.in_place_times(names)
            .map(|(finished, after)| unfinished(&finished, &after))
    }

    /// The finish and due time columns, on a table whose claims are in
    /// place.
    fn in_place_times(&self, names: &Names) -> Option<(String, String)> {
        let finished = names.at(Column::FinishedAt)?;
        let after = names.at(Column::ProcessAfter)?;
        self.in_place_claims.then_some((finished, after))
    }

    /// Whether writes empty `column` where the job's state says it has no
    /// such time (see [`TableShape::nullable_times`]).
    pub(crate) fn clears(&self, column: Column) -> bool {
        self.nullable_times.contains(&column)
    }

    /// Whether a row's place (`ctid`) names it in the whole table, so that
    /// a statement may find rows it read by their places: a plain table
    /// without inheritance children. A partitioned or inherited table
    /// repeats places across its partitions or children, and a statement
    /// by place there would take any row that sits at the same place in
    /// another of them.
    pub(crate) fn places_name_rows(&self) -> bool {
        !self.partitioned && !self.inherited
    }

    /// The default table at its newest version, as the catalog would find
    /// it: what [`enqueue::EnqueueStatements::default_table`] builds on.
    pub(crate) fn default_table() -> TableShape {
        TableShape {
            state_type: "text".into(),
            key_type: "bigint".into(),
            log_element: "json".into(),
            payload_type: Some("jsonb".into()),
            notify_trigger: true,
            failure_json: None,
            text_select: None,
            archive: None,
            due_apart: true,
            unique_unenforced: None,
            attempts_left_default: None,
            side: None,
            finished_indexed: true,
            kind_split: true,
            failure_indexed: false,
            queued_indexed: true,
            partitioned: false,
            live_partitions: Vec::new(),
            inherited: false,
            nullable_times: vec![Column::FinishedAt, Column::ProcessAfter],
            in_place_claims: false,
            limited_ledger: false,
        }
    }
}

/// A `json`/`jsonb` failure column: its type, and the path of keys to
/// the message in it ([`PgStoreOptions::failure_message_path`](crate::PgStoreOptions::failure_message_path)).
#[derive(Debug, Clone)]
pub(crate) struct FailureJson {
    pub type_name: String,
    pub path: Vec<String>,
}

/// What a write puts in the failure column for `message` (an SQL text
/// expression; NULL writes NULL): the text itself, or in a `json`/`jsonb`
/// column an object with the message at its path (by default
/// `{"message": .., "attempt": .., "at": ..}`), the attempt being the one
/// that failed (`attempt`, an SQL integer expression, or null when the
/// table counts none) and the time the database's.
pub(crate) fn failure_value(shape: &TableShape, message: &str, attempt: Option<&str>) -> String {
    match &shape.failure_json {
        None => message.to_owned(),
        Some(json) => {
            // Innermost first: {"error": {"message": m}} for error.message.
            let mut value = format!("to_jsonb({message})");
            for key in json.path.iter().rev() {
                value = format!("jsonb_build_object({}, {value})", literal(key));
            }
            format!(
                "CASE WHEN {message} IS NULL THEN NULL ELSE CAST(jsonb_build_object(\
                 'attempt', {attempt}, 'at', now()) || {value} AS {ty}) END",
                attempt = attempt.unwrap_or("NULL"),
                ty = json.type_name,
            )
        }
    }
}

/// The failure message as text, from the failure column at `at`: in a
/// JSON column, the value at the message's path (a string as itself, any
/// other value as its JSON text).
pub(crate) fn failure_text(shape: &TableShape, at: &str) -> String {
    match &shape.failure_json {
        None => format!("CAST({at} AS text)"),
        Some(json) => {
            let keys: Vec<String> = json.path.iter().map(|k| literal(k)).collect();
            format!("({at} #>> ARRAY[{}]::text[])", keys.join(", "))
        }
    }
}

/// All statements of one store.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    claim: ClaimStatements,
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
    /// The claim cursor's probe (see [`crate::cursor`]); `None` without a
    /// cursor.
    pub cursor_probe: Option<claim::CursorProbe>,
    pub finish: Statement,
    /// The same for one attempt, without arrays (cheaper to plan and run).
    pub finish_one: Statement,
    /// The finish of attempts that succeeded (many, and one): it sets the
    /// completed state and the finish time, or with
    /// [`CompletedJobs`](crate::CompletedJobs)`::Delete` deletes their rows.
    pub finish_succeeded: (Statement, Statement),
    pub heartbeat: Statement,
    pub append_log: Option<Statement>,
    /// A limited kind's count of its running jobs through the ledger, on
    /// a table that keeps one.
    pub limited_ledger: Option<limited::LedgerStatements>,
}

/// Quoted column names, by standard column, for the present ones: in the
/// table, or in the bookkeeping table.
#[derive(Debug, Clone)]
struct Names {
    alias: String,
    cols: BTreeMap<Column, String>,
    /// The columns the bookkeeping table carries.
    side: Vec<Column>,
}

impl Names {
    /// The names of the columns `options` map, less the `absent` ones, and
    /// those `side` carries.
    fn new(options: &PgStoreOptions, absent: &[Column], side: Option<&bookkeeping::Side>) -> Names {
        let side = side.map(|s| s.columns.clone()).unwrap_or_default();
        Names {
            alias: options.alias.quoted(),
            cols: Column::ALL
                .iter()
                .filter(|c| !absent.contains(c) && !side.contains(c))
                .filter_map(|c| options.column_name(*c).map(|i| (*c, i.quoted())))
                .collect(),
            side,
        }
    }

    /// The column's quoted name in the table (`None` when the table lacks
    /// it, even if the bookkeeping table carries it): what a statement on
    /// the table may set.
    fn get(&self, c: Column) -> Option<&str> {
        self.cols.get(&c).map(String::as_str)
    }

    /// The column's quoted name in the bookkeeping table, if it carries it.
    fn side(&self, c: Column) -> Option<String> {
        self.side
            .contains(&c)
            .then(|| format!("\"{}\"", c.standard_name()))
    }

    /// `alias."column"`, or `"__queue_side"."column"` for a column the
    /// bookkeeping table carries (a statement reading it joins that table
    /// under [`bookkeeping::SIDE`]).
    fn at(&self, c: Column) -> Option<String> {
        match self.get(c) {
            Some(name) => Some(format!("{}.{}", self.alias, name)),
            None => self
                .side(c)
                .map(|name| format!("{}.{name}", bookkeeping::SIDE)),
        }
    }

    fn must(&self, c: Column) -> String {
        // Id and state can never be absent (checked by the options).
        self.at(c)
            .unwrap_or_else(|| format!("{}.\"{}\"", self.alias, c.standard_name()))
    }
}

/// The table the store's statements are written for: its options, what
/// the catalog told about it, and the quoted names they all use.
struct Target<'a> {
    options: &'a PgStoreOptions,
    shape: &'a TableShape,
    names: Names,
    /// The table, schema-qualified and quoted.
    table: String,
    /// The table's alias, quoted.
    a: String,
    /// `alias."key"`, and the key column's quoted name alone.
    id: String,
    id_name: String,
    /// `alias."state"`, and the state column's quoted name alone.
    state: String,
    state_name: String,
    /// A lease's claim token: the token column, or without one the claim
    /// time in microseconds.
    token: String,
}

impl<'a> Target<'a> {
    fn new(options: &'a PgStoreOptions, shape: &'a TableShape, absent: &[Column]) -> Target<'a> {
        let names = Names::new(options, absent, shape.side.as_ref());
        let token = match names.at(Column::ClaimToken) {
            Some(token) => token,
            None => format!(
                "(extract(epoch from {}) * 1000000)::int8",
                names.must(Column::StartedAt)
            ),
        };
        Target {
            options,
            shape,
            table: options.table.quoted(),
            a: names.alias.clone(),
            id: names.must(Column::Id),
            id_name: names.get(Column::Id).unwrap_or("\"id\"").to_owned(),
            state: names.must(Column::State),
            state_name: names.get(Column::State).unwrap_or("\"state\"").to_owned(),
            token,
            names,
        }
    }

    /// `table AS alias`, with the bookkeeping table joined as
    /// [`bookkeeping::SIDE`] when the store keeps one: what a statement
    /// reading bookkeeping columns selects from (a lock on it names the
    /// alias: `FOR UPDATE OF alias`).
    fn from(&self) -> String {
        bookkeeping::from_table(&self.table, &self.a, &self.id, self.shape.side.as_ref())
    }

    /// The state column's type.
    fn st(&self) -> &str {
        &self.shape.state_type
    }

    /// The key column's type.
    fn kt(&self) -> &str {
        &self.shape.key_type
    }

    /// The stored value of `state` as a literal of the state column's type.
    fn state_literal(&self, state: JobState) -> String {
        format!(
            "CAST({} AS {})",
            literal(self.options.states.get(state)),
            self.st()
        )
    }

    /// The guard of a per-job statement: the row is the lease's (its key
    /// and token) and still processing, all three bound.
    fn held(&self, b: &mut Builder) -> String {
        let (i, p, t) = (
            b.p(Param::Id),
            b.p(Param::State(JobState::Processing)),
            b.p(Param::Token),
        );
        format!(
            "{} = {i} AND {} = CAST({p} AS {}) AND {} = {t}",
            self.id,
            self.state,
            self.st(),
            self.token
        )
    }

    /// [`Target::held`] with the processing state spelled out, for the
    /// prepared statements of a job's transaction (their arguments are the
    /// key, the token and the time only).
    fn held_literally(&self, b: &mut Builder) -> String {
        let (i, t) = (b.p(Param::Id), b.p(Param::Token));
        format!(
            "{} = {i} AND {} = {} AND {} = {t}",
            self.id,
            self.state,
            self.state_literal(JobState::Processing),
            self.token
        )
    }

    /// The guard of the batched statements over `unnest(..) AS u(id,
    /// token, ..)`, their inputs [`unseen`]: joined on the key alone, so
    /// that the plan looks each outcome's row up by key. A second
    /// condition `{id} = ANY(ids)` made the cached plan read the batch's
    /// rows once and compare every outcome with every row: 14 ms for 500
    /// outcomes, where probing takes 2-4.
    fn held_batch(&self, processing: &str) -> String {
        format!(
            "{} = u.id AND {} = {} AND {} = u.token",
            self.id,
            self.state,
            unseen(processing, self.st()),
            self.token
        )
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
        let target = Target::new(options, shape, absent);
        let claim = claim::statements(&target);
        let transaction = job_transaction::statements(&target);
        let finish = finish::statements(&target);
        Statements {
            select_view: claim::select_view(&target),
            select_text: claim::select_text(&target),
            next_due: claim::next_due(&target),
            cursor_probe: claim::cursor_probe(&target),
            claim,
            lock: transaction.lock,
            prepare_held: prepared::prepare_missing(&[
                &transaction.held_lock,
                &transaction.held_complete,
            ]),
            held_lock: transaction.held_lock,
            held_complete: transaction.held_complete,
            finish: finish.finish,
            finish_one: finish.finish_one,
            finish_succeeded: finish.finish_succeeded,
            heartbeat: heartbeat::heartbeat(&target),
            append_log: heartbeat::append_log(&target),
            limited_ledger: shape
                .limited_ledger
                .then(|| limited::LedgerStatements::new(&options.table)),
        }
    }

    /// The claim statement for up to `limit` jobs with `conditions`
    /// spliced in; condition placeholders are numbered after the statement's
    /// own parameters.
    pub(crate) fn claim(
        &self,
        conditions: &[PgCondition],
        paused: &[String],
        limit: usize,
    ) -> Statement {
        self.claim.claim(conditions, paused, limit)
    }

    /// The claim of up to `limit` jobs of one kind alone
    /// ([`Param::OnlyKind`]); `None` without a kind column.
    pub(crate) fn claim_of_kind(
        &self,
        conditions: &[PgCondition],
        limit: usize,
    ) -> Option<Statement> {
        self.claim.claim_of_kind(conditions, limit)
    }

    /// Whether claims can pass over paused kinds: the table has a kind
    /// column.
    pub(crate) fn claims_read_kind(&self) -> bool {
        self.claim.reads_kind()
    }

    /// The claim of up to `limit` jobs after the cursor (no extra
    /// conditions), if the store keeps one.
    pub(crate) fn claim_after_cursor(&self, limit: usize) -> Option<Statement> {
        self.claim.claim_after_cursor(limit)
    }

    /// Whether claims return the priority of each job for the cursor (as
    /// their last column, [`CURSOR_PRIORITY_COLUMN`]).
    pub(crate) fn cursor_reads_priority(&self) -> bool {
        self.claim.cursor_reads_priority()
    }
}

/// A shape as the catalog reports the default table, for the statement
/// tests of each module.
#[cfg(test)]
fn test_shape() -> TableShape {
    TableShape {
        finished_indexed: false,
        kind_split: false,
        queued_indexed: false,
        ..TableShape::default_table()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn absent_columns_drop_out_without_leaving_parameters() {
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .without(Column::WorkerHostname)
            .unwrap()
            .without(Column::ClaimToken)
            .unwrap()
            .without(Column::ProcessAfter)
            .unwrap();
        let s = Statements::new(&options, &test_shape(), &[]);
        let claim = s.claim(&[], &[], 8);
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
}
