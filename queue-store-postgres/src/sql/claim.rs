//! The claim: one statement that locks up to N eligible rows, skipping
//! locked ones, and marks them processing; the claim after the cursor; and
//! the reads that go with a claim (a view's records, enum columns as text,
//! the next due time).

use queue_core::JobState;

use super::{Builder, Param, Statement, Target};
use crate::conditions::PgCondition;
use crate::options::{ClaimCommit, Column};

/// The name of the claim's last column when the cursor needs each job's
/// priority.
pub(crate) const CURSOR_PRIORITY_COLUMN: &str = "__queue_priority";
/// The claim's column of a job's own attempt limit (with
/// [`Column::MaxAttempts`]).
pub(crate) const MAX_ATTEMPTS_COLUMN: &str = "__queue_max_attempts";
/// The claim's column of whether a job is at-most-once (with
/// [`Column::AtMostOnce`]).
pub(crate) const AT_MOST_ONCE_COLUMN: &str = "__queue_at_most_once";

/// A piece of the claim's text: fixed SQL, or a place filled per claim.
#[derive(Debug, Clone)]
enum Piece {
    Sql(String),
    /// The extra conditions of a PreDequeue hook, ` AND (..)` each.
    Conditions,
    /// The condition that starts the scan of ready jobs after the cursor.
    Cursor,
    /// The claim's size, a literal.
    Limit,
}

/// A claim statement in pieces, since the extra conditions, the cursor and
/// the limit change from claim to claim, and its inputs.
#[derive(Debug, Clone)]
struct Template {
    pieces: Vec<Piece>,
    params: Vec<Param>,
}

impl Template {
    fn render(&self, conditions: &str, cursor: &str, limit: usize) -> String {
        let mut text = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Sql(sql) => text.push_str(sql),
                Piece::Conditions => text.push_str(conditions),
                Piece::Cursor => text.push_str(cursor),
                Piece::Limit => text.push_str(&limit.to_string()),
            }
        }
        text
    }
}

/// The claim from the start of the claim order, and the claim at the
/// cursor.
#[derive(Debug, Clone)]
pub(super) struct ClaimStatements {
    from_start: Template,
    /// With the claim cursor: the claim at the cursor, the condition that
    /// starts its scan after the cursor (numbered after the statement's own
    /// inputs), and its inputs with the cursor's.
    at_cursor: Option<(Template, String, Vec<Param>)>,
    /// The kind column, which a claim passing over paused kinds reads.
    kind: Option<String>,
}

impl ClaimStatements {
    /// The claim statement for up to `limit` jobs with `conditions`
    /// spliced in; condition placeholders are numbered after the statement's
    /// own parameters (once: where the claim reads two sets of jobs, both
    /// carry the same text and the same placeholders).
    ///
    /// With `paused` kinds (and a kind column), the claim passes over their
    /// jobs: one more condition, bound to [`Param::PausedKinds`] before the
    /// extra conditions' values. A job without a kind is never passed over.
    /// With none paused, the statement is the same as without pauses.
    pub(super) fn claim(
        &self,
        conditions: &[PgCondition],
        paused: &[String],
        limit: usize,
    ) -> Statement {
        self.spliced(conditions, paused, false, limit)
    }

    /// The claim of up to `limit` jobs of one kind alone, bound to
    /// [`Param::OnlyKind`], with `conditions`: a limited kind's claim.
    /// `None` without a kind column.
    pub(super) fn claim_of_kind(
        &self,
        conditions: &[PgCondition],
        limit: usize,
    ) -> Option<Statement> {
        self.kind.as_ref()?;
        Some(self.spliced(conditions, &[], true, limit))
    }

    fn spliced(
        &self,
        conditions: &[PgCondition],
        paused: &[String],
        only_kind: bool,
        limit: usize,
    ) -> Statement {
        let mut next = self.from_start.params.len() + 1;
        let mut spliced = String::new();
        let mut params = self.from_start.params.clone();
        if let (true, Some(kind)) = (only_kind, &self.kind) {
            spliced.push_str(&format!(" AND ({kind}::text = ${next}::text)"));
            params.push(Param::OnlyKind);
            next += 1;
        }
        if let (false, Some(kind)) = (paused.is_empty(), &self.kind) {
            // An expression the planner has no statistics for, so that it
            // reads it as passing most jobs. On the column itself, a cached
            // plan takes the bound array for ten kinds, one of them each
            // job's (with few kinds in the table), reads it as passing
            // almost none, and sorts the whole table instead of reading the
            // claim index in claim order.
            spliced.push_str(&format!(
                " AND (({kind}::text || '') <> ALL(${next}::text[]) OR {kind} IS NULL)"
            ));
            params.push(Param::PausedKinds);
            next += 1;
        }
        for condition in conditions {
            spliced.push_str(" AND (");
            spliced.push_str(&condition.numbered(&mut next));
            spliced.push(')');
        }
        Statement {
            text: self.from_start.render(&spliced, "", limit).into(),
            params,
        }
    }

    /// Whether claims can pass over paused kinds.
    pub(super) fn reads_kind(&self) -> bool {
        self.kind.is_some()
    }

    /// The claim of up to `limit` jobs after the cursor (no extra
    /// conditions), if the store keeps one.
    pub(super) fn claim_after_cursor(&self, limit: usize) -> Option<Statement> {
        let (template, condition, params) = self.at_cursor.as_ref()?;
        Some(Statement {
            text: template.render("", condition, limit).into(),
            params: params.clone(),
        })
    }

