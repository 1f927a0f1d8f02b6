//! The statements of the admin contract ([`PgAdmin`](crate::PgAdmin)):
//! reading jobs in the standard columns whatever the table calls them,
//! counting them, and the guarded operator writes. The fixed ones are built
//! once; those over a [`JobFilter`] are built per call from the fields the
//! filter sets, each value a bind.

use queue_core::{distinct_retryable_states, JobFilter, JobState, StoreError};

use super::{failure_text, failure_value, literal, Builder, Names, Param, Statement, TableShape};
use crate::options::{Column, PgStoreOptions};

/// What an admin write does to the rows it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdminWrite {
    /// Failed, errored or canceled → queued and due from [`Param::Now`];
    /// with `true`, the
    /// failure and reset counts back to zero.
    Retry(bool),
    /// Queued or errored → canceled.
    CancelWaiting,
    /// Processing → the cancel flag set.
    RequestStop,
    /// Queued, errored or processing → failed now with [`Param::Reason`],
    /// the running attempt fenced out (its claim token changed).
    ForceFail,
    /// Any state → deleted.
    Delete,
    /// Any state → moved to the archive table; `None` (no statement)
    /// without one.
    Archive,
}

/// A `RETURNING` column that notifies [`Param::Channel`]: an initplan,
/// run once when the statement returns its first row (never when it
/// returns none), so the write and the wake-up share a round trip.
/// How a view column reads the job's column.
#[derive(Clone, Copy)]
enum ViewRead {
    /// Cast to the named SQL type.
    As(&'static str),
    /// A timestamp, as it is.
    Time,
    /// Any type, as jsonb.
    Json,
    /// A count, 0 where the bookkeeping table has no row.
    Count,
    /// The failure text, wherever the table keeps it.
    Failure,
    /// A boolean that is false where the table has no such column.
    Flag,
}

impl ViewRead {
    /// The SQL type of the typed NULL read where the column is absent.
    fn sql_type(self) -> &'static str {
        match self {
            ViewRead::As(ty) => ty,
            ViewRead::Time => "timestamptz",
            ViewRead::Json => "jsonb",
            ViewRead::Count => "int8",
            ViewRead::Failure => "text",
            ViewRead::Flag => "boolean",
        }
    }
}

pub(super) fn notified(b: &mut Builder) -> String {
    let channel = b.p(Param::Channel);
    format!(", (SELECT 1 FROM pg_notify({channel}, '')) AS \"__queue_notified\"")
}

/// `column = array[1]` when the bound `array` holds one value (`values`),
/// `column = ANY(array)` otherwise.
fn one_or_any(column: &str, array: &str, values: usize) -> String {
    if values == 1 {
        format!("{column} = ({array})[1]")
    } else {
        format!("{column} = ANY({array})")
    }
}

/// A purge's rows, picked before its delete: `"t"`, an array of their
/// places (or keys). Kept apart so that the statement can say how many it
/// found as well as how many it removed.
const PURGE_PICKED: &str = "\"__queue_picked\"";

/// How many rows a purge found ([`PURGE_PICKED`]'s array): its tally's
/// third column, after how many it removed and the latest finish time
/// among them (see [`AdminStatements::purge`]).
const PURGE_FOUND: &str = "(SELECT cardinality(\"t\") FROM \"__queue_picked\")";

/// Which rows an admin write picks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pick<'a> {
    /// The keys bound as [`Param::Ids`].
    Ids,
    /// Up to [`Param::Limit`] rows matching the filter, lowest key first;
    /// with `true`, only keys above [`Param::After`].
    Matching(&'a JobFilter, bool),
    /// Up to [`Param::Limit`] rows matching the filter, earliest finish
    /// time first (then lowest key): a purge's, on a table with an index
    /// that starts with the finish-time column.
    OldestFinished(&'a JobFilter),
}

/// The rows an admin write takes ([`AdminStatements::picked_rows`]).
struct Picked {
    /// A common table expression the statement starts with (without the
    /// `WITH`): a purge's [`PURGE_PICKED`].
    leading: Option<String>,
    /// The condition that finds the rows.
    rows: String,
}

/// How a list page reads the table ([`AdminStatements::list`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListRead {
    /// In list order (by key, or through the parts' own indexes) until the
    /// page is full: a page costs about a page where the filter's matches
    /// are common, or an index serves it.
    Walk,
    /// The next [`Param::SearchLimit`] jobs of the list, in order, each
    /// marked whether it holds the failure text: a bounded read whatever
    /// the text. A page that does not fill says how far it searched.
    Stretch,
    /// The jobs in one window of keys, from [`Param::After`] (exclusive,
    /// as a page's start) to [`Param::WindowEnd`] (inclusive), read the
    /// cheapest way the planner knows (for a queued-time range, the
    /// default table's block range index of queued times and keys), then
    /// ordered. A page reads windows growing away from where it starts
    /// until it is full: each costs about the blocks of the range in it,
    /// however far down the list the range is.
    Windows,
}

/// The admin contract's statements for one table.
#[derive(Debug, Clone)]
pub(crate) struct AdminStatements {
    /// The select list of a [`JobView`](queue_core::JobView): every
    /// standard column under its standard name, `NULL` where absent.
    view: String,
    table: String,
    alias: String,
    names: Names,
    state_type: String,
    key_type: String,
    payload_type: Option<String>,
    /// How the failure column stores messages.
    shape: TableShape,
    states: crate::options::StateValues,
    /// The value expired jobs end in, when not failed's: such jobs are
    /// failed ones to every admin write.
    expired_value: Option<String>,
    /// One job by key.
    pub get: Statement,
    /// Jobs per stored state and kind.
    pub counts: Statement,
    /// The oldest claimable job's since-time and the stalled count.
    pub waiting: Statement,
    /// The figures of a big table: estimates, and capped counts.
    pub stats: super::stats::StatsStatements,
    /// Finished jobs per interval and stored state; `None` without a
    /// finish column.
    pub timeline: Option<Statement>,
    /// The stored states of the keys bound, for the skips of a write.
    pub states_of: Statement,
    /// Up to [`Param::Limit`] waiting jobs expired at [`Param::Now`] →
    /// failed with [`Param::Message`]; `None` without an expiry column.
    pub expire: Option<Statement>,
    /// The enqueue of jobs with and without unique keys.
    pub enqueue: super::enqueue::EnqueueStatements,
    /// The resetter's statement: stalled rows that no transaction locks go
    /// back to queued, or fail. `None` without a heartbeat or start column.
    pub reset: Option<Statement>,
    /// Deletes up to [`Param::Limit`] bookkeeping rows whose job is gone
    /// (deleted by the table's own code, say) or completed; `None` without
    /// a bookkeeping table.
    pub sweep_bookkeeping: Option<Statement>,
}

