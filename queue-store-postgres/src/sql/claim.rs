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

/// The claim's text in pieces, since the extra conditions and the limit
/// change from claim to claim.
#[derive(Debug, Clone)]
pub(super) struct ClaimStatements {
    /// The claim, up to the place where extra conditions go.
    head: String,
    /// The claim's order, up to its (literal) limit.
    order: String,
    /// The claim after the extra conditions.
    tail: String,
    params: Vec<Param>,
    /// With the claim cursor: the condition that starts the claim's scan
    /// after the cursor, numbered after `params`, and its inputs.
    after: Option<(String, Vec<Param>)>,
}

impl ClaimStatements {
    /// The claim statement for up to `limit` jobs with `conditions`
    /// spliced in; condition placeholders are numbered after the statement's
    /// own parameters.
    pub(super) fn claim(&self, conditions: &[PgCondition], limit: usize) -> Statement {
        let mut text = self.head.clone();
        let mut next = self.params.len() + 1;
        for condition in conditions {
            text.push_str(" AND (");
            text.push_str(&condition.numbered(&mut next));
            text.push(')');
        }
        text.push_str(&self.order);
        text.push_str(&limit.to_string());
        text.push_str(&self.tail);
        Statement {
            text,
            params: self.params.clone(),
        }
    }

    /// The claim of up to `limit` jobs after the cursor (no extra
    /// conditions), if the store keeps one.
    pub(super) fn claim_after_cursor(&self, limit: usize) -> Option<Statement> {
        let (condition, params) = self.after.as_ref()?;
        Some(Statement {
            text: format!("{}{condition}{}{limit}{}", self.head, self.order, self.tail),
            params: params.clone(),
        })
    }

    /// Whether claims return the priority of each job for the cursor (as
    /// their last column, [`CURSOR_PRIORITY_COLUMN`]).
    pub(super) fn cursor_reads_priority(&self) -> bool {
        self.after
            .as_ref()
            .is_some_and(|(_, params)| params.contains(&Param::CursorPriority))
    }
}

/// `state IN (queued, errored)`: the states a job waits in, spelled out.
fn waiting(t: &Target) -> String {
    format!(
        "{} IN ({}, {})",
        t.state,
        t.state_literal(JobState::Queued),
        t.state_literal(JobState::Errored)
    )
}

/// The claim's order: the configured one, or priority (highest first) then
/// key.
fn claim_order(t: &Target) -> String {
    t.options
        .order_by
        .clone()
        .unwrap_or_else(|| match t.names.at(Column::Priority) {
            Some(priority) => format!("{priority} DESC, {}", t.id),
            None => t.id.clone(),
        })
}

/// The claim: lock up to $limit eligible rows, skipping locked ones, and
/// mark them processing in the same statement. The update finds the rows
/// by key (`= ANY(ARRAY(..))`), which keeps large batches on the primary
/// key instead of a join the planner may turn into a scan of the table;
/// `__queue_rank` restores the claim order. The store reads the four
/// `__queue_*` columns by position: keep them first, in order.
///
/// The claimable states and the batch size are literals, not binds: only
/// with the state values in its text can a cached generic plan use a
/// partial index on them, and only with a known limit is that plan as
/// cheap as a custom one, so each claim size is planned a few times per
/// connection instead of on every call (0.1-0.15 ms each; the worker
/// claims in a few sizes only). Both come from the options and the
/// caller, never from job data.
pub(super) fn statements(t: &Target) -> ClaimStatements {
    let (options, names) = (t.options, &t.names);
    let (table, a, id, id_name, st) = (&t.table, &t.a, &t.id, &t.id_name, t.st());
    let mut b = Builder::default();
    b.push(&format!(
        "WITH candidates AS (SELECT {id} FROM {table} AS {a} WHERE {}",
        waiting(t)
    ));
    if options.claim_commit == ClaimCommit::Async {
        // An initplan run once per claim; `true`: for the statement's own
        // transaction only, so it holds at its commit and is gone after.
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
    let head = std::mem::take(&mut b.text);
    let order = format!(" ORDER BY {} LIMIT ", claim_order(t));
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
        // A random step (up to 2^30): a claim made again after a claim the
        // server forgot in a crash gets a token of its own.
        sets.push(format!(
            "{name} = {at} + 1 + floor(random() * 1073741824)::int8"
        ));
    }
    if let Some(name) = names.get(Column::ExecutionLogs) {
        sets.push(format!("{name} = '{{}}'"));
    }
    let select = options.select.clone().unwrap_or_else(|| format!("{a}.*"));
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
            ", {priority}::int8 AS \"{CURSOR_PRIORITY_COLUMN}\""
        ));
    }
    // A job's own limits, read by name where the table keeps them.
    if let Some(max) = names.at(Column::MaxAttempts) {
        returning_record.push_str(&format!(", {max}::int8 AS \"{MAX_ATTEMPTS_COLUMN}\""));
    }
    if let Some(amo) = names.at(Column::AtMostOnce) {
        returning_record.push_str(&format!(", ({amo}) IS TRUE AS \"{AT_MOST_ONCE_COLUMN}\""));
    }
    let failures = names
        .at(Column::NumFailures)
        .map(|f| format!("{f}::int8"))
        .unwrap_or_else(|| "0::int8".into());
    b.push(&format!(
        " FOR UPDATE SKIP LOCKED) \
         UPDATE {table} AS {a} SET {sets} WHERE {id} = ANY(ARRAY(SELECT {id_name} FROM candidates)) \
         RETURNING {id} AS \"__queue_id\", {token} AS \"__queue_token\", {failures} AS \"__queue_failures\", \
         array_position(ARRAY(SELECT {id_name} FROM candidates), {id}) AS \"__queue_rank\"{returning_record}",
        sets = sets.join(", "),
        token = t.token,
    ));
    let tail = b.text;
    let params = b.params;
    let after = cursor.then(|| {
        let n = params.len() + 1;
        let mut after_params = params.clone();
        let condition = match &cursor_priority {
            Some(priority) => {
                after_params.extend([Param::CursorPriority, Param::CursorKey]);
                format!(" AND {priority} = ${n} AND {id} > ${}", n + 1)
            }
            None => {
                after_params.push(Param::CursorKey);
                format!(" AND {id} > ${n}")
            }
        };
        (condition, after_params)
    });
    ClaimStatements {
        head,
        order,
        tail,
        params,
        after,
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
    use super::super::{test_shape, Statements};
    use super::*;
    use crate::options::PgStoreOptions;

    #[test]
    fn default_claim_quotes_names_binds_values_and_spells_out_states_and_limit() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let claim = Statements::new(&options, &test_shape(), &[]).claim(&[], 32);
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
        let s = Statements::new(&options, &test_shape(), &[]);
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
            &test_shape(),
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
            let s = Statements::new(&without, &test_shape(), &[]);
            assert!(s.claim_after_cursor(32).is_none(), "{without:?}");
            assert!(!s.claim(&[], 32).text.contains("__queue_priority"));
        }
    }

    #[test]
    fn only_async_claims_turn_synchronous_commit_off() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let asynchronous = Statements::new(&options, &test_shape(), &[])
            .claim(&[], 8)
            .text;
        let durable = Statements::new(
            &options.claim_commit(ClaimCommit::Durable),
            &test_shape(),
            &[],
        )
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
        let s = Statements::new(&options, &test_shape(), &[]);
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
    fn conditions_are_numbered_after_the_claims_own_parameters() {
        let options = PgStoreOptions::new("jobs").unwrap();
        let s = Statements::new(&options, &test_shape(), &[]);
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