    /// Whether claims return the priority of each job for the cursor (as
    /// their last column, [`CURSOR_PRIORITY_COLUMN`]).
    pub(super) fn cursor_reads_priority(&self) -> bool {
        self.at_cursor
            .as_ref()
            .is_some_and(|(_, _, params)| params.contains(&Param::CursorPriority))
    }
}

/// `state IN (queued, errored)`: the states a job waits in, spelled out;
/// on a table whose claims are in place, with the times a waiting job has
/// ([`TableShape::times_of`](super::TableShape::times_of)), which its
/// indexes' predicates name.
fn waiting(t: &Target) -> String {
    format!(
        "{} IN ({}, {}){}",
        t.state,
        t.state_literal(JobState::Queued),
        t.state_literal(JobState::Errored),
        t.shape
            .times_of(&t.names, &[JobState::Queued, JobState::Errored])
    )
}

/// The claim's order on `t`.
fn claim_order(t: &Target) -> String {
    super::claim_order(t.options, t.names.at(Column::Priority), &t.id)
}

/// Ends the fixed text so far and adds `piece` after it.
fn cut(b: &mut Builder, pieces: &mut Vec<Piece>, piece: Piece) {
    let text = std::mem::take(&mut b.text);
    if !text.is_empty() {
        pieces.push(Piece::Sql(text));
    }
    pieces.push(piece);
}

/// The column the two sets of a split claim carry for their merge in the
/// default order (with a priority column).
const MERGE_PRIORITY: &str = "\"__queue_merge_priority\"";

/// Which jobs a claim reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// Every waiting job whose time has come, in one scan of the claim
    /// order.
    OneScan,
    /// The jobs ready now and, apart, those whose time came; merged.
    ReadyAndDue,
    /// The jobs ready now only (the claim at the cursor, where the table
    /// reads the two sets apart: the claims from the start, one every few
    /// milliseconds, take the due ones).
    Ready,
}

/// The claim: lock up to $limit eligible rows, skipping locked ones, and
/// mark them processing in the same statement. The update finds the rows
/// by their places (`ctid = ANY(ARRAY(..))`, see [`claims_by_place`]) or
/// else by key (`= ANY(ARRAY(..))`), which keeps large batches on a TID
/// scan or the primary key instead of a join the planner may turn into a
/// scan of the table;
/// `__queue_rank` restores the claim order. The store reads the four
/// `__queue_*` columns by position: keep them first, in order.
///
/// Where the table has the indexes for it ([`TableShape::due_apart`](super::TableShape::due_apart)),
/// the claim from the start reads two sets and merges them in claim order:
/// the best `limit` jobs *ready* now (no `process_after`), in the claim
/// order, from the index of ready jobs, and the `limit` jobs that *came due*
/// first (scheduled, or retrying after a failure, whose time has passed),
/// from the index of due times. Jobs still waiting for their time are in
/// neither index's range, so a million of them cost a claim nothing; read
/// in one scan, the claim order steps over each of them. The claim at the
/// cursor reads the ready jobs alone (the second set and the merge cost a
/// claim about 3 % of a drain's rate): a job that comes due during a
/// backlog waits for the next claim from the start, at most the cursor's
/// rescan interval, as does one of a higher priority than the cursor's.
/// Without those indexes, every claim reads one scan in claim order and
/// takes every waiting job whose time has come.
///
/// The claimable states and the batch size are literals, not binds: only
/// with the state values in its text can a cached generic plan use a
/// partial index on them, and only with a known limit is that plan as
/// cheap as a custom one, so each claim size is planned a few times per
/// connection instead of on every call (0.1-0.15 ms each; the worker
/// claims in a few sizes only). Both come from the options and the
/// caller, never from job data.
pub(super) fn statements(t: &Target) -> ClaimStatements {
    let split = t.names.get(Column::ProcessAfter).is_some() && t.shape.due_apart;
    let from_start = template(
        t,
        if split {
            Reads::ReadyAndDue
        } else {
            Reads::OneScan
        },
    );
    // The cursor needs an order it can start in the middle of with one
    // index condition: by key within one priority. It starts at its
    // position, included: the last job taken (claimed, so no longer
    // waiting: one index entry more to step over), or the first waiting
    // job a probe found.
    let cursor = t.options.cursor_rescan_after().is_some();
    let at_cursor = cursor.then(|| {
        let template = template(t, if split { Reads::Ready } else { Reads::OneScan });
        let n = template.params.len() + 1;
        let mut params = template.params.clone();
        let condition = match cursor_priority(t) {
            Some(priority) => {
                params.extend([Param::CursorPriority, Param::CursorKey]);
                format!(" AND {priority} = ${n} AND {} >= ${}", t.id, n + 1)
            }
            None => {
                params.push(Param::CursorKey);
                format!(" AND {} >= ${n}", t.id)
            }
        };
        (template, condition, params)
    });
    ClaimStatements {
        from_start,
        at_cursor,
        kind: t.names.at(Column::Kind),
    }
}