impl AdminStatements {
    pub(crate) fn new(
        options: &PgStoreOptions,
        shape: &TableShape,
        absent: &[Column],
    ) -> AdminStatements {
        let names = Names::new(options, absent, shape.side.as_ref());
        let enqueue = super::enqueue::EnqueueStatements::new(options, shape, &names);
        let table = options.table.quoted();
        let a = names.alias.clone();
        let st = shape.state_type.clone();
        let id = names.must(Column::Id);
        let id_name = names.get(Column::Id).unwrap_or("\"id\"").to_owned();
        let state = names.must(Column::State);
        let state_name = names.get(Column::State).unwrap_or("\"state\"").to_owned();
        // A count the bookkeeping table keeps is 0 for a job without a
        // row there (not claimed yet, or completed).
        let count = |at: String| {
            if names.side(Column::NumFailures).is_some() || names.side(Column::NumResets).is_some()
            {
                format!("CAST(COALESCE({at}, 0) AS int8)")
            } else {
                format!("CAST({at} AS int8)")
            }
        };
        // Each view column: the job's column read as the view's type, or a
        // typed NULL where the table has no such column.
        let column = |c: Column, alias: &str, read: ViewRead| {
            let at = match (names.at(c), read) {
                (None, ViewRead::Flag) => "false".to_owned(),
                (None, read) => format!("NULL::{}", read.sql_type()),
                (Some(at), ViewRead::As(ty)) => format!("CAST({at} AS {ty})"),
                (Some(at), ViewRead::Time) => at,
                (Some(at), ViewRead::Json) => format!("to_jsonb({at})"),
                (Some(at), ViewRead::Count) => count(at),
                (Some(at), ViewRead::Failure) => failure_text(shape, &at),
                (Some(at), ViewRead::Flag) => at,
            };
            match read {
                ViewRead::Flag => format!("({at}) IS TRUE AS \"{alias}\""),
                _ => format!("{at} AS \"{alias}\""),
            }
        };
        let view = std::iter::once(format!("{id} AS \"id\""))
            .chain(
                [
                    (Column::Kind, "kind", ViewRead::As("text")),
                    (Column::Payload, "payload", ViewRead::Json),
                ]
                .into_iter()
                .map(|(c, alias, read)| column(c, alias, read)),
            )
            .chain(std::iter::once(format!(
                "CAST({state} AS text) AS \"state\""
            )))
            .chain(
                [
                    (Column::Priority, "priority", ViewRead::As("int8")),
                    (Column::FailureMessage, "failure_message", ViewRead::Failure),
                    (Column::QueuedAt, "queued_at", ViewRead::Time),
                    (Column::StartedAt, "started_at", ViewRead::Time),
                    (Column::FinishedAt, "finished_at", ViewRead::Time),
                    (Column::ProcessAfter, "process_after", ViewRead::Time),
                    (Column::NumResets, "num_resets", ViewRead::Count),
                    (Column::NumFailures, "num_failures", ViewRead::Count),
                    (Column::LastHeartbeatAt, "last_heartbeat_at", ViewRead::Time),
                    (Column::ExecutionLogs, "execution_logs", ViewRead::Json),
                    (
                        Column::WorkerHostname,
                        "worker_hostname",
                        ViewRead::As("text"),
                    ),
                    (Column::Cancel, "cancel", ViewRead::Flag),
                    (Column::UniqueKey, "unique_key", ViewRead::As("text")),
                    (Column::MaxAttempts, "max_attempts", ViewRead::As("int8")),
                    (Column::AttemptsLeft, "attempts_left", ViewRead::As("int8")),
                    (Column::ExpiresAt, "expires_at", ViewRead::Time),
                    (Column::AtMostOnce, "at_most_once", ViewRead::Flag),
                ]
                .into_iter()
                .map(|(c, alias, read)| column(c, alias, read)),
            )
            .collect::<Vec<_>>()
            .join(", ");

        let mut b = Builder::default();
        let key = b.p(Param::Id);
        // A bookkeeping table's columns are read joined as SIDE.
        let from = super::bookkeeping::from_table(&table, &a, &id, shape.side.as_ref());
        b.push(&format!("SELECT {view} FROM {from} WHERE {id} = {key}"));
        let get = b.build();

        let kind = column(Column::Kind, "kind", ViewRead::As("text"));
        let counts = Statement {
            text: format!(
                "SELECT CAST({state} AS text) AS \"state\", {kind}, count(*) AS \"count\" \
                 FROM {table} AS {a} GROUP BY 1, 2"
            )
            .into(),
            params: Vec::new(),
        };

        // The times of waiting and of running jobs, on a table whose
        // claims are in place (what its indexes' predicates name).
        let waiting_times = shape.times_of(&names, &[JobState::Queued, JobState::Errored]);
        let running_times = shape.times_of(&names, &[JobState::Processing]);
        let value = |s: JobState| format!("CAST({} AS {st})", literal(options.states.get(s)));
        let (queued, errored, processing) = (
            value(JobState::Queued),
            value(JobState::Errored),
            value(JobState::Processing),
        );
        let mut b = Builder::default();
        let oldest = match super::stats::claimable_since(&names) {
            None => "NULL::timestamptz".to_owned(),
            Some(since) => {
                let due = match names.at(Column::ProcessAfter) {
                    Some(after) => {
                        format!(" AND ({after} IS NULL OR {after} <= {})", b.p(Param::Now))
                    }
                    None => String::new(),
                };
                format!(
                    "(SELECT min({since}) FROM {table} AS {a} WHERE {state} IN ({queued}, {errored}){waiting_times}{due})"
                )
            }
        };
        let stalled = super::stats::stalled_count(
            &mut b,
            &names,
            &from,
            &format!("{state} = {processing}{running_times}"),
        );
        b.push(&format!(
            "SELECT {oldest} AS \"oldest\", {stalled} AS \"stalled\""
        ));
        let waiting = b.build();
        let stats = super::stats::StatsStatements::new(options, &names, &from, &st, shape);

        let timeline = names.at(Column::FinishedAt).map(|finished| {
            let mut b = Builder::default();
            let (from, before, seconds) = (
                b.p(Param::FinishedFrom),
                b.p(Param::FinishedBefore),
                b.p(Param::BucketSeconds),
            );
            let ended = [JobState::Completed, JobState::Failed, JobState::Canceled]
                .into_iter()
                .flat_map(|s| options.stored_values(s))
                .map(|v| format!("CAST({} AS {st})", literal(v)))
                .collect::<Vec<_>>()
                .join(", ");
            // Per kind too, where the table keeps one: each kind's
            // throughput, from the same rows.
            let kind = names
                .at(Column::Kind)
                .map(|k| format!("CAST({k} AS text)"))
                .unwrap_or_else(|| "CAST(NULL AS text)".to_owned());
            b.push(&format!(
                "SELECT CAST(floor(extract(epoch FROM ({finished} - {from})) / {seconds}) AS int8) AS \"bucket\", \
                 CAST({state} AS text) AS \"state\", {kind} AS \"kind\", count(*) AS \"count\" FROM {table} AS {a} \
                 WHERE {finished} >= {from} AND {finished} < {before} AND {state} IN ({ended}) GROUP BY 1, 2, 3"
            ));
            b.build()
        });

        // Reset: stalled rows that no transaction locks go back to queued,
        // or fail past the reset limit or under at-most-once delivery.
        let stalled_since = names
            .at(Column::LastHeartbeatAt)
            .or_else(|| names.at(Column::StartedAt));
        let reset = stalled_since.map(|since| {
            let mut b = Builder::default();
            let (processing, before, queued, failed, amo) = (
                b.p(Param::State(JobState::Processing)),
                b.p(Param::StalledBefore),
                b.p(Param::State(JobState::Queued)),
                b.p(Param::State(JobState::Failed)),
                b.p(Param::AtMostOnce),
            );
            // Under at-most-once delivery, or for a job that is itself
            // at-most-once, a stalled attempt fails.
            let amo = match names.at(Column::AtMostOnce) {
                Some(job_amo) => format!("({amo} OR ({job_amo}) IS TRUE)"),
                None => amo,
            };
            let fail = match names.at(Column::NumResets) {
                Some(resets) => format!("({amo} OR {resets} >= {})", b.p(Param::MaxResets)),
                None => format!("({amo})"),
            };
            let mut sets = vec![format!(
                "{state_name} = CASE WHEN {fail} THEN CAST({failed} AS {st}) ELSE CAST({queued} AS {st}) END"
            )];
            if let (Some(n), Some(at)) = (names.get(Column::NumResets), names.at(Column::NumResets)) {
                sets.push(format!("{n} = CASE WHEN {fail} THEN {at} ELSE {at} + 1 END"));
            }
            if let (Some(n), Some(at)) = (names.get(Column::FailureMessage), names.at(Column::FailureMessage)) {
                let (amo_msg, max_msg) = (b.p(Param::AtMostOnceMessage), b.p(Param::MaxResetsMessage));
                let attempt = names.at(Column::NumFailures).map(|f| format!("{f} + 1"));
                let message = failure_value(
                    shape,
                    &format!("(CASE WHEN {amo} THEN {amo_msg} ELSE {max_msg} END)"),
                    attempt.as_deref(),
                );
                sets.push(format!("{n} = CASE WHEN {fail} THEN {message} ELSE {at} END"));
            }
            if let (Some(n), Some(at)) = (names.get(Column::FinishedAt), names.at(Column::FinishedAt)) {
                let now = b.p(Param::Now);
                sets.push(format!("{n} = CASE WHEN {fail} THEN {now} ELSE {at} END"));
            }
            // A job that ends has no due time (`JobState::times_agree`);
            // one claimed by an earlier release may still carry one.
            if let (Some(n), Some(at), true) = (
                names.get(Column::ProcessAfter),
                names.at(Column::ProcessAfter),
                shape.clears(Column::ProcessAfter),
            ) {
                sets.push(format!("{n} = CASE WHEN {fail} THEN NULL ELSE {at} END"));
            }
            let stalled = format!(
                "{state} = CAST({processing} AS {st}){running_times} AND ({since} IS NULL OR {since} < {before}) ORDER BY {id}"
            );
            match &shape.side {
                None => {
                    b.push(&format!(
                        "WITH stalled AS (SELECT {id} FROM {table} AS {a} WHERE {stalled} FOR UPDATE SKIP LOCKED) \
                         UPDATE {table} AS {a} SET {sets} WHERE {id} = ANY(ARRAY(SELECT {id_name} FROM stalled)) \
                         RETURNING {id} AS id, {state} = CAST({failed} AS {st}) AS failed",
                        sets = sets.join(", ")
                    ));
                }
                Some(side) => {
                    // The stalled jobs, then their bookkeeping rows, each
                    // locked without waiting: a job whose row an ending
                    // attempt holds is left to it. The job's counts are
                    // read from its locked row (SIDE); the row's token
                    // changes, so that a late finish of the reset attempt
                    // is fenced out.
                    let (side_table, key) = (&side.table, super::bookkeeping::KEY);
                    let step = super::bookkeeping::TOKEN_STEP;
                    let resets = names
                        .side(Column::NumResets)
                        .map(|n| format!(", {n} = s.{n} + CASE WHEN r.failed THEN 0 ELSE 1 END"))
                        .unwrap_or_default();
                    b.push(&format!(
                        "WITH stalled AS (SELECT {id} AS k FROM {table} AS {a}{join} WHERE {stalled} \
                         FOR UPDATE OF {a} SKIP LOCKED), \
                         \"__queue_locked\" AS (SELECT s.* FROM {side_table} AS s \
                         WHERE s.{key} = ANY(ARRAY(SELECT k FROM stalled)) FOR NO KEY UPDATE SKIP LOCKED), \
                         \"__queue_taken\" AS (SELECT k FROM stalled WHERE k IN (SELECT {key} FROM \"__queue_locked\") \
                         OR NOT EXISTS (SELECT 1 FROM {side_table} AS s WHERE s.{key} = stalled.k)), \
                         \"__queue_reset\" AS (UPDATE {table} AS {a} SET {sets} FROM \"__queue_taken\" AS t \
                         LEFT JOIN \"__queue_locked\" AS {side_alias} ON {side_alias}.{key} = t.k WHERE {id} = t.k \
                         RETURNING {id} AS id, {state} = CAST({failed} AS {st}) AS failed), \
                         \"__queue_booked\" AS (UPDATE {side_table} AS s SET \"claim_token\" = s.\"claim_token\" + {step}{resets} \
                         FROM \"__queue_reset\" AS r WHERE s.{key} = r.id) \
                         SELECT id, failed FROM \"__queue_reset\"",
                        join = side.left_join(&id),
                        side_alias = super::bookkeeping::SIDE,
                        sets = sets.join(", ")
                    ));
                }
            }
            b.build()
        });

        let expire = names.at(Column::ExpiresAt).map(|expires| {
            let mut b = Builder::default();
            // Failed's value, or the table's own for expired jobs.
            let ended = literal(options.expired_value());
            let (now, limit) = (b.p(Param::Now), b.p(Param::Limit));
            let mut sets = vec![format!("{state_name} = CAST({ended} AS {st})")];
            if let Some(n) = names.get(Column::FailureMessage) {
                let message = b.p(Param::Message);
                sets.push(format!("{n} = {}", failure_value(shape, &message, None)));
            }
            if let Some(n) = names.get(Column::FinishedAt) {
                sets.push(format!("{n} = {now}"));
            }
            if let Some(n) = names.get(Column::ProcessAfter).filter(|_| shape.clears(Column::ProcessAfter)) {
                sets.push(format!("{n} = NULL"));
            }
            b.push(&format!(
                "WITH expired AS (SELECT {id} FROM {table} AS {a} WHERE {state} IN ({queued}, {errored}){waiting_times} \
                 AND {expires} <= {now} ORDER BY {id} LIMIT {limit} FOR UPDATE SKIP LOCKED) \
                 UPDATE {table} AS {a} SET {sets} WHERE {id} = ANY(ARRAY(SELECT {id_name} FROM expired)) \
                 AND {state} IN ({queued}, {errored}) RETURNING {id}",
                sets = sets.join(", ")
            ));
            b.build()
        });

        let sweep_bookkeeping = shape.side.as_ref().map(|side| {
            let mut b = Builder::default();
            let (completed, limit) = (b.p(Param::State(JobState::Completed)), b.p(Param::Limit));
            let key = super::bookkeeping::KEY;
            b.push(&format!(
                "DELETE FROM {side_table} AS s WHERE s.{key} = ANY(ARRAY(SELECT o.{key} FROM {side_table} AS o \
                 WHERE NOT EXISTS (SELECT 1 FROM {table} AS {a} WHERE {id} = o.{key} \
                 AND ({state} <> CAST({completed} AS {st}) OR cardinality(o.\"execution_logs\") > 0)) \
                 LIMIT {limit} FOR UPDATE SKIP LOCKED))",
                side_table = side.table,
            ));
            b.build()
        });

        let mut statements = AdminStatements {
            view,
            table,
            alias: a,
            names,
            state_type: st,
            key_type: shape.key_type.clone(),
            payload_type: shape.payload_type.clone(),
            shape: shape.clone(),
            states: options.states.clone(),
            expired_value: options.expired_value.clone(),
            get,
            counts,
            waiting,
            timeline,
            stats,
            states_of: Statement::default(),
            expire,
            reset,
            sweep_bookkeeping,
            enqueue,
        };
        statements.states_of = statements.states_of_statement();
        statements
    }

