//! Finishes: the outcome of many attempts in one statement (each guarded
//! by its lease), of one attempt with plain parameters, and of attempts
//! that succeeded (the state and the finish time only, or a delete).

use queue_core::JobState;

use super::bookkeeping::{Side, EXPECTED_TYPES, KEY, SIDE};
use super::{failure_value, literal, unnest_unseen, unseen, Builder, Param, Statement, Target};
use crate::options::{Column, CompletedJobs};

/// The finish statements.
pub(super) struct Finish {
    pub finish: Statement,
    pub finish_one: Statement,
    pub finish_succeeded: (Statement, Statement),
}

/// What a finish sets: each value from the batch's unnested row
/// (`input.field`, `batch` naming the input) or, for one attempt, from its
/// own parameter.
fn sets(t: &Target, b: &mut Builder, batch: Option<&str>) -> String {
    let names = &t.names;
    let mut value = |one: Param, field: &str| match batch {
        Some(input) => format!("{input}.{field}"),
        None => b.p(one),
    };
    let target = value(Param::TargetState, "target");
    let mut sets = vec![format!("{} = CAST({target} AS {})", t.state_name, t.st())];
    if let (Some(n), Some(at)) = (names.get(Column::FinishedAt), names.at(Column::FinishedAt)) {
        let v = value(Param::FinishedAt, "finished_at");
        sets.push(format!("{n} = COALESCE({v}, {at})"));
    }
    if let (Some(n), Some(at)) = (
        names.get(Column::FailureMessage),
        names.at(Column::FailureMessage),
    ) {
        let v = value(Param::Message, "message");
        let attempt = names.at(Column::NumFailures).map(|f| format!("{f} + 1"));
        let v = failure_value(t.shape, &v, attempt.as_deref());
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
    if let (Some(n), Some(at)) = (
        names.get(Column::AttemptsLeft),
        names.at(Column::AttemptsLeft),
    ) {
        // Counted down by the same step the failures are counted up by.
        let v = value(Param::FailureIncrement, "failed");
        sets.push(format!("{n} = {at} - {v}"));
    }
    sets.join(", ")
}

/// What a completion sets: the completed state (`completed`, its
/// placeholder) and the finish time from `input.finished_at`.
fn completed_sets(t: &Target, completed: &str, input: &str) -> String {
    let mut sets = vec![format!(
        "{} = CAST({completed} AS {})",
        t.state_name,
        t.st()
    )];
    if let (Some(n), Some(at)) = (
        t.names.get(Column::FinishedAt),
        t.names.at(Column::FinishedAt),
    ) {
        sets.push(format!("{n} = COALESCE({input}.finished_at, {at})"));
    }
    sets.join(", ")
}

/// The fields of a batch of outcomes, in the order of [`outcome_arrays`].
const OUTCOME_FIELDS: &str = "id, token, target, finished_at, message, process_after, failed";

/// `unnest(..)` over a batch's outcome arrays (key, token, target state,
/// finish time, message, retry time, failure increment), each unseen by
/// the planner; their parameters are the builder's next seven.
fn outcome_arrays(t: &Target, b: &mut Builder) -> String {
    let keys = format!("{}[]", t.kt());
    let arrays = [
        (Param::Ids, keys.as_str()),
        (Param::Tokens, "int8[]"),
        (Param::TargetStates, "text[]"),
        (Param::FinishedAts, "timestamptz[]"),
        (Param::Messages, "text[]"),
        (Param::ProcessAfters, "timestamptz[]"),
        (Param::FailureIncrements, "int4[]"),
    ]
    .map(|(param, ty)| (b.p(param), ty));
    let arrays: Vec<(&str, &str)> = arrays.iter().map(|(p, ty)| (p.as_str(), *ty)).collect();
    unnest_unseen(&arrays)
}

pub(super) fn statements(t: &Target) -> Finish {
    if let Some(side) = &t.shape.side {
        return with_bookkeeping(t, side);
    }
    let (table, a, id) = (&t.table, &t.a, &t.id);
    let keys = format!("{}[]", t.kt());
    let mut b = Builder::default();
    let outcomes = outcome_arrays(t, &mut b);
    let processing = b.p(Param::State(JobState::Processing));
    let batch_sets = sets(t, &mut b, Some("u"));
    let guard = t.held_batch(&processing);
    b.push(&format!(
        "UPDATE {table} AS {a} SET {batch_sets} FROM {outcomes} AS u({OUTCOME_FIELDS}) \
         WHERE {guard} RETURNING {id}"
    ));
    let finish = b.build();

    let mut b = Builder::default();
    let guard = t.held(&mut b);
    let one_sets = sets(t, &mut b, None);
    b.push(&format!(
        "UPDATE {table} AS {a} SET {one_sets} WHERE {guard} RETURNING {id}"
    ));
    let finish_one = b.build();

    // Attempts that succeeded: a completion writes the state and the
    // finish time only, so it unnests three arrays instead of seven
    // (unnesting the other four took about a quarter of the statement,
    // ~1 µs a row). Or, with `CompletedJobs::Delete`, deletes the rows: the
    // same guards.
    let finish_succeeded = if t.options.completed_jobs == CompletedJobs::Delete {
        let mut b = Builder::default();
        let (ids, tokens, processing) = (
            b.p(Param::Ids),
            b.p(Param::Tokens),
            b.p(Param::State(JobState::Processing)),
        );
        let guard = t.held_batch(&processing);
        b.push(&format!(
            "DELETE FROM {table} AS {a} USING {} AS u(id, token) \
             WHERE {guard} RETURNING {id}",
            unnest_unseen(&[(&ids, &keys), (&tokens, "int8[]")]),
        ));
        let many = b.build();
        let mut b = Builder::default();
        let guard = t.held(&mut b);
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
        let sets = completed_sets(t, &completed, "u");
        let guard = t.held_batch(&processing);
        b.push(&format!(
            "UPDATE {table} AS {a} SET {sets} FROM {} \
             AS u(id, token, finished_at) WHERE {guard} RETURNING {id}",
            unnest_unseen(&[
                (&ids, &keys),
                (&tokens, "int8[]"),
                (&finished, "timestamptz[]"),
            ]),
        ));
        (b.build(), finish_one.clone())
    };
    Finish {
        finish,
        finish_one,
        finish_succeeded,
    }
}

/// The bookkeeping table's columns, in its order.
fn side_columns() -> String {
    std::iter::once(KEY.to_owned())
        .chain(EXPECTED_TYPES.iter().map(|(c, _)| format!("\"{c}\"")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `"__queue_logged" AS (..), `: puts back the bookkeeping rows `ended`
/// (a CTE returning them whole) that hold log entries, when the
/// bookkeeping table carries the log, so that a completed job's log stays
/// for operators; empty otherwise. (The same key, deleted and inserted in
/// one statement: the deleted row is the statement's own, no conflict.)
pub(super) fn keep_logged(side: &Side, ended: &str) -> String {
    if !side.carries(Column::ExecutionLogs) {
        return String::new();
    }
    let columns = side_columns();
    format!(
        "\"__queue_logged\" AS (INSERT INTO {} ({columns}) SELECT {columns} FROM {ended} \
         WHERE cardinality(\"execution_logs\") > 0), ",
        side.table
    )
}

/// The finishes of a table whose bookkeeping table carries the claim
/// token. Each first takes the attempt's bookkeeping row, by key and
/// token, with a write of its own (so a token changed meanwhile, by a
/// reset and a new claim, fails the check on the row's newest version):
/// a job that succeeded ends the row; any other keeps it, its failure
/// count raised by a failure (a retry's counts must survive, and a failed
/// job's counts and log are what an operator reads; they go with the job,
/// by purge, delete or the resetter's sweep of rows whose job is gone; a
/// completed job's row comes back if it holds log entries). Then the
/// table's row moves, if the attempt's row was taken and the job is still
/// processing.
///
/// The rows taken return the attempt's input with them, as [`SIDE`] (with
/// the failures before the attempt, for the failure's attempt number),
/// and the table's update reads that one set: joining the input and the
/// rows taken, two sets the planner sees as a few rows each, compared
/// every outcome with every row (a 500-outcome batch took 32 ms, and a
/// lease drain ran at a tenth of its rate).
fn with_bookkeeping(t: &Target, side: &Side) -> Finish {
    let (table, a, id) = (&t.table, &t.a, &t.id);
    let keys = format!("{}[]", t.kt());
    let (side_table, key) = (&side.table, KEY);
    let processing_guard = |b: &mut Builder| {
        let processing = b.p(Param::State(JobState::Processing));
        format!("{} = {}", t.state, unseen(&processing, t.st()))
    };
    // The one outcome whose row ends.
    let completed = literal(t.options.states.get(JobState::Completed));
    // Taking the attempts' rows from `u(id, token, target, failed, ..)`,
    // whose `fields` come along.
    let take = |fields: &str| {
        let carried: String = fields.split(", ").map(|f| format!(", u.{f}")).collect();
        let again: String = fields.split(", ").map(|f| format!(", {f}")).collect();
        format!(
            "\"__queue_kept\" AS (UPDATE {side_table} AS s SET \"num_failures\" = s.\"num_failures\" + u.failed \
             FROM u WHERE s.{key} = u.id AND s.\"claim_token\" = u.token AND u.target <> {completed} \
             RETURNING s.{key}, s.\"num_failures\" - u.failed AS \"num_failures\"{carried}), \
             \"__queue_ended\" AS (DELETE FROM {side_table} AS s USING u \
             WHERE s.{key} = u.id AND s.\"claim_token\" = u.token AND u.target = {completed} \
             RETURNING s.*{carried}), {}\
             {SIDE} AS (SELECT * FROM \"__queue_kept\" UNION ALL \
             SELECT {key}, \"num_failures\"{again} FROM \"__queue_ended\")",
            keep_logged(side, "\"__queue_ended\""),
        )
    };

    let mut b = Builder::default();
    let outcomes = outcome_arrays(t, &mut b);
    let batch_sets = sets(t, &mut b, Some(SIDE));
    let guard = processing_guard(&mut b);
    b.push(&format!(
        "WITH u AS (SELECT * FROM {outcomes} AS u({OUTCOME_FIELDS})), {} \
         UPDATE {table} AS {a} SET {batch_sets} FROM {SIDE} WHERE {id} = {SIDE}.{key} AND {guard} RETURNING {id}",
        take(OUTCOME_FIELDS),
    ));
    let finish = b.build();

    // One attempt: its parameters as a one-row input.
    let one = |b: &mut Builder| {
        let (i, tok, target, inc) = (
            b.p(Param::Id),
            b.p(Param::Token),
            b.p(Param::TargetState),
            b.p(Param::FailureIncrement),
        );
        format!(
            "WITH u AS (SELECT CAST({i} AS {kt}) AS id, CAST({tok} AS int8) AS token, \
             CAST({target} AS text) AS target, CAST({inc} AS int4) AS failed), {}",
            take("id, token, target, failed"),
            kt = t.kt()
        )
    };
    let mut b = Builder::default();
    let with = one(&mut b);
    let one_sets = sets(t, &mut b, None);
    let guard = processing_guard(&mut b);
    b.push(&format!(
        "{with} UPDATE {table} AS {a} SET {one_sets} FROM {SIDE} WHERE {id} = {SIDE}.{key} AND {guard} RETURNING {id}"
    ));
    let finish_one = b.build();

    // Attempts that succeeded: their rows end (one that holds log entries
    // comes back with them, for operators to read).
    let succeeded = |columns: &str, arrays: &[(&str, &str)]| {
        let carried: String = columns.split(", ").map(|f| format!(", u.{f}")).collect();
        format!(
            "WITH u AS (SELECT * FROM {} AS u({columns})), \"__queue_ended\" AS (DELETE FROM {side_table} AS s \
             USING u WHERE s.{key} = u.id AND s.\"claim_token\" = u.token RETURNING s.*{carried}), {}\
             {SIDE} AS (SELECT {key}{carried_again} FROM \"__queue_ended\")",
            unnest_unseen(arrays),
            keep_logged(side, "\"__queue_ended\""),
            carried_again = carried.replace(", u.", ", "),
        )
    };
    let finish_succeeded = if t.options.completed_jobs == CompletedJobs::Delete {
        let mut b = Builder::default();
        let (ids, tokens) = (b.p(Param::Ids), b.p(Param::Tokens));
        let with = succeeded("id, token", &[(&ids, &keys), (&tokens, "int8[]")]);
        let guard = processing_guard(&mut b);
        b.push(&format!(
            "{with} DELETE FROM {table} AS {a} USING {SIDE} WHERE {id} = {SIDE}.{key} AND {guard} RETURNING {id}"
        ));
        let many = b.build();
        let mut b = Builder::default();
        let with = one(&mut b);
        let guard = processing_guard(&mut b);
        b.push(&format!(
            "{with} DELETE FROM {table} AS {a} USING {SIDE} WHERE {id} = {SIDE}.{key} AND {guard} RETURNING {id}"
        ));
        (many, b.build())
    } else {
        let mut b = Builder::default();
        let (ids, tokens, finished, completed) = (
            b.p(Param::Ids),
            b.p(Param::Tokens),
            b.p(Param::FinishedAts),
            b.p(Param::State(JobState::Completed)),
        );
        let sets = completed_sets(t, &completed, SIDE);
        let with = succeeded(
            "id, token, finished_at",
            &[
                (&ids, &keys),
                (&tokens, "int8[]"),
                (&finished, "timestamptz[]"),
            ],
        );
        let guard = processing_guard(&mut b);
        b.push(&format!(
            "{with} UPDATE {table} AS {a} SET {sets} FROM {SIDE} WHERE {id} = {SIDE}.{key} AND {guard} RETURNING {id}"
        ));
        (b.build(), finish_one.clone())
    };
    Finish {
        finish,
        finish_one,
        finish_succeeded,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{test_shape, Statements};
    use super::*;
    use crate::options::PgStoreOptions;
    #[test]
    fn batched_statements_join_on_the_key_alone_with_inputs_the_planner_cannot_see() {
        let keep = Statements::new(&PgStoreOptions::new("jobs").unwrap(), &test_shape(), &[]);
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .completed_jobs(CompletedJobs::Delete);
        let delete = Statements::new(&options, &test_shape(), &[]);
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
        let keep = Statements::new(&PgStoreOptions::new("jobs").unwrap(), &test_shape(), &[]);
        let (many, one) = &keep.finish_succeeded;
        assert_eq!(
            &*many.text,
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
        let keep = Statements::new(&PgStoreOptions::new("jobs").unwrap(), &test_shape(), &[]);
        assert!(keep.held_complete.text().contains("UPDATE"));
        let options = PgStoreOptions::new("jobs")
            .unwrap()
            .completed_jobs(CompletedJobs::Delete);
        let delete = Statements::new(&options, &test_shape(), &[]);
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
}