/// The cursor's probe (see [`crate::cursor`]), read-only and without
/// locks: the position of the first waiting job ready now in claim order
/// (priority, 0 without the column, and key; no row when none waits),
/// whether it is before the cursor ([`Param::CursorPriority`] and
/// [`Param::CursorKey`]), and whether jobs whose time came wait apart (where
/// claims read them apart, [`TableShape::due_apart`](super::TableShape::due_apart)),
/// which only a claim from the start takes. `None` without a cursor.
pub(super) fn cursor_probe(t: &Target) -> Option<CursorProbe> {
    t.options.cursor_rescan_after()?;
    let (table, a, id) = (&t.table, &t.a, &t.id);
    let mut b = Builder::default();
    let priority = cursor_priority(t).unwrap_or_else(|| "0".to_owned());
    let (cursor_priority, cursor_key) = (b.p(Param::CursorPriority), b.p(Param::CursorKey));
    let now = b.p(Param::Now);
    let not_expired = match t.names.at(Column::ExpiresAt) {
        Some(expires) => format!(" AND ({expires} IS NULL OR {expires} > {now})"),
        None => String::new(),
    };
    let after = t.names.at(Column::ProcessAfter);
    let split = after.is_some() && t.shape.due_apart;
    let ready = match &after {
        Some(after) if split => format!(" AND {after} IS NULL"),
        Some(after) => format!(" AND ({after} IS NULL OR {after} <= {now})"),
        None => String::new(),
    };
    let due = match &after {
        Some(after) if split => format!(
            "EXISTS (SELECT 1 FROM {table} AS {a} WHERE {waiting} AND {after} IS NOT NULL \
             AND {after} <= {now}{not_expired})",
            waiting = waiting(t)
        ),
        _ => "false".to_owned(),
    };
    let first = format!(
        "SELECT {priority}::int8 AS p, {id} AS k FROM {table} AS {a} WHERE {waiting}{ready}{not_expired} \
         ORDER BY {order} LIMIT 1",
        waiting = waiting(t),
        order = claim_order(t)
    );
    let mut walk = Builder::default();
    walk.p(Param::Now);
    walk.push(&format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        // The walk numbers its one input $1, the probe $3.
        first.replace(&now, "$1")
    ));
    b.push(&format!(
        "SELECT f.p AS \"priority\", f.k AS \"key\", \
         coalesce(f.p > {cursor_priority} OR (f.p = {cursor_priority} AND f.k < {cursor_key}), false) AS \"before\", \
         {due} AS \"due\" FROM (SELECT 1) AS one LEFT JOIN ({first}) AS f ON true"
    ));
    Some(CursorProbe {
        probe: b.build(),
        walk: walk.build(),
    })
}

/// The cursor's reads off the claim path.
#[derive(Debug, Clone)]
pub(crate) struct CursorProbe {
    /// The probe: see [`cursor_probe`].
    pub probe: Statement,
    /// The walk from the start to the first waiting job, measured:
    /// `EXPLAIN (ANALYZE, BUFFERS)` of the probe's read of that job, whose
    /// blocks say whether the walk is costly (see [`crate::cursor`]).
    pub walk: Statement,
}

/// The priority column the cursor starts within, when the store keeps a
/// cursor and the table has one.
fn cursor_priority(t: &Target) -> Option<String> {
    t.names
        .at(Column::Priority)
        .filter(|_| t.options.cursor_rescan_after().is_some())
}

/// The candidates' column of their rows' places (`ctid`).
const PLACE: &str = "\"__queue_place\"";

/// Whether the claim's update finds its rows by their places (`ctid`, read
/// where the candidates were locked) rather than by key: a TID scan
/// instead of a descent of the primary key per row, about a tenth of the
/// executor time of a claim of 40 jobs (pgbench, the default table). A
/// row's place is its locked version's
/// (a lock that waited on an update locks, and returns, the newest
/// version), and a locked row cannot move. Not on a partitioned or
/// inherited table, where a place names a row only within its partition
/// or child ([`TableShape::places_name_rows`](super::TableShape::places_name_rows)),
/// nor in a user's claim order, whose candidates are read from the table
/// again.
fn claims_by_place(t: &Target, reads: Reads) -> bool {
    let user_order = reads == Reads::ReadyAndDue && t.options.order_by.is_some();
    t.shape.places_name_rows() && !user_order
}