    /// `CAST('value' AS state type)` of a state.
    fn state_value(&self, state: JobState) -> String {
        format!(
            "CAST({} AS {})",
            literal(self.states.get(state)),
            self.state_type
        )
    }

    /// `state IN (..)` of the given states (failed's with the expired
    /// jobs' own value), and the times they have on a table whose claims
    /// are in place ([`TableShape::times_of`]).
    fn state_in(&self, states: &[JobState]) -> String {
        let names = &self.names;
        let mut values: Vec<String> = states.iter().map(|s| self.state_value(*s)).collect();
        if let (true, Some(expired)) = (states.contains(&JobState::Failed), &self.expired_value) {
            values.push(format!("CAST({} AS {})", literal(expired), self.state_type));
        }
        format!(
            "{} IN ({}){}",
            names.must(Column::State),
            values.join(", "),
            self.shape.times_of(names, states)
        )
    }

    /// The condition of `filter` (`true` when it sets nothing); an error
    /// names a field the table has no column for.
    fn filter(&self, b: &mut Builder, filter: &JobFilter) -> Result<String, StoreError> {
        let names = &self.names;
        let column = |c: Column, field: &str| self.filter_column(c, field);
        let mut parts = vec!["true".to_owned()];
        // A filter of one value is an equality: an index that starts with
        // the column then returns the rows in key order (on Postgres 15
        // `= ANY(..)` cannot), so a page of failed jobs of one kind reads
        // only them, however many jobs of that kind completed.
        if let Some(states) = &filter.states {
            let st = &self.state_type;
            // As many as `PgStoreOptions::stored_values` binds: failed's
            // with the expired jobs' own value, if the table has one.
            let values = states.len()
                + usize::from(states.contains(&JobState::Failed) && self.expired_value.is_some());
            let array = format!(
                "CAST(CAST({} AS text[]) AS {st}[])",
                b.p(Param::FilterStates)
            );
            let times = self.shape.times_of(names, states);
            parts.push(format!(
                "{}{times}",
                one_or_any(&names.must(Column::State), &array, values)
            ));
        }
        if let Some(kinds) = &filter.kinds {
            let kind = column(Column::Kind, "kind")?;
            let array = format!("CAST({} AS text[])", b.p(Param::FilterKinds));
            parts.push(one_or_any(
                &format!("CAST({kind} AS text)"),
                &array,
                kinds.len(),
            ));
        }
        let times = [
            (
                filter.queued_from,
                Column::QueuedAt,
                ">=",
                Param::QueuedFrom,
                "enqueue time",
            ),
            (
                filter.queued_before,
                Column::QueuedAt,
                "<",
                Param::QueuedBefore,
                "enqueue time",
            ),
            (
                filter.finished_from,
                Column::FinishedAt,
                ">=",
                Param::FinishedFrom,
                "finish time",
            ),
            (
                filter.finished_before,
                Column::FinishedAt,
                "<",
                Param::FinishedBefore,
                "finish time",
            ),
            (
                filter.started_before,
                Column::StartedAt,
                "<",
                Param::StartedBefore,
                "start time",
            ),
        ];
        for (value, c, op, param, field) in times {
            if value.is_some() {
                let at = column(c, field)?;
                parts.push(format!("{at} {op} {}", b.p(param)));
            }
        }
        if filter.payload_contains.is_some() {
            let payload = column(Column::Payload, "payload")?;
            let payload = match self.payload_type.as_deref() {
                Some("jsonb") => payload,
                _ => format!("CAST({payload} AS jsonb)"),
            };
            parts.push(format!(
                "{payload} @> CAST({} AS jsonb)",
                b.p(Param::FilterPayload)
            ));
        }
        for (set, c, param, field) in [
            (
                filter.unique_key.is_some(),
                Column::UniqueKey,
                Param::FilterUniqueKey,
                "unique key",
            ),
            (
                filter.worker.is_some(),
                Column::WorkerHostname,
                Param::FilterWorker,
                "worker",
            ),
        ] {
            if set {
                let at = column(c, field)?;
                parts.push(format!("CAST({at} AS text) = {}", b.p(param)));
            }
        }
        if filter.failure_contains.is_some() {
            parts.push(self.failure_matches(b)?);
        }
        Ok(parts.join(" AND "))
    }

