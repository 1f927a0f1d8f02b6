//! The statements of a job's own transaction (transactional mode): the
//! lock that proves the job alive, and the completion that commits with
//! the handler's writes.

use queue_core::JobState;

use super::prepared::{exactly_one, Prepared};
use super::{Builder, Param, Statement, Target};
use crate::options::{Column, CompletedJobs};

/// A job transaction's statements.
pub(super) struct JobTransaction {
    /// The lock, with bound parameters.
    pub lock: Statement,
    /// The lock, prepared: fails ([`super::prepared::NOT_HELD`]) unless it
    /// locked the claim's row.
    pub held_lock: Prepared,
    /// The completion, prepared: fails unless it completed the claim's row.
    pub held_complete: Prepared,
}

pub(super) fn statements(t: &Target) -> JobTransaction {
    let (table, a) = (&t.table, &t.a);
    // With a bookkeeping table, the guard reads the token from it.
    let from = t.from();
    let mut b = Builder::default();
    let guard = t.held(&mut b);
    // FOR KEY SHARE: proves liveness to the resetter (whose FOR UPDATE
    // skips the row) without blocking heartbeats, cancel flags and log
    // appends, which update non-key columns only.
    b.push(&format!(
        "SELECT 1 FROM {from} WHERE {guard} FOR KEY SHARE OF {a}"
    ));
    let lock = b.build();

    let mut b = Builder::default();
    let guard = t.held_literally(&mut b);
    b.push(&exactly_one(&format!(
        "(SELECT 1 FROM {from} WHERE {guard} FOR KEY SHARE OF {a}) AS \"__queue_held\""
    )));
    let held_lock = Prepared::new("lock", b.build());

    let mut b = Builder::default();
    let (guard, taken) = match &t.shape.side {
        // The attempt's bookkeeping row ends first, by key and token (the
        // check reads its newest version); the job's row moves if it was
        // this attempt's.
        Some(side) => {
            let (i, tok) = (b.p(Param::Id), b.p(Param::Token));
            let key = super::bookkeeping::KEY;
            (
                format!(
                    "{} = (SELECT {key} FROM \"__queue_taken\") AND {} = {}",
                    t.id,
                    t.state,
                    t.state_literal(JobState::Processing)
                ),
                format!(
                    "\"__queue_taken\" AS (DELETE FROM {} AS s WHERE s.{key} = {i} AND s.\"claim_token\" = {tok} \
                     RETURNING s.*), {}",
                    side.table,
                    super::finish::keep_logged(side, "\"__queue_taken\"")
                ),
            )
        }
        None => (t.held_literally(&mut b), String::new()),
    };
    let done = if t.options.completed_jobs == CompletedJobs::Delete {
        format!("DELETE FROM {table} AS {a} WHERE {guard} RETURNING 1")
    } else {
        let mut sets = vec![format!(
            "{} = {}",
            t.state_name,
            t.state_literal(JobState::Completed)
        )];
        if let Some(n) = t.names.get(Column::FinishedAt) {
            sets.push(format!("{n} = {}", b.p(Param::FinishedAt)));
        }
        format!(
            "UPDATE {table} AS {a} SET {sets} WHERE {guard} RETURNING 1",
            sets = sets.join(", ")
        )
    };
    b.push(&format!(
        "WITH {taken}\"__queue_done\" AS ({done}) {}",
        exactly_one("\"__queue_done\"")
    ));
    let held_complete = Prepared::new("complete", b.build());
    JobTransaction {
        lock,
        held_lock,
        held_complete,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{test_shape, Statements};
    use super::*;
    use crate::options::PgStoreOptions;

    #[test]
    fn job_transaction_statements_spell_out_states_and_take_key_token_and_time() {
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .state_value(JobState::Processing, "it's");
        let s = Statements::new(&options, &test_shape(), &[]);
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
}