/// One claim statement, reading `reads`.
fn template(t: &Target, reads: Reads) -> Template {
    let (options, names) = (t.options, &t.names);
    let (table, a, id, id_name, st) = (&t.table, &t.a, &t.id, &t.id_name, t.st());
    let mut b = Builder::default();
    let mut pieces = Vec::new();
    let order = claim_order(t);
    let synchronous_off = if options.claim_commit == ClaimCommit::Async {
        format!(" AND {}", super::SYNCHRONOUS_COMMIT_OFF)
    } else {
        String::new()
    };
    let not_expired = |b: &mut Builder| match names.at(Column::ExpiresAt) {
        // Expired jobs are never started; the resetter's sweep ends them.
        Some(expires) => {
            let now = b.p(Param::Now);
            format!(" AND ({expires} IS NULL OR {expires} > {now})")
        }
        None => String::new(),
    };
    let after = names.at(Column::ProcessAfter);
    let by_place = claims_by_place(t, reads);
    // Each candidate's place (its row's newest version, which its lock
    // holds still), for the update to find the row by.
    let place = if by_place {
        format!(", {a}.ctid AS {PLACE}")
    } else {
        String::new()
    };
    let placed = if by_place {
        format!(", {PLACE}")
    } else {
        String::new()
    };
    // By place, the table alone, without inheritance children it gains
    // after start-up (whose places repeat the table's): their jobs wait
    // for a restart rather than a claim taking the wrong rows.
    let only = if by_place { "ONLY " } else { "" };
    match (reads, &after) {
        (Reads::ReadyAndDue, Some(after)) => {
            let merge_priority = names
                .at(Column::Priority)
                .filter(|_| options.order_by.is_none());
            let carried = merge_priority
                .as_ref()
                .map(|p| format!(", {p} AS {MERGE_PRIORITY}"))
                .unwrap_or_default();
            let now = b.p(Param::Now);
            let not_expired = not_expired(&mut b);
            b.push(&format!(
                "WITH ready AS (SELECT {id}{place}{carried} FROM {only}{table} AS {a} WHERE {waiting}{synchronous_off} \
                 AND {after} IS NULL{not_expired}",
                waiting = waiting(t)
            ));
            cut(&mut b, &mut pieces, Piece::Conditions);
            cut(&mut b, &mut pieces, Piece::Cursor);
            b.push(&format!(" ORDER BY {order} LIMIT "));
            cut(&mut b, &mut pieces, Piece::Limit);
            b.push(&format!(
                " FOR UPDATE SKIP LOCKED), due AS (SELECT {id}{place}{carried} FROM {only}{table} AS {a} WHERE {waiting} \
                 AND {after} IS NOT NULL AND {after} <= {now}{not_expired}",
                waiting = waiting(t)
            ));
            cut(&mut b, &mut pieces, Piece::Conditions);
            b.push(&format!(" ORDER BY {after} LIMIT "));
            cut(&mut b, &mut pieces, Piece::Limit);
            b.push(" FOR UPDATE SKIP LOCKED), candidates AS (");
            match &merge_priority {
                // The default order, from what the two sets carry.
                Some(_) => b.push(&format!(
                    "SELECT {id_name}{placed} FROM (SELECT * FROM ready UNION ALL SELECT * FROM due) AS c \
                     ORDER BY c.{MERGE_PRIORITY} DESC, c.{id_name} LIMIT "
                )),
                None if options.order_by.is_none() => b.push(&format!(
                    "SELECT {id_name}{placed} FROM (SELECT * FROM ready UNION ALL SELECT * FROM due) AS c \
                     ORDER BY c.{id_name} LIMIT "
                )),
                // An order of the user's, read from the (locked) rows.
                None => b.push(&format!(
                    "SELECT {id} FROM {table} AS {a} WHERE {id} = ANY(ARRAY(\
                     SELECT {id_name} FROM ready UNION ALL SELECT {id_name} FROM due)) ORDER BY {order} LIMIT "
                )),
            };
            cut(&mut b, &mut pieces, Piece::Limit);
            b.push(")");
        }
        _ => {
            b.push(&format!(
                "WITH candidates AS (SELECT {id}{place} FROM {only}{table} AS {a} WHERE {}{synchronous_off}",
                waiting(t)
            ));
            if let Some(after) = &after {
                if reads == Reads::Ready {
                    b.push(&format!(" AND {after} IS NULL"));
                } else {
                    let now = b.p(Param::Now);
                    b.push(&format!(" AND ({after} IS NULL OR {after} <= {now})"));
                }
            }
            let not_expired = not_expired(&mut b);
            b.push(&not_expired);
            cut(&mut b, &mut pieces, Piece::Conditions);
            cut(&mut b, &mut pieces, Piece::Cursor);
            b.push(&format!(" ORDER BY {order} LIMIT "));
            cut(&mut b, &mut pieces, Piece::Limit);
            b.push(" FOR UPDATE SKIP LOCKED)");
        }
    }
    let processing = b.p(Param::State(JobState::Processing));
    let mut sets = vec![format!("{} = CAST({processing} AS {st})", t.state_name)];
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
    if let (Some(name), Some(at)) = (names.get(Column::ClaimToken), names.at(Column::ClaimToken)) {
        sets.push(format!(
            "{name} = {at} + {}",
            super::bookkeeping::TOKEN_STEP
        ));
    }
    if let Some(name) = names.get(Column::ExecutionLogs) {
        sets.push(format!("{name} = '{{}}'"));
    }
    // A claim clears both times (`JobState::times_agree`): a retried job's
    // last finish and its due time go. A fresh job has neither, and
    // writing the same empty values changes no indexed column.
    for c in [Column::FinishedAt, Column::ProcessAfter] {
        if let Some(name) = names.get(c).filter(|_| t.shape.clears(c)) {
            sets.push(format!("{name} = NULL"));
        }
    }
    let select = options.select.clone().unwrap_or_else(|| format!("{a}.*"));
    let mut returning_record = if options.view.is_none() {
        format!(", {select}")
    } else {
        String::new()
    };
    if let Some(priority) = cursor_priority(t) {
        // Last, so that a decoder reading the record by position is not
        // disturbed.
        returning_record.push_str(&format!(
            ", {priority}::int8 AS \"{CURSOR_PRIORITY_COLUMN}\""
        ));
    }
    // A job's own limits, read by name where the table keeps them.
    if let Some(max) = names.at(Column::MaxAttempts) {
        returning_record.push_str(&format!(", {max}::int8 AS \"{MAX_ATTEMPTS_COLUMN}\""));
    } else if let Some(left) = names.at(Column::AttemptsLeft) {
        // A countdown: the attempts so far (the failures, where the table
        // counts them) and those left, this one included, make the limit.
        let so_far = names
            .at(Column::NumFailures)
            .map(|f| format!("{f}::int8 + "))
            .unwrap_or_default();
        returning_record.push_str(&format!(
            ", ({so_far}{left}::int8) AS \"{MAX_ATTEMPTS_COLUMN}\""
        ));
    }
    if let Some(amo) = names.at(Column::AtMostOnce) {
        returning_record.push_str(&format!(", ({amo}) IS TRUE AS \"{AT_MOST_ONCE_COLUMN}\""));
    }
    let failures = names
        .at(Column::NumFailures)
        .map(|f| format!("{f}::int8"))
        .unwrap_or_else(|| "0::int8".into());
    let columns = format!(
        "{id} AS \"__queue_id\", {token} AS \"__queue_token\", {failures} AS \"__queue_failures\", \
         array_position(ARRAY(SELECT {id_name} FROM candidates), {id}) AS \"__queue_rank\"{returning_record}",
        token = t.token,
    );
    let which = if by_place {
        // The locked rows are still waiting: the guard costs a comparison.
        format!(
            "{a}.ctid = ANY(ARRAY(SELECT {PLACE} FROM candidates)) AND {}",
            waiting(t)
        )
    } else if t.shape.partitioned {
        // The update names the states its rows are in (they are locked, so
        // still in them), and Postgres prunes it to the live partition
        // instead of looking up each key in every partition.
        format!(
            "{id} = ANY(ARRAY(SELECT {id_name} FROM candidates)) AND {}",
            waiting(t)
        )
    } else {
        format!("{id} = ANY(ARRAY(SELECT {id_name} FROM candidates))")
    };
    match &t.shape.side {
        None => {
            b.push(&format!(
                " UPDATE {only}{table} AS {a} SET {sets} WHERE {which} RETURNING {columns}",
                sets = sets.join(", "),
            ));
        }
        Some(side) => {
            // The claimed rows, then their bookkeeping rows (a retrying
            // job's kept its counts; a new one starts them), in the same
            // statement; the record is read from the two joined.
            let (now, worker) = (b.p(Param::Now), b.p(Param::Worker));
            let step = super::bookkeeping::TOKEN_STEP;
            let (side_table, side_alias, key) = (
                &side.table,
                super::bookkeeping::SIDE,
                super::bookkeeping::KEY,
            );
            b.push(&format!(
                ", \"__queue_claimed\" AS (UPDATE {only}{table} AS {a} SET {sets} \
                 WHERE {which} RETURNING {a}.*), \
                 \"__queue_booked\" AS (INSERT INTO {side_table} AS s ({key}, \"claim_token\", \"started_at\", \
                 \"last_heartbeat_at\", \"worker_hostname\", \"execution_logs\") \
                 SELECT c.{id_name}, {step}, {now}, {now}, {worker}, '{{}}' FROM \"__queue_claimed\" AS c \
                 ON CONFLICT ({key}) DO UPDATE SET \"claim_token\" = s.\"claim_token\" + {step}, \
                 \"started_at\" = EXCLUDED.\"started_at\", \"last_heartbeat_at\" = EXCLUDED.\"last_heartbeat_at\", \
                 \"worker_hostname\" = EXCLUDED.\"worker_hostname\", \"execution_logs\" = '{{}}' RETURNING s.*) \
                 SELECT {columns} FROM \"__queue_claimed\" AS {a} JOIN \"__queue_booked\" AS {side_alias} \
                 ON {side_alias}.{key} = {id}",
                sets = sets.join(", "),
            ));
        }
    }
    pieces.push(Piece::Sql(std::mem::take(&mut b.text)));
    Template {
        pieces,
        params: b.params,
    }
}

