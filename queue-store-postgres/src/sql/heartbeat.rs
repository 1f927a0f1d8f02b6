//! What a running job writes besides its outcome: heartbeats (which also
//! tell the worker which leases still hold and which were cancelled) and
//! execution-log entries.

use queue_core::JobState;

use super::{unnest_unseen, unseen, Builder, Param, Statement, Target};
use crate::options::Column;

/// Reports which leases still hold (and their cancel flag), and bumps the
/// heartbeat of those no transaction has locked (a locked row is alive by
/// its lock).
pub(super) fn heartbeat(t: &Target) -> Statement {
    let (table, a, id, state, token) = (&t.table, &t.a, &t.id, &t.state, &t.token);
    let mut b = Builder::default();
    let (ids, tokens, processing) = (
        b.p(Param::Ids),
        b.p(Param::Tokens),
        b.p(Param::State(JobState::Processing)),
    );
    let cancel = t.names.at(Column::Cancel).unwrap_or_else(|| "false".into());
    // Its inputs [`unseen`], as in the batched finishes.
    let leases = unnest_unseen(&[(&ids, &format!("{}[]", t.kt())), (&tokens, "int8[]")]);
    let processing = unseen(&processing, t.st());
    let from = t.from();
    b.push(&format!(
        "WITH leases AS (SELECT * FROM {leases} AS l(id, token)), \
         held AS (SELECT {id} AS id, ({cancel}) IS TRUE AS cancel FROM {from} JOIN leases l ON {id} = l.id \
         WHERE {state} = {processing} AND {token} = l.token)"
    ));
    if let Some(n) = t.names.get(Column::LastHeartbeatAt) {
        let now = b.p(Param::Now);
        b.push(&format!(
            ", bumped AS (UPDATE {table} AS {a} SET {n} = {now} WHERE {id} IN (\
             SELECT {id} FROM {from} JOIN leases l ON {id} = l.id \
             WHERE {state} = {processing} AND {token} = l.token FOR NO KEY UPDATE OF {a} SKIP LOCKED))"
        ));
    } else if let (Some(side), Some(n)) = (&t.shape.side, t.names.side(Column::LastHeartbeatAt)) {
        // The bookkeeping rows of the leases (a row a finish is taking is
        // skipped: that attempt is ending). By key and token alone, the
        // shape of the table's own heartbeat: a first form whose locking
        // subquery also read `held` left a heartbeat spinning at full CPU
        // for minutes in a 100,000-job drain (cause not pinned down).
        let now = b.p(Param::Now);
        b.push(&format!(
            ", bumped AS (UPDATE {side_table} AS s SET {n} = {now} WHERE s.{key} IN (\
             SELECT o.{key} FROM {side_table} AS o JOIN leases l ON o.{key} = l.id \
             WHERE o.\"claim_token\" = l.token FOR NO KEY UPDATE OF o SKIP LOCKED))",
            side_table = side.table,
            key = super::bookkeeping::KEY,
        ));
    }
    b.push(" SELECT id, cancel FROM held");
    b.build()
}

/// Appends an entry to a running job's execution log; `None` without a
/// log column.
pub(super) fn append_log(t: &Target) -> Option<Statement> {
    if let (Some(side), Some(n)) = (&t.shape.side, t.names.side(Column::ExecutionLogs)) {
        // Into the attempt's bookkeeping row, while its job processes.
        let mut b = Builder::default();
        let (i, tok, entry, processing) = (
            b.p(Param::Id),
            b.p(Param::Token),
            b.p(Param::Entry),
            b.p(Param::State(JobState::Processing)),
        );
        let key = super::bookkeeping::KEY;
        b.push(&format!(
            "UPDATE {side_table} AS s SET {n} = array_append(s.{n}, CAST({entry} AS jsonb)) \
             FROM {table} AS {a} WHERE s.{key} = {i} AND s.\"claim_token\" = {tok} AND {id} = s.{key} \
             AND {state} = CAST({processing} AS {st})",
            side_table = side.table,
            table = t.table,
            a = t.a,
            id = t.id,
            state = t.state,
            st = t.st(),
        ));
        return Some(b.build());
    }
    t.names.get(Column::ExecutionLogs).map(|n| {
        let mut b = Builder::default();
        let guard = t.held(&mut b);
        let entry = b.p(Param::Entry);
        let at = t.names.must(Column::ExecutionLogs);
        b.push(&format!(
            "UPDATE {table} AS {a} SET {n} = array_append(COALESCE({at}, '{{}}'), CAST({entry} AS {el})) WHERE {guard}",
            table = t.table,
            a = t.a,
            el = t.shape.log_element,
        ));
        b.build()
    })
}