    /// The queued-time column lists are ordered by, then the key: where
    /// the table has one and its key is not an integer. An integer key
    /// comes from a sequence, so its order is the order jobs were queued
    /// in, read from the primary key; a uuid or text key says nothing of
    /// when a job came.
    pub(crate) fn list_by_queued_time(&self) -> Option<String> {
        self.names
            .at(Column::QueuedAt)
            .filter(|_| !self.integer_key())
    }

    /// Whether the key is an integer (from a sequence, so in queued order).
    fn integer_key(&self) -> bool {
        matches!(self.key_type.as_str(), "bigint" | "integer" | "smallint")
    }

    /// A page of jobs matching `filter`, newest first (or oldest, without
    /// `newest_first`): by queued time then key
    /// ([`AdminStatements::list_by_queued_time`]), else by key; after the
    /// job [`Param::After`] if `after`, at most [`Param::Limit`]. With the
    /// queued time, the page after a job starts where that job stands (its
    /// time read by key; the statement returns nothing if it is gone, which
    /// [`AdminStatements::anchor_exists`] tells apart). Jobs without a
    /// queued time come first when newest first, last when oldest first,
    /// as Postgres orders NULLs.
    ///
    /// `read` says how ([`ListRead`]). With [`ListRead::Stretch`], each row
    /// also has `"__queue_match"` (whether it matches what the stretch
    /// searches for) and `"__queue_n"` (its place in the stretch), and the
    /// stretch's last job comes too, matching or not, to say where the
    /// search stopped.
    pub(crate) fn list(
        &self,
        filter: &JobFilter,
        newest_first: bool,
        after: bool,
        read: ListRead,
    ) -> Result<Statement, StoreError> {
        let mut b = Builder::default();
        let condition = if read == ListRead::Stretch {
            let mut rest = filter.clone();
            rest.failure_contains = None;
            self.filter(&mut b, &rest)?
        } else {
            self.filter(&mut b, filter)?
        };
        let matched = if read == ListRead::Stretch {
            Some(self.failure_matches(&mut b)?)
        } else {
            None
        };
        let id = self.names.must(Column::Id);
        let (op, order) = if newest_first {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        let queued = self.list_by_queued_time();
        let (anchor, after, order_by, outer_order) = match &queued {
            None => {
                let mut after = if after {
                    format!(" AND {id} {op} {}", b.p(Param::After))
                } else {
                    String::new()
                };
                if read == ListRead::Windows {
                    let end = if newest_first { ">=" } else { "<=" };
                    after.push_str(&format!(" AND {id} {end} {}", b.p(Param::WindowEnd)));
                }
                (
                    String::new(),
                    after,
                    format!("{id} {order}"),
                    format!("\"id\" {order}"),
                )
            }
            Some(q) => {
                let (anchor, after) = if after {
                    let (qa, ia) = ("\"__queue_anchor\".\"q\"", "\"__queue_anchor\".\"id\"");
                    let key = b.p(Param::After);
                    let anchor = format!(
                        ", (SELECT {q} AS \"q\", {id} AS \"id\" FROM {table} AS {alias} WHERE {id} = {key}) \
                         AS \"__queue_anchor\"",
                        table = self.table,
                        alias = self.alias,
                    );
                    // Where the jobs after the anchor are, NULL times
                    // included (first when descending, last ascending).
                    let after = if newest_first {
                        format!(
                            " AND (({qa} IS NULL AND ({q} IS NOT NULL OR {id} < {ia})) \
                             OR {q} < {qa} OR ({q} = {qa} AND {id} < {ia}))"
                        )
                    } else {
                        format!(
                            " AND (({qa} IS NULL AND {q} IS NULL AND {id} > {ia}) \
                             OR ({qa} IS NOT NULL AND ({q} > {qa} OR ({q} = {qa} AND {id} > {ia}) OR {q} IS NULL)))"
                        )
                    };
                    (anchor, after)
                } else {
                    (String::new(), String::new())
                };
                (
                    anchor,
                    after,
                    format!("{q} {order}, {id} {order}"),
                    format!("\"q\" {order}, \"id\" {order}"),
                )
            }
        };
        // The parts read apart (a kind on the default table, ordered by
        // key), each its page through its own index, then the page of all.
        let parts = if queued.is_none() {
            self.kind_parts(filter)
        } else {
            Vec::new()
        };
        let select = |columns: &str, limit: &str| {
            let page = |part: &str| {
                let rows_of = |columns: &str| {
                    format!(
                        "SELECT {columns} FROM {from}{anchor} WHERE {condition}{after}{part}",
                        from = self.from(),
                    )
                };
                let rows = rows_of(columns);
                if read == ListRead::Windows {
                    // OFFSET 0 keeps the order and the limit out of the
                    // window's read: the planner reads its every match
                    // the cheapest way (an index of queued times), not by
                    // walking the key until the page fills.
                    format!(
                        "SELECT * FROM ({rows} OFFSET 0) AS \"__queue_range\" ORDER BY {outer_order} LIMIT {limit}"
                    )
                } else if !part.is_empty() && read == ListRead::Walk {
                    // A kind's part (listed by key, so with no anchor):
                    // its keys first, then their rows. Keys alone come
                    // from an index of the part's states, kind and key
                    // without reading a row, in key order; for whole rows
                    // the planner may walk the key's index instead,
                    // reading every job newer than the matches (a second
                    // on ten million rows for failed jobs of a kind none
                    // of which failed).
                    let keys = format!("{} ORDER BY {order_by} LIMIT {limit}", rows_of(&id));
                    format!(
                        "SELECT {columns} FROM {from} WHERE {id} IN ({keys}) ORDER BY {order_by} LIMIT {limit}",
                        from = self.from(),
                    )
                } else {
                    format!("{rows} ORDER BY {order_by} LIMIT {limit}")
                }
            };
            if parts.is_empty() {
                page("")
            } else {
                let pages: Vec<String> = parts
                    .iter()
                    .map(|part| format!("({})", page(&format!(" AND {part}"))))
                    .collect();
                format!(
                    "SELECT * FROM ({}) AS \"__queue_page\" ORDER BY {outer_order} LIMIT {limit}",
                    pages.join(" UNION ALL ")
                )
            }
        };
        let limit = b.p(Param::Limit);
        match matched {
            None => {
                b.push(&select(&self.view, &limit));
            }
            Some(matched) => {
                // The stretch: its keys, whether each matches and its
                // place; then the matches and the stretch's last job, read
                // by key (a page's worth at most).
                let search = b.p(Param::SearchLimit);
                let q = if queued.is_some() {
                    format!(", {} AS \"q\"", queued.as_deref().unwrap_or_default())
                } else {
                    String::new()
                };
                let stretch = select(
                    &format!("{id} AS \"id\"{q}, COALESCE({matched}, false) AS \"m\""),
                    &search,
                );
                b.push(&format!(
                    "SELECT {view}, \"__queue_found\".\"m\" AS \"__queue_match\", \
                     \"__queue_found\".\"n\" AS \"__queue_n\" \
                     FROM {from} JOIN (\
                       SELECT \"id\", \"m\", \"n\" FROM (\
                         SELECT \"id\", \"m\", row_number() OVER (ORDER BY {outer_order}) AS \"n\" \
                         FROM ({stretch}) AS \"__queue_stretch\"\
                       ) AS \"__queue_numbered\" \
                       WHERE \"m\" OR \"n\" = {search} ORDER BY \"n\" LIMIT {limit}\
                     ) AS \"__queue_found\" ON {id} = \"__queue_found\".\"id\" \
                     ORDER BY \"__queue_found\".\"n\"",
                    view = self.view,
                    from = self.from(),
                ));
            }
        }
        Ok(b.build())
    }

    /// How a page of `filter` is read ([`ListRead`]): a failure text no
    /// trigram index serves is searched in a stretch of the list; a
    /// queued-time range on a table listed by an integer key whose queued
    /// times are indexed is read in windows of keys; otherwise the list is
    /// walked.
    pub(crate) fn list_read(&self, filter: &JobFilter) -> ListRead {
        if filter.failure_contains.is_some() && !self.shape.failure_indexed {
            ListRead::Stretch
        } else if (filter.queued_from.is_some() || filter.queued_before.is_some())
            && self.integer_key()
            && self.shape.queued_indexed
        {
            ListRead::Windows
        } else {
            ListRead::Walk
        }
    }

    /// Whether a job matching `filter` has a key in the window from
    /// [`Param::After`] (exclusive) to [`Param::WindowEnd`] (inclusive),
    /// downwards when `newest_first`: a wide window a page read in windows
    /// looks into before it reads it ([`ListRead::Windows`]).
    pub(crate) fn window_probe(
        &self,
        filter: &JobFilter,
        newest_first: bool,
    ) -> Result<Statement, StoreError> {
        let mut b = Builder::default();
        let condition = self.filter(&mut b, filter)?;
        let id = self.names.must(Column::Id);
        let (op, end) = if newest_first {
            ("<", ">=")
        } else {
            (">", "<=")
        };
        let after = b.p(Param::After);
        let window_end = b.p(Param::WindowEnd);
        // One look through the block range index, a kind's parts not read
        // apart: a common kind's index would be read whole for a bitmap.
        b.push(&format!(
            "SELECT EXISTS (SELECT 1 FROM {from} WHERE {condition} AND {id} {op} {after} AND {id} {end} {window_end})",
            from = self.from(),
        ));
        Ok(b.build())
    }

    /// The lowest and the highest key (int8; NULLs on an empty table):
    /// where a page read in windows ([`ListRead::Windows`]) ends.
    pub(crate) fn key_bounds(&self) -> Statement {
        let mut b = Builder::default();
        b.push(&format!(
            "SELECT CAST(min({id}) AS int8), CAST(max({id}) AS int8) FROM {table} AS {alias}",
            id = self.names.must(Column::Id),
            table = self.table,
            alias = self.alias,
        ));
        b.build()
    }

    /// The column a filter on `field` reads; refused, naming both, where
    /// the table has none.
    fn filter_column(&self, c: Column, field: &str) -> Result<String, StoreError> {
        self.names.at(c).ok_or_else(|| {
            StoreError::Refused(format!(
                "cannot filter by {field}: table {} has no {c} column",
                self.table
            ))
        })
    }

    /// Whether the failure text holds [`Param::FailureText`], ignoring
    /// case; its `%`, `_` and `\` match themselves. The form a trigram
    /// index serves (`ILIKE`).
    fn failure_matches(&self, b: &mut Builder) -> Result<String, StoreError> {
        let message = self.filter_column(Column::FailureMessage, "failure message")?;
        let message = failure_text(&self.shape, &message);
        Ok(format!(
            "{message} ILIKE '%' || replace(replace(replace({}, E'\\\\', E'\\\\\\\\'), '%', E'\\\\%'), '_', E'\\\\_') || '%'",
            b.p(Param::FailureText)
        ))
    }

    /// The parts a list of some kinds reads apart on the default table
    /// ([`TableShape::kind_split`]), each through an index: finished jobs
    /// (version 9's index by kind), jobs ready now (the claim index), jobs
    /// waiting for a time (the due index) and running ones. Only the parts
    /// holding a state the filter asks for. Empty when the list is one
    /// scan: no kind filter, or another table.
    fn kind_parts(&self, filter: &JobFilter) -> Vec<String> {
        if !self.shape.kind_split || filter.kinds.is_none() {
            return Vec::new();
        }
        let asked = |states: &[JobState]| {
            filter
                .states
                .as_ref()
                .is_none_or(|asked| asked.iter().any(|s| states.contains(s)))
        };
        let after = self.names.must(Column::ProcessAfter);
        let waiting = [JobState::Queued, JobState::Errored];
        let finished = [JobState::Completed, JobState::Failed, JobState::Canceled];
        let mut parts = Vec::new();
        if asked(&finished) {
            parts.push(self.state_in(&finished));
        }
        if asked(&waiting) {
            let waiting = self.state_in(&waiting);
            parts.push(format!("{waiting} AND {after} IS NULL"));
            parts.push(format!("{waiting} AND {after} IS NOT NULL"));
        }
        if asked(&[JobState::Processing]) {
            parts.push(self.state_in(&[JobState::Processing]));
        }
        parts
    }

    /// Whether the job [`Param::After`] exists: a page after a job that
    /// is gone cannot say where it starts.
    pub(crate) fn anchor_exists(&self) -> Statement {
        let mut b = Builder::default();
        let key = b.p(Param::After);
        b.push(&format!(
            "SELECT EXISTS (SELECT 1 FROM {table} AS {alias} WHERE {id} = {key})",
            table = self.table,
            alias = self.alias,
            id = self.names.must(Column::Id),
        ));
        b.build()
    }

    /// How many jobs match `filter`.
    pub(crate) fn count(&self, filter: &JobFilter) -> Result<Statement, StoreError> {
        let mut b = Builder::default();
        let condition = self.filter(&mut b, filter)?;
        b.push(&format!(
            "SELECT count(*) FROM {from} WHERE {condition}",
            from = self.from(),
        ));
        Ok(b.build())
    }

    /// The SQL type of the key column.
    pub(crate) fn key_type(&self) -> &str {
        &self.key_type
    }

    /// The highest of the keys bound as [`Param::Ids`], in the key
    /// column's own order (a text key's collation, not Rust's).
    pub(crate) fn highest_key(&self) -> Statement {
        let mut b = Builder::default();
        let ids = b.p(Param::Ids);
        b.push(&format!(
            "SELECT \"k\" FROM unnest(CAST({ids} AS {kt}[])) AS \"k\" ORDER BY \"k\" DESC LIMIT 1",
            kt = self.key_type
        ));
        b.build()
    }

    /// The states `write` moves a row out of (none: any state). A retry
    /// leaves alone a retryable state stored as a state that is not
    /// (errored sharing queued's value).
    pub(crate) fn states_moved_by(&self, write: AdminWrite) -> Vec<JobState> {
        match write {
            AdminWrite::Retry(_) => distinct_retryable_states(|s| self.states.get(s).to_owned()),
            AdminWrite::CancelWaiting => vec![JobState::Queued, JobState::Errored],
            AdminWrite::RequestStop => vec![JobState::Processing],
            AdminWrite::ForceFail => {
                vec![JobState::Queued, JobState::Errored, JobState::Processing]
            }
            AdminWrite::Delete | AdminWrite::Archive => Vec::new(),
        }
    }

    /// The statement of `write` over the rows `pick` chooses; it returns the
    /// keys it changed. Rows another transaction holds are skipped, never
    /// waited for: a claim or a job's transaction never waits on an
    /// operator, nor an operator on them. `None`: the table lacks what the
    /// write needs (a cancel flag to request a stop).
    pub(crate) fn write(
        &self,
        write: AdminWrite,
        pick: Pick<'_>,
    ) -> Result<Option<Statement>, StoreError> {
        self.write_returning(write, pick, None)
    }

    /// [`AdminStatements::write`]; a delete or an archive also returns
    /// `finished` (an expression of the row) as its second column.
    fn write_returning(
        &self,
        write: AdminWrite,
        pick: Pick<'_>,
        finished: Option<&str>,
    ) -> Result<Option<Statement>, StoreError> {
        let mut b = Builder::default();
        let from = self.states_moved_by(write);
        // A purge (`finished`) picks its rows in a statement of their own.
        let purge = finished.is_some();
        let Some(Picked { leading, rows }) = self.picked_rows(&mut b, write, &from, pick, purge)?
        else {
            return Ok(None);
        };
        let leading = leading.as_deref();
        // The guard again in the outer statement: the inner select's
        // snapshot may be older than the row it locked.
        let guard = if from.is_empty() {
            String::new()
        } else {
            format!(" AND {}", self.state_in(&from))
        };
        let text = match write {
            AdminWrite::Delete => self.delete_text(leading, &rows, finished),
            AdminWrite::Archive => match self.archive_text(leading, &rows, finished) {
                Some(text) => text,
                None => return Ok(None),
            },
            AdminWrite::Retry(reset) => self.retry_text(&mut b, reset, &rows, &guard),
            AdminWrite::CancelWaiting => self.cancel_waiting_text(&mut b, &rows, &guard),
            AdminWrite::RequestStop => self.request_stop_text(&rows, &guard),
            AdminWrite::ForceFail => self.force_fail_text(&mut b, &rows, &guard),
        };
        b.push(&text);
        Ok(Some(b.build()))
    }

    /// A purge: up to [`Param::Limit`] jobs matching `filter` deleted, or
    /// moved to the archive with `archive`. Oldest finished first where an
    /// index starts with the finish-time column (`finished_indexed`), else
    /// by key. It returns one row: how many jobs it removed (`bigint`) and
    /// the latest finish time among them (null without a finish column of
    /// the table's own), counted in Postgres rather than sent row by row.
    pub(crate) fn purge(
        &self,
        filter: &JobFilter,
        archive: bool,
    ) -> Result<Option<Statement>, StoreError> {
        let write = if archive {
            AdminWrite::Archive
        } else {
            AdminWrite::Delete
        };
        let pick = if self.shape.finished_indexed {
            Pick::OldestFinished(filter)
        } else {
            Pick::Matching(filter, false)
        };
        let finished = self
            .names
            .get(Column::FinishedAt)
            .unwrap_or("NULL::timestamptz");
        self.write_returning(write, pick, Some(finished))
    }

    /// `id = ANY(..)` of the rows `write` takes, as `pick` chooses them,
    /// locked, skipping rows another transaction holds; `None` when the
    /// table lacks what the write needs.
    ///
    /// With `purge`, the rows are picked in [`PURGE_PICKED`], which leads
    /// the statement ([`Self::purged_rows`]).
    fn picked_rows(
        &self,
        b: &mut Builder,
        write: AdminWrite,
        from: &[JobState],
        pick: Pick<'_>,
        purge: bool,
    ) -> Result<Option<Picked>, StoreError> {
        let names = &self.names;
        let a = &self.alias;
        let id = names.must(Column::Id);
        let mut conditions = Vec::new();
        if matches!(write, AdminWrite::Retry(_)) && from.is_empty() {
            return Ok(None);
        }
        if !from.is_empty() {
            conditions.push(self.state_in(from));
        }
        if let AdminWrite::Retry(_) = write {
            if let Some(held) = self.key_held_by_another() {
                // A job whose unique key another job holds stays where it
                // is: queued again, it would be a second job with the key.
                conditions.push(format!("NOT {held}"));
            }
        }
        if write == AdminWrite::RequestStop {
            let Some(cancel) = names.at(Column::Cancel) else {
                return Ok(None);
            };
            if matches!(pick, Pick::Matching(..) | Pick::OldestFinished(_)) {
                // Each running job once: calls until a short one end.
                conditions.push(format!("{cancel} IS NOT TRUE"));
            }
        }
        let picked = match pick {
            Pick::Ids => format!(
                "{id} = ANY(CAST({} AS {kt}[]))",
                b.p(Param::Ids),
                kt = self.key_type
            ),
            Pick::Matching(filter, after) => {
                if after {
                    conditions.push(format!("{id} > {}", b.p(Param::After)));
                }
                self.filter(b, filter)?
            }
            Pick::OldestFinished(filter) => self.filter(b, filter)?,
        };
        conditions.push(picked);
        let limit = match (pick, names.at(Column::FinishedAt)) {
            (Pick::Ids, _) => String::new(),
            (Pick::OldestFinished(_), Some(finished)) => {
                format!(" ORDER BY {finished}, {id} LIMIT {}", b.p(Param::Limit))
            }
            (Pick::Matching(..) | Pick::OldestFinished(_), _) => {
                format!(" ORDER BY {id} LIMIT {}", b.p(Param::Limit))
            }
        };
        if purge {
            return Ok(Some(self.purged_rows(&conditions, &limit)));
        }
        let lock = if matches!(write, AdminWrite::Delete | AdminWrite::Archive) {
            "FOR UPDATE"
        } else {
            "FOR NO KEY UPDATE"
        };
        let source = match (&self.shape.side, write) {
            // A stop request writes the running attempt's bookkeeping row
            // alone: it locks that row, not the job's. A finish takes the
            // bookkeeping row first and the job's second, so taking the
            // job's first here could deadlock with it.
            (Some(side), AdminWrite::RequestStop) => format!(
                "FROM {table} AS {a} JOIN {} AS {SIDE} ON {SIDE}.{KEY} = {id} WHERE {} {limit} \
                 {lock} OF {SIDE} SKIP LOCKED",
                side.table,
                conditions.join(" AND "),
                table = self.table,
                SIDE = super::bookkeeping::SIDE,
                KEY = super::bookkeeping::KEY,
            ),
            (_, AdminWrite::Delete | AdminWrite::Archive) => format!(
                "FROM {from} WHERE {} {limit} {lock} OF {a} SKIP LOCKED",
                conditions.join(" AND "),
                from = self.removed_from_joined(),
            ),
            _ => format!(
                "FROM {from} WHERE {} {limit} {lock} OF {a} SKIP LOCKED",
                conditions.join(" AND "),
                from = self.from(),
            ),
        };
        let rows = match (write, names.at(Column::UniqueKey)) {
            // At most one job per unique key among the picked: two queued
            // again at once would both hold it (the unique index refuses
            // the statement). The lowest key of each wins; the others are
            // then held by it, and skipped.
            (AdminWrite::Retry(_), Some(key)) => {
                let group =
                    "p.\"k\" IS NULL, COALESCE(CAST(p.\"k\" AS text), CAST(p.\"i\" AS text))";
                format!(
                    "{id} = ANY(ARRAY(SELECT DISTINCT ON ({group}) p.\"i\" FROM \
                     (SELECT {id} AS \"i\", {key} AS \"k\" {source}) AS p ORDER BY {group}, p.\"i\"))"
                )
            }
            // A delete by key or filter (a purge picks its own rows, in
            // `purged_rows`) on a plain table finds the rows it locked again
            // by their place, not by a second descent of the key's index for
            // each (a purge's batch took a third longer that way). A row
            // updated between the statement's snapshot and its lock is
            // locked at its new place, which that snapshot cannot see:
            // it is left, never another row taken. A partitioned or
            // inherited table repeats places across its partitions or
            // children, so it goes by key.
            (AdminWrite::Delete | AdminWrite::Archive, _) if self.shape.places_name_rows() => {
                format!("{a}.ctid = ANY(ARRAY(SELECT {a}.ctid {source}))")
            }
            _ => format!("{id} = ANY(ARRAY(SELECT {id} {source}))"),
        };
        Ok(Some(Picked {
            leading: None,
            rows,
        }))
    }

    /// A purge's rows: [`PURGE_PICKED`] `AS (..)`, to lead the statement,
    /// and the condition that finds them again.
    ///
    /// On a plain table the pick takes no row locks: a purge takes only
    /// finished jobs, which nothing else holds for long, and a lock for
    /// each row before its delete doubled a batch's cost (17 ms against
    /// 8.5 ms for 5,000 rows), all of it taken from the workers beside it.
    /// The delete finds the rows again by their place. A row another
    /// transaction changed since the pick (a retry, a purge beside this
    /// one) is at a new place or gone once that transaction ends: Postgres
    /// checks the place again on the row's newest version, and leaves it.
    /// So a batch may remove fewer than it found, and only one that found
    /// fewer than its limit has reached the end. A partitioned or
    /// inherited table repeats places across its partitions or children:
    /// it goes by key, and a key does not change with the row, so there
    /// the pick locks its rows and skips those another transaction holds.
    fn purged_rows(&self, conditions: &[String], limit: &str) -> Picked {
        let a = &self.alias;
        let (found_by, of_type, lock) = if !self.shape.places_name_rows() {
            (
                self.names.must(Column::Id),
                self.key_type.clone(),
                format!(" FOR UPDATE OF {a} SKIP LOCKED"),
            )
        } else {
            (format!("{a}.ctid"), "tid".to_owned(), String::new())
        };
        Picked {
            leading: Some(format!(
                "{PURGE_PICKED} AS MATERIALIZED (SELECT ARRAY(SELECT {found_by} FROM {from} \
                 WHERE {}{limit}{lock}) AS \"t\")",
                conditions.join(" AND "),
                from = self.removed_from_joined(),
            )),
            // Cast: `ANY((SELECT ..))` would read as `ANY` of a subquery.
            rows: format!(
                "{found_by} = ANY(CAST((SELECT \"t\" FROM {PURGE_PICKED}) AS {of_type}[]))"
            ),
        }
    }

    /// Why the jobs a write left alone were left: each one's state, whether
    /// another transaction holds its row (the writes skip locked rows), and
    /// whether another job holds its unique key.
    fn states_of_statement(&self) -> Statement {
        let names = &self.names;
        let (table, a) = (&self.table, &self.alias);
        let (id, state) = (names.must(Column::Id), names.must(Column::State));
        let mut b = Builder::default();
        let ids = b.p(Param::Ids);
        let key_held = self
            .key_held_by_another()
            .unwrap_or_else(|| "false".to_owned());
        b.push(&format!(
            "WITH free AS (SELECT {id} AS \"id\" FROM {table} AS {a} WHERE {id} = ANY(CAST({ids} AS {kt}[])) \
             FOR NO KEY UPDATE SKIP LOCKED) \
             SELECT {id} AS \"id\", CAST({state} AS text) AS \"state\", \
             {id} IN (SELECT \"id\" FROM free) AS \"free\", {key_held} AS \"key_held\" \
             FROM {table} AS {a} WHERE {id} = ANY(CAST({ids} AS {kt}[]))",
            kt = self.key_type
        ));
        b.build()
    }

    /// `(..)`: whether another job holds the row's unique key (waits, runs,
    /// or keeps it forever); `None` without a unique key column.
    fn key_held_by_another(&self) -> Option<String> {
        let names = &self.names;
        let (key, key_name) = (names.at(Column::UniqueKey)?, names.get(Column::UniqueKey)?);
        let (table, id) = (&self.table, names.must(Column::Id));
        let id_name = names.get(Column::Id).unwrap_or("\"id\"");
        let state_name = names.get(Column::State).unwrap_or("\"state\"");
        let active = [JobState::Queued, JobState::Processing, JobState::Errored]
            .map(|s| self.state_value(s))
            .join(", ");
        let holds = match names.get(Column::UniqueForever) {
            Some(forever) => format!("(h.{forever} OR h.{state_name} IN ({active}))"),
            None => format!("h.{state_name} IN ({active})"),
        };
        Some(format!(
            "({key} IS NOT NULL AND EXISTS (SELECT 1 FROM {table} AS h WHERE h.{key_name} = {key} \
             AND h.{id_name} <> {id} AND {holds}))"
        ))
    }

    /// The name of `column`, if the table has it.
    fn name(&self, column: Column) -> Option<String> {
        self.names.get(column).map(str::to_owned)
    }

    /// `table AS alias`, with the bookkeeping table joined as
    /// [`SIDE`](super::bookkeeping::SIDE) when the store keeps one.
    fn from(&self) -> String {
        super::bookkeeping::from_table(
            &self.table,
            &self.alias,
            &self.names.must(Column::Id),
            self.shape.side.as_ref(),
        )
    }

    /// The table a delete or an archive removes rows from, and picks them
    /// in: on a table whose places name its rows (deletes go by place
    /// there), `ONLY` the table, so that an inheritance child it gains
    /// after start-up (whose places repeat the table's) is left alone
    /// until a restart has the store go by key; else the table with its
    /// partitions or children.
    fn removed_from(&self) -> String {
        if self.shape.places_name_rows() {
            format!("ONLY {}", self.table)
        } else {
            self.table.clone()
        }
    }

    /// [`Self::from`] over [`Self::removed_from`].
    fn removed_from_joined(&self) -> String {
        super::bookkeeping::from_table(
            &self.removed_from(),
            &self.alias,
            &self.names.must(Column::Id),
            self.shape.side.as_ref(),
        )
    }

    /// `write` (a statement returning the keys it changed first), and with
    /// a bookkeeping table, the statement `side` makes (given the table's
    /// quoted name and the changed keys as a subquery) on their bookkeeping
    /// rows, in the same statement.
    fn with_side(&self, write: String, side: impl FnOnce(&str, &str) -> Option<String>) -> String {
        self.with_side_then(None, write, side, None)
    }

    /// [`Self::with_side`], read by `select` (a `SELECT` from
    /// `"__queue_written"`, the write's rows) instead of row by row.
    fn with_side_then(
        &self,
        leading: Option<&str>,
        write: String,
        side: impl FnOnce(&str, &str) -> Option<String>,
        select: Option<&str>,
    ) -> String {
        let id_name = self.names.get(Column::Id).unwrap_or("\"id\"");
        let changed = format!("(SELECT {id_name} FROM \"__queue_written\")");
        let booked = self
            .shape
            .side
            .as_ref()
            .and_then(|s| side(&s.table, &changed))
            .map(|bookkeeping| format!(", \"__queue_booked\" AS ({bookkeeping})"));
        match (booked, select) {
            (None, None) => write,
            (booked, select) => format!(
                "WITH {}\"__queue_written\" AS ({write}){} {}",
                leading.map(|l| format!("{l}, ")).unwrap_or_default(),
                booked.unwrap_or_default(),
                select.unwrap_or("SELECT * FROM \"__queue_written\"")
            ),
        }
    }

    /// Deletes `rows`, returning each key; for a purge (`finished`, the
    /// finish-time column, and `leading`, its pick), one row instead: how
    /// many it deleted, the latest finish time among them and how many it
    /// found, all a purge's next batch needs.
    fn delete_text(&self, leading: Option<&str>, rows: &str, finished: Option<&str>) -> String {
        let a = &self.alias;
        let id = self.names.must(Column::Id);
        let key = super::bookkeeping::KEY;
        let (returning, tally) = match finished {
            Some(finished) => (
                format!("{id}, {finished} AS \"__queue_finished\""),
                Some(format!(
                    "SELECT count(*), max(\"__queue_finished\"), {PURGE_FOUND} FROM \"__queue_written\""
                )),
            ),
            None => (id, None),
        };
        // A key used again later must not find the deleted job's counts.
        self.with_side_then(
            leading,
            format!(
                "DELETE FROM {table} AS {a} WHERE {rows} RETURNING {returning}",
                table = self.removed_from()
            ),
            |side, changed| {
                Some(format!(
                    "DELETE FROM {side} AS s WHERE s.{key} IN {changed}"
                ))
            },
            tally.as_deref(),
        )
    }

    /// The rows leave the table and enter the archive in one statement: a
    /// failed insert deletes nothing. `None` without an archive. Returns
    /// each key; for a purge (`finished`), how many moved and their latest
    /// finish time, as [`Self::delete_text`] does.
    fn archive_text(
        &self,
        leading: Option<&str>,
        rows: &str,
        finished: Option<&str>,
    ) -> Option<String> {
        let (removed, a) = (self.removed_from(), &self.alias);
        let (archive, columns) = self.shape.archive.as_ref()?;
        let columns = columns.join(", ");
        let key = self.names.get(Column::Id).unwrap_or("\"id\"");
        let side = match &self.shape.side {
            Some(side) => format!(
                "\"__queue_booked\" AS (DELETE FROM {} AS s WHERE s.{} IN (SELECT {key} FROM moved)), ",
                side.table,
                super::bookkeeping::KEY
            ),
            None => String::new(),
        };
        Some(format!(
            "WITH {leading}moved AS (DELETE FROM {removed} AS {a} WHERE {rows} RETURNING {a}.*), {side}\
             \"__queue_archived\" AS (INSERT INTO {archive} ({columns}) SELECT {columns} FROM moved RETURNING {key}) \
             {select} FROM \"__queue_archived\"",
            select = match finished {
                Some(finished) => format!(
                    "SELECT count(*), (SELECT max({finished}) FROM moved) AS \"__queue_finished\", \
                     {PURGE_FOUND}"
                ),
                None => format!("SELECT {key}"),
            },
            leading = leading.map(|l| format!("{l}, ")).unwrap_or_default(),
        ))
    }

    fn retry_text(&self, b: &mut Builder, reset: bool, rows: &str, guard: &str) -> String {
        let (table, a) = (&self.table, &self.alias);
        let id = self.names.must(Column::Id);
        let mut sets = vec![format!(
            "{} = {}",
            self.names.get(Column::State).unwrap_or("\"state\""),
            self.state_value(JobState::Queued)
        )];
        if let Some(n) = self.name(Column::ProcessAfter) {
            sets.push(format!("{n} = {}", b.p(Param::Now)));
        }
        // An expiry that has passed would fail the job again at the next
        // sweep: a retry clears it. One still ahead stays.
        if let Some(n) = self.name(Column::ExpiresAt) {
            let now = b.p(Param::Now);
            sets.push(format!(
                "{n} = CASE WHEN {n} <= {now} THEN NULL ELSE {n} END"
            ));
        }
        for (c, value) in [(Column::FinishedAt, "NULL"), (Column::Cancel, "false")] {
            if let Some(n) = self.name(c) {
                sets.push(format!("{n} = {value}"));
            }
        }
        if reset {
            for c in [Column::NumFailures, Column::NumResets] {
                if let Some(n) = self.name(c) {
                    sets.push(format!("{n} = 0"));
                }
            }
        }
        // A countdown that ran out would fail the retried job at its
        // first error: it gets one more attempt (the table keeps no total
        // to restore).
        if let Some(n) = self.name(Column::AttemptsLeft) {
            sets.push(format!("{n} = GREATEST({n}, 1)"));
        }
        // Retried jobs are claimable: wake the workers, in the same round
        // trip.
        let retried = format!(
            "UPDATE {table} AS {a} SET {} WHERE {rows}{guard} RETURNING {id}{}",
            sets.join(", "),
            notified(b)
        );
        // What the bookkeeping table carries of the same resets.
        let mut side_sets: Vec<String> = self
            .names
            .side(Column::Cancel)
            .map(|n| format!("{n} = false"))
            .into_iter()
            .collect();
        if reset {
            for c in [Column::NumFailures, Column::NumResets] {
                if let Some(n) = self.names.side(c) {
                    side_sets.push(format!("{n} = 0"));
                }
            }
        }
        let key = super::bookkeeping::KEY;
        self.with_side(retried, |side, changed| {
            (!side_sets.is_empty()).then(|| {
                format!(
                    "UPDATE {side} AS s SET {} WHERE s.{key} IN {changed}",
                    side_sets.join(", ")
                )
            })
        })
    }

    /// Fails the rows now (the database's clock) with the operator's
    /// reason, and changes the claim token, so that the attempt running
    /// one of them holds nothing: its finish, heartbeat and log writes
    /// are guarded by the token it claimed with. Without a token column,
    /// the claim time is the token: it moves by a microsecond.
    fn force_fail_text(&self, b: &mut Builder, rows: &str, guard: &str) -> String {
        let (table, a) = (&self.table, &self.alias);
        let id = self.names.must(Column::Id);
        let step = super::bookkeeping::TOKEN_STEP;
        let mut sets = vec![format!(
            "{} = {}",
            self.names.get(Column::State).unwrap_or("\"state\""),
            self.state_value(JobState::Failed)
        )];
        if let Some(n) = self.name(Column::FailureMessage) {
            let reason = b.p(Param::Reason);
            let attempt = self
                .names
                .at(Column::NumFailures)
                .map(|f| format!("{f} + 1"));
            sets.push(format!(
                "{n} = {}",
                failure_value(&self.shape, &reason, attempt.as_deref())
            ));
        }
        if let Some(n) = self.name(Column::FinishedAt) {
            sets.push(format!("{n} = now()"));
        }
        sets.extend(self.clear_due_time());
        if let Some(n) = self.name(Column::ClaimToken) {
            sets.push(format!("{n} = {n} + {step}"));
        } else if let (None, Some(n)) = (
            self.names.side(Column::ClaimToken),
            self.name(Column::StartedAt),
        ) {
            sets.push(format!("{n} = {n} + interval '1 microsecond'"));
        }
        let failed = format!(
            "UPDATE {table} AS {a} SET {} WHERE {rows}{guard} RETURNING {id}",
            sets.join(", ")
        );
        let key = super::bookkeeping::KEY;
        self.with_side(failed, |side, changed| {
            Some(format!(
                "UPDATE {side} AS s SET \"claim_token\" = s.\"claim_token\" + {step} WHERE s.{key} IN {changed}"
            ))
        })
    }

    /// `process_after = NULL`, where the table lets it be empty: a job a
    /// write ends has no due time (`JobState::times_agree`).
    fn clear_due_time(&self) -> Option<String> {
        self.name(Column::ProcessAfter)
            .filter(|_| self.shape.clears(Column::ProcessAfter))
            .map(|n| format!("{n} = NULL"))
    }

    fn cancel_waiting_text(&self, b: &mut Builder, rows: &str, guard: &str) -> String {
        let (table, a) = (&self.table, &self.alias);
        let id = self.names.must(Column::Id);
        let mut sets = vec![format!(
            "{} = {}",
            self.names.get(Column::State).unwrap_or("\"state\""),
            self.state_value(JobState::Canceled)
        )];
        if let Some(n) = self.name(Column::FailureMessage) {
            let message = b.p(Param::Message);
            sets.push(format!(
                "{n} = {}",
                failure_value(&self.shape, &message, None)
            ));
        }
        if let Some(n) = self.name(Column::FinishedAt) {
            sets.push(format!("{n} = {}", b.p(Param::Now)));
        }
        sets.extend(self.clear_due_time());
        format!(
            "UPDATE {table} AS {a} SET {} WHERE {rows}{guard} RETURNING {id}",
            sets.join(", ")
        )
    }

    fn request_stop_text(&self, rows: &str, guard: &str) -> String {
        let (table, a) = (&self.table, &self.alias);
        let id = self.names.must(Column::Id);
        if let (Some(side), Some(cancel)) = (&self.shape.side, self.names.side(Column::Cancel)) {
            // The flag of the running attempt, in its bookkeeping row.
            let key = super::bookkeeping::KEY;
            return format!(
                "UPDATE {} AS s SET {cancel} = true FROM {table} AS {a} \
                 WHERE s.{key} = {id} AND {rows}{guard} RETURNING s.{key}",
                side.table
            );
        }
        let cancel = self
            .name(Column::Cancel)
            .unwrap_or_else(|| "\"cancel\"".into());
        format!("UPDATE {table} AS {a} SET {cancel} = true WHERE {rows}{guard} RETURNING {id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(notify_trigger: bool) -> TableShape {
        TableShape {
            finished_indexed: false,
            kind_split: false,
            failure_indexed: false,
            queued_indexed: false,
            partitioned: false,
            live_partitions: Vec::new(),
            inherited: false,
            state_type: "text".into(),
            key_type: "bigint".into(),
            log_element: "json".into(),
            payload_type: Some("jsonb".into()),
            notify_trigger,
            failure_json: None,
            text_select: None,
            archive: None,
            due_apart: false,
            unique_unenforced: None,
            attempts_left_default: None,
            side: None,
            nullable_times: vec![Column::FinishedAt, Column::ProcessAfter],
            in_place_claims: false,
            limited_ledger: false,
        }
    }

    #[test]
    fn a_filter_of_one_state_or_kind_is_an_equality_and_of_more_any() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let admin = AdminStatements::new(&options, &shape(true), &[]);
        let one = JobFilter::default().states([JobState::Failed]).kinds(["k"]);
        let text = admin.count(&one).unwrap().text;
        assert!(
            text.contains("\"jobs\".\"state\" = (CAST(CAST($1 AS text[]) AS text[]))[1]"),
            "{text}"
        );
        assert!(
            text.contains("CAST(\"jobs\".\"kind\" AS text) = (CAST($2 AS text[]))[1]"),
            "{text}"
        );
        let two = JobFilter::default()
            .states([JobState::Failed, JobState::Canceled])
            .kinds(["k", "l"]);
        let text = admin.count(&two).unwrap().text;
        assert!(
            text.contains("\"jobs\".\"state\" = ANY(CAST(CAST($1 AS text[]) AS text[]))"),
            "{text}"
        );
        assert!(
            text.contains("CAST(\"jobs\".\"kind\" AS text) = ANY(CAST($2 AS text[]))"),
            "{text}"
        );
        // Failed is bound with the expired jobs' own value too: two values.
        let expired = options.clone().expired_state_value("expired");
        let admin = AdminStatements::new(&expired, &shape(true), &[]);
        let failed = JobFilter::default().states([JobState::Failed]);
        let text = admin.count(&failed).unwrap().text;
        assert!(text.contains("= ANY("), "{text}");
    }

    #[test]
    fn the_enqueue_notifies_unless_the_default_trigger_does() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let with_trigger = AdminStatements::new(&options, &shape(true), &[]);
        assert!(
            !with_trigger.enqueue.plain.text.contains("pg_notify"),
            "{}",
            with_trigger.enqueue.plain.text
        );
        let without = AdminStatements::new(&options, &shape(false), &[]);
        assert!(
            without
                .enqueue
                .plain
                .text
                .contains("(SELECT 1 FROM pg_notify($8, ''))"),
            "{}",
            without.enqueue.plain.text
        );
        let elsewhere = AdminStatements::new(&options.clone().channel("other"), &shape(true), &[]);
        assert!(
            elsewhere.enqueue.plain.text.contains("pg_notify"),
            "the trigger notifies the default channel, not the store's"
        );
    }
}