/// Claimed records by key, read through the configured view.
pub(super) fn select_view(t: &Target) -> Option<Statement> {
    t.options.view.as_ref().map(|view| {
        let select = t.options.select.clone().unwrap_or_else(|| format!("{}.*", t.a));
        let mut b = Builder::default();
        let ids = b.p(Param::Ids);
        b.push(&format!(
            "SELECT {id} AS \"__queue_id\", {select} FROM {view} AS {a} WHERE {id} = ANY(CAST({ids} AS {kt}[]))",
            id = t.id,
            a = t.a,
            kt = t.kt(),
            view = view.quoted()
        ));
        b.build()
    })
}

/// Claimed rows by key with enum columns cast to text (for a record type
/// that reads them as strings), when the table has enum columns and no
/// view or select list of the user's reads them.
pub(super) fn select_text(t: &Target) -> Option<Statement> {
    t.shape
        .text_select
        .as_ref()
        .filter(|_| t.options.select.is_none() && t.options.view.is_none())
        .map(|list| {
            let mut b = Builder::default();
            let ids = b.p(Param::Ids);
            b.push(&format!(
                "SELECT {id} AS \"__queue_id\", {list} FROM {table} AS {a} WHERE {id} = ANY(CAST({ids} AS {kt}[]))",
                id = t.id,
                a = t.a,
                table = t.table,
                kt = t.kt(),
            ));
            b.build()
        })
}

/// The earliest time a waiting job comes due after $now (the default
/// table's due index answers it with one probe); `None` without a
/// `process_after` column.
pub(super) fn next_due(t: &Target) -> Option<Statement> {
    t.names.at(Column::ProcessAfter).map(|after| {
        let mut b = Builder::default();
        let now = b.p(Param::Now);
        b.push(&format!(
            "SELECT min({after}) FROM {table} AS {a} WHERE {waiting} \
             AND {after} IS NOT NULL AND {after} > {now}",
            table = t.table,
            a = t.a,
            waiting = waiting(t),
        ));
        b.build()
    })
}

#[cfg(test)]
mod tests {
    use super::super::{test_shape, Statements, TableShape};
    use super::*;
    use crate::options::PgStoreOptions;

    /// The shape of a table whose indexes do not let claims read ready and
    /// due jobs apart.
    fn one_scan_shape() -> TableShape {
        TableShape {
            due_apart: false,
            ..test_shape()
        }
    }

    const UPDATE: &str = " UPDATE ONLY \"public\".\"jobs\" AS \"jobs\" SET \"state\" = CAST($2 AS text), \"started_at\" = $1, \
         \"last_heartbeat_at\" = $1, \"worker_hostname\" = $3, \"claim_token\" = \"jobs\".\"claim_token\" + 1 + floor(random() * 1073741824)::int8, \
         \"execution_logs\" = '{}', \"finished_at\" = NULL, \"process_after\" = NULL WHERE \"jobs\".ctid = ANY(ARRAY(SELECT \"__queue_place\" FROM candidates)) \
         AND \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
         RETURNING \"jobs\".\"id\" AS \"__queue_id\", \"jobs\".\"claim_token\" AS \"__queue_token\", \
         \"jobs\".\"num_failures\"::int8 AS \"__queue_failures\", \
         array_position(ARRAY(SELECT \"id\" FROM candidates), \"jobs\".\"id\") AS \"__queue_rank\", \"jobs\".*, \
         \"jobs\".\"priority\"::int8 AS \"__queue_priority\", \
         \"jobs\".\"max_attempts\"::int8 AS \"__queue_max_attempts\", \
         (\"jobs\".\"at_most_once\") IS TRUE AS \"__queue_at_most_once\"";

    /// The inputs of a claim on the default table, in order.
    const CLAIM_PARAMS: [Param; 3] = [
        Param::Now,
        Param::State(JobState::Processing),
        Param::Worker,
    ];

    #[test]
    fn a_claim_on_a_partitioned_table_names_the_waiting_states_in_its_update() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let shape = TableShape {
            partitioned: true,
            ..test_shape()
        };
        let claim = Statements::new(&options, &shape, &[]).claim(&[], &[], 32);
        // By key: a row's place names it only within its partition.
        let by_key = UPDATE
            .replace(
                "\"jobs\".ctid = ANY(ARRAY(SELECT \"__queue_place\" FROM candidates))",
                "\"jobs\".\"id\" = ANY(ARRAY(SELECT \"id\" FROM candidates))",
            )
            .replace(" UPDATE ONLY ", " UPDATE ");
        assert!(claim.text.ends_with(&by_key), "{}", claim.text);
        assert!(!claim.text.contains("ctid"), "{}", claim.text);
        assert!(!claim.text.contains("ONLY"), "{}", claim.text);
    }

    #[test]
    fn default_claim_quotes_names_binds_values_and_spells_out_states_and_limit() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let claim = Statements::new(&options, &test_shape(), &[]).claim(&[], &[], 32);
        assert_eq!(
            *claim.text,
            format!(
                "WITH ready AS (SELECT \"jobs\".\"id\", \"jobs\".ctid AS \"__queue_place\", \
                 \"jobs\".\"priority\" AS \"__queue_merge_priority\" FROM ONLY \"public\".\"jobs\" AS \"jobs\" \
                 WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
                 AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off' \
                 AND \"jobs\".\"process_after\" IS NULL \
                 AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $1) \
                 ORDER BY \"jobs\".\"priority\" DESC, \"jobs\".\"id\" LIMIT 32 FOR UPDATE SKIP LOCKED), \
                 due AS (SELECT \"jobs\".\"id\", \"jobs\".ctid AS \"__queue_place\", \
                 \"jobs\".\"priority\" AS \"__queue_merge_priority\" FROM ONLY \"public\".\"jobs\" AS \"jobs\" \
                 WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
                 AND \"jobs\".\"process_after\" IS NOT NULL AND \"jobs\".\"process_after\" <= $1 \
                 AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $1) \
                 ORDER BY \"jobs\".\"process_after\" LIMIT 32 FOR UPDATE SKIP LOCKED), \
                 candidates AS (SELECT \"id\", \"__queue_place\" FROM (SELECT * FROM ready UNION ALL SELECT * FROM due) AS c \
                 ORDER BY c.\"__queue_merge_priority\" DESC, c.\"id\" LIMIT 32){UPDATE}"
            )
        );
        assert_eq!(claim.params, CLAIM_PARAMS);
    }

    #[test]
    fn without_the_indexes_for_it_the_claim_reads_every_waiting_job_in_one_scan() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let claim = Statements::new(&options, &one_scan_shape(), &[]).claim(&[], &[], 32);
        assert_eq!(
            *claim.text,
            format!(
                "WITH candidates AS (SELECT \"jobs\".\"id\", \"jobs\".ctid AS \"__queue_place\" FROM ONLY \"public\".\"jobs\" AS \"jobs\" \
                 WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
                 AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off' \
                 AND (\"jobs\".\"process_after\" IS NULL OR \"jobs\".\"process_after\" <= $1) \
                 AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $1) \
                 ORDER BY \"jobs\".\"priority\" DESC, \"jobs\".\"id\" LIMIT 32 FOR UPDATE SKIP LOCKED){UPDATE}"
            )
        );
        assert_eq!(claim.params, CLAIM_PARAMS);
    }

    #[test]
    fn a_split_claim_merges_by_key_alone_or_reads_a_custom_order_from_the_rows() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let by_key = Statements::new(
            &options.clone().without(Column::Priority).unwrap(),
            &test_shape(),
            &[],
        )
        .claim(&[], &[], 8)
        .text;
        assert!(
            by_key.contains(
                "candidates AS (SELECT \"id\", \"__queue_place\" FROM (SELECT * FROM ready UNION ALL SELECT * FROM due) AS c \
                 ORDER BY c.\"id\" LIMIT 8)"
            ),
            "{by_key}"
        );
        assert!(!by_key.contains("__queue_merge_priority"), "{by_key}");
        let custom = Statements::new(
            &options.order_by("jobs.queued_at, jobs.id"),
            &test_shape(),
            &[],
        )
        .claim(&[], &[], 8)
        .text;
        assert!(
            custom.contains(
                "candidates AS (SELECT \"jobs\".\"id\" FROM \"public\".\"jobs\" AS \"jobs\" WHERE \"jobs\".\"id\" = ANY(ARRAY(\
                 SELECT \"id\" FROM ready UNION ALL SELECT \"id\" FROM due)) ORDER BY jobs.queued_at, jobs.id LIMIT 8)"
            ),
            "{custom}"
        );
        assert!(
            custom.contains(
                "\"jobs\".\"expires_at\" > $1) ORDER BY jobs.queued_at, jobs.id LIMIT 8 FOR UPDATE"
            ),
            "ready jobs in the user's order: {custom}"
        );
        assert!(
            custom.contains("WHERE \"jobs\".\"id\" = ANY(ARRAY(SELECT \"id\" FROM candidates))")
                && !custom.contains("ctid"),
            "candidates read again from the table are found by key: {custom}"
        );
    }

    #[test]
    fn the_cursor_claim_starts_at_a_key_within_a_priority() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let s = Statements::new(&options, &one_scan_shape(), &[]);
        let from_start = s.claim(&[], &[], 32);
        let after = s.claim_after_cursor(32).expect("a cursor by default");
        assert_eq!(
            *after.text,
            from_start.text.replacen(
                " ORDER BY",
                " AND \"jobs\".\"priority\" = $4 AND \"jobs\".\"id\" >= $5 ORDER BY",
                1
            ),
            "the claim from the start with one more condition, numbered after its inputs"
        );
        assert_eq!(after.params[3..], [Param::CursorPriority, Param::CursorKey]);
        assert!(s.cursor_reads_priority());

        // Where claims read ready and due jobs apart, the claim at the
        // cursor reads the ready ones alone.
        let s = Statements::new(&options, &test_shape(), &[]);
        let after = s.claim_after_cursor(32).expect("a cursor by default");
        assert!(
            after.text.starts_with(
                "WITH candidates AS (SELECT \"jobs\".\"id\", \"jobs\".ctid AS \"__queue_place\" FROM ONLY \"public\".\"jobs\" AS \"jobs\" \
                 WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
                 AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off' \
                 AND \"jobs\".\"process_after\" IS NULL \
                 AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $1) \
                 AND \"jobs\".\"priority\" = $4 AND \"jobs\".\"id\" >= $5 \
                 ORDER BY \"jobs\".\"priority\" DESC, \"jobs\".\"id\" LIMIT 32 FOR UPDATE SKIP LOCKED) UPDATE"
            ),
            "{}",
            after.text
        );
        assert_eq!(after.params[3..], [Param::CursorPriority, Param::CursorKey]);
        assert!(s.claim(&[], &[], 32).text.contains("due AS ("));

        let by_key = Statements::new(
            &options.clone().without(Column::Priority).unwrap(),
            &test_shape(),
            &[],
        );
        let after = by_key.claim_after_cursor(8).expect("a cursor by key alone");
        assert!(
            after
                .text
                .contains(" AND \"jobs\".\"id\" >= $4 ORDER BY \"jobs\".\"id\" LIMIT 8"),
            "{}",
            after.text
        );
        assert_eq!(after.params[3..], [Param::CursorKey]);
        assert!(!by_key.cursor_reads_priority());
        assert!(!by_key.claim(&[], &[], 8).text.contains("__queue_priority"));

        for without in [
            options.clone().claim_cursor(None),
            options.clone().order_by("jobs.queued_at"),
        ] {
            let s = Statements::new(&without, &test_shape(), &[]);
            assert!(s.claim_after_cursor(32).is_none(), "{without:?}");
            assert!(s.cursor_probe.is_none(), "{without:?}");
            assert!(!s.claim(&[], &[], 32).text.contains("__queue_priority"));
        }
    }

    #[test]
    fn the_cursor_probe_reads_the_first_ready_job_and_whether_due_ones_wait_apart() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let s = Statements::new(&options, &test_shape(), &[]);
        let probes = s.cursor_probe.expect("a probe with the cursor");
        let probe = &probes.probe;
        assert_eq!(
            &*probe.text,
            "SELECT f.p AS \"priority\", f.k AS \"key\", \
             coalesce(f.p > $1 OR (f.p = $1 AND f.k < $2), false) AS \"before\", \
             EXISTS (SELECT 1 FROM \"public\".\"jobs\" AS \"jobs\" \
             WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
             AND \"jobs\".\"process_after\" IS NOT NULL AND \"jobs\".\"process_after\" <= $3 \
             AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $3)) AS \"due\" \
             FROM (SELECT 1) AS one LEFT JOIN (SELECT \"jobs\".\"priority\"::int8 AS p, \"jobs\".\"id\" AS k \
             FROM \"public\".\"jobs\" AS \"jobs\" \
             WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
             AND \"jobs\".\"process_after\" IS NULL \
             AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $3) \
             ORDER BY \"jobs\".\"priority\" DESC, \"jobs\".\"id\" LIMIT 1) AS f ON true"
        );
        assert_eq!(
            probe.params,
            [Param::CursorPriority, Param::CursorKey, Param::Now]
        );
        assert_eq!(
            &*probes.walk.text,
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT \"jobs\".\"priority\"::int8 AS p, \"jobs\".\"id\" AS k \
             FROM \"public\".\"jobs\" AS \"jobs\" \
             WHERE \"jobs\".\"state\" IN (CAST(E'queued' AS text), CAST(E'errored' AS text)) \
             AND \"jobs\".\"process_after\" IS NULL \
             AND (\"jobs\".\"expires_at\" IS NULL OR \"jobs\".\"expires_at\" > $1) \
             ORDER BY \"jobs\".\"priority\" DESC, \"jobs\".\"id\" LIMIT 1",
            "the walk measured: the probe's read of the first waiting job, its input renumbered"
        );
        assert_eq!(probes.walk.params, [Param::Now]);

        // In one scan: the first job whose time has come, none apart.
        let one_scan = Statements::new(&options, &one_scan_shape(), &[])
            .cursor_probe
            .expect("a probe")
            .probe;
        assert!(one_scan.text.contains(
            "AND (\"jobs\".\"process_after\" IS NULL OR \"jobs\".\"process_after\" <= $3)"
        ));
        assert!(one_scan.text.contains("false AS \"due\""));

        // Without a priority column, every job is in priority 0.
        let by_key = Statements::new(
            &options.clone().without(Column::Priority).unwrap(),
            &test_shape(),
            &[],
        )
        .cursor_probe
        .expect("a probe")
        .probe;
        assert!(by_key
            .text
            .contains("(SELECT 0::int8 AS p, \"jobs\".\"id\" AS k"));
    }

    #[test]
    fn only_async_claims_turn_synchronous_commit_off() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let asynchronous = Statements::new(&options, &test_shape(), &[])
            .claim(&[], &[], 8)
            .text;
        let durable = Statements::new(
            &options.claim_commit(ClaimCommit::Durable),
            &test_shape(),
            &[],
        )
        .claim(&[], &[], 8)
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
        let s = Statements::new(&options, &test_shape(), &[]);
        let claim = s.claim(&[], &[], 8).text;
        assert!(
            claim.contains("FROM ONLY \"My \"\"Schema\"\"\".\"select\" AS \"select\""),
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
    fn conditions_are_numbered_after_the_claims_own_parameters() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let cond = PgCondition::new("jobs.cost <= {} AND jobs.kind = {}")
            .bind(5i64)
            .bind("x");
        let one_scan = Statements::new(&options, &one_scan_shape(), &[]).claim(
            std::slice::from_ref(&cond),
            &[],
            8,
        );
        assert!(
            one_scan
                .text
                .contains("AND (jobs.cost <= $4 AND jobs.kind = $5) ORDER BY"),
            "{}",
            one_scan.text
        );
        let split = Statements::new(&options, &test_shape(), &[]).claim(
            std::slice::from_ref(&cond),
            &[],
            8,
        );
        assert_eq!(
            split
                .text
                .matches("AND (jobs.cost <= $4 AND jobs.kind = $5) ORDER BY")
                .count(),
            2,
            "ready and due jobs alike, with the same placeholders: {}",
            split.text
        );
        assert_eq!(split.params.len(), 3);
    }

    #[test]
    fn paused_kinds_are_passed_over_before_the_extra_conditions() {
        let options = crate::JobTable::default().store_options();
        let cond = PgCondition::new("jobs.cost <= {}").bind(5i64);
        let paused = ["mail".to_owned()];
        let claim = Statements::new(&options, &test_shape(), &[]).claim(
            std::slice::from_ref(&cond),
            &paused,
            8,
        );
        assert_eq!(
            claim
                .text
                .matches("AND ((\"queue_jobs\".\"kind\"::text || '') <> ALL($4::text[]) OR \"queue_jobs\".\"kind\" IS NULL) AND (jobs.cost <= $5)")
                .count(),
            2,
            "ready and due jobs alike: {}",
            claim.text
        );
        assert_eq!(claim.params.last(), Some(&Param::PausedKinds));
        assert_eq!(claim.params.len(), 4, "the condition's value comes after");
    }
}
