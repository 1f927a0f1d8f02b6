//! The figures of a big table against a full recount, as a property: after
//! any mix of enqueues (ready and scheduled), claims, completions,
//! retryable errors, failures, cancels (of running jobs by their worker,
//! of waiting ones by an operator), operator retries, deletes and purges,
//!
//! - the figures `stats` reads on a table past `exact_counts_below` count
//!   every waiting and running job exactly (through the claim's indexes)
//!   and mark every finished figure as an estimate;
//! - `stats` with `exact` equals a `GROUP BY` over the table, none marked;
//! - both give the same oldest claimable time and stalled count;
//! - and after every step, every row's finish and due times agree with
//!   its state (`JobState::times_agree`), as the indexes of a table that
//!   tells states apart by those times need.
//!
//! The table holds 2,000 old completed jobs of another kind, analyzed, so
//! that the planner puts it past the threshold of 1,000. A failure shrinks
//! to a short list of readable `Op`s.

mod support;

use std::collections::BTreeMap;

use chrono::{TimeDelta, Utc};
use proptest::prelude::*;
use queue_core::{
    Admin, ClaimParams, Claimed, Delivery, Job, JobFilter, JobState, NewJob, PurgeParams,
    QueueStats, ResetParams, RetryParams, StatsParams, Store, Targets, Transition, WriteResult,
};
use queue_store_postgres::{ExecutionMode, JobTable, PgAdmin, PgStore};
use sqlx::PgPool;
use support::{execute, fresh_table, pool};

const KINDS: [&str; 2] = ["a", "b"];

#[derive(Debug, Clone)]
enum Op {
    Enqueue { kind: usize, scheduled: bool },
    Claim { limit: usize },
    Complete { nth: usize },
    RetryableError { nth: usize },
    Fail { nth: usize },
    CancelRunning { nth: usize },
    CancelWaiting { kind: usize },
    RetryFinished { kind: usize },
    Delete { newest: bool },
    Purge,
    ForceFail { kind: usize },
    ResetStalled { max_resets: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, any::<bool>()).prop_map(|(kind, scheduled)| Op::Enqueue { kind, scheduled }),
        3 => (1..4usize).prop_map(|limit| Op::Claim { limit }),
        2 => (0..4usize).prop_map(|nth| Op::Complete { nth }),
        1 => (0..4usize).prop_map(|nth| Op::RetryableError { nth }),
        1 => (0..4usize).prop_map(|nth| Op::Fail { nth }),
        1 => (0..4usize).prop_map(|nth| Op::CancelRunning { nth }),
        1 => (0..2usize).prop_map(|kind| Op::CancelWaiting { kind }),
        1 => (0..2usize).prop_map(|kind| Op::RetryFinished { kind }),
        1 => any::<bool>().prop_map(|newest| Op::Delete { newest }),
        1 => Just(Op::Purge),
        1 => (0..2usize).prop_map(|kind| Op::ForceFail { kind }),
        1 => (0..2u32).prop_map(|max_resets| Op::ResetStalled { max_resets }),
    ]
}

/// One case: a fresh table, padded and analyzed, the ops run on it.
struct Case {
    pool: PgPool,
    table: JobTable,
    store: PgStore<Job>,
    admin: PgAdmin<i64>,
    held: Vec<Claimed<PgStore<Job>>>,
}

impl Case {
    async fn new(pool: &PgPool) -> Case {
        let table = fresh_table(pool).await;
        let t = table.name().quoted();
        execute(
            pool,
            format!(
                "INSERT INTO {t} (kind, state, queued_at, started_at, finished_at) \
                 SELECT 'old', 'completed', now() - interval '2 days', now() - interval '2 days', \
                 now() - interval '2 days' FROM generate_series(1, 2000)"
            ),
        )
        .await;
        execute(pool, format!("ANALYZE {t}")).await;
        let options = table
            .store_options()
            .mode(ExecutionMode::Lease)
            .exact_counts_below(1_000);
        let store = PgStore::<Job>::default_table(pool.clone(), options.clone())
            .await
            .expect("a store");
        let admin = PgAdmin::<i64>::new(pool.clone(), options)
            .await
            .expect("an admin");
        Case {
            pool: pool.clone(),
            table,
            store,
            admin,
            held: Vec::new(),
        }
    }

    fn take(&mut self, nth: usize) -> Option<Claimed<PgStore<Job>>> {
        if self.held.is_empty() {
            return None;
        }
        let i = nth % self.held.len();
        Some(self.held.remove(i))
    }

    async fn end(&mut self, nth: usize, transition: Transition) {
        if let Some(claimed) = self.take(nth) {
            let written = self
                .store
                .finish(claimed.job_store, &claimed.lease, transition, Utc::now())
                .await
                .expect("a finish");
            // Stale when an operator deleted the running job meanwhile.
            assert!(
                matches!(written, WriteResult::Applied | WriteResult::Stale),
                "{written:?}"
            );
        }
    }

    async fn run(&mut self, op: &Op) {
        let now = Utc::now();
        match op {
            Op::Enqueue { kind, scheduled } => {
                let mut job = NewJob::new(KINDS[*kind], serde_json::json!(null));
                if *scheduled {
                    job = job.process_after(now + TimeDelta::hours(1));
                }
                self.admin.enqueue(&[job]).await.expect("an enqueue");
            }
            Op::Claim { limit } => {
                let claimed = self
                    .store
                    .claim(ClaimParams {
                        limit: *limit,
                        worker: "w",
                        conditions: None,
                        now,
                    })
                    .await
                    .expect("a claim");
                self.held.extend(claimed);
            }
            Op::Complete { nth } => self.end(*nth, Transition::Complete).await,
            Op::RetryableError { nth } => {
                let transition = Transition::Retry {
                    message: "again".into(),
                    retry_at: now - TimeDelta::seconds(1),
                };
                self.end(*nth, transition).await;
            }
            Op::Fail { nth } => {
                let transition = Transition::Fail {
                    message: "boom".into(),
                };
                self.end(*nth, transition).await;
            }
            Op::CancelRunning { nth } => {
                let transition = Transition::Cancel {
                    message: "stop".into(),
                };
                self.end(*nth, transition).await;
            }
            Op::CancelWaiting { kind } => {
                let waiting = JobFilter::default()
                    .kinds([KINDS[*kind]])
                    .states([JobState::Queued, JobState::Errored]);
                self.admin
                    .cancel(&Targets::matching(waiting, 100))
                    .await
                    .expect("a cancel");
            }
            Op::RetryFinished { kind } => {
                let finished = JobFilter::default()
                    .kinds([KINDS[*kind]])
                    .states([JobState::Failed, JobState::Canceled]);
                self.admin
                    .retry(&Targets::matching(finished, 100), RetryParams::default())
                    .await
                    .expect("a retry");
            }
            Op::Delete { newest } => {
                let t = self.table.name().quoted();
                let order = if *newest { "DESC" } else { "ASC" };
                let id: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT id FROM {t} WHERE kind <> 'old' ORDER BY id {order} LIMIT 1"
                )))
                .fetch_optional(&self.pool)
                .await
                .expect("a job to delete");
                if let Some(id) = id {
                    self.admin.delete(&Targets::id(id)).await.expect("a delete");
                }
            }
            Op::Purge => {
                let finished = vec![JobState::Completed, JobState::Failed, JobState::Canceled];
                let params = PurgeParams::new(finished, now + TimeDelta::hours(1), 1_000)
                    .from(Some(now - TimeDelta::hours(1)));
                self.admin.purge(&params).await.expect("a purge");
            }
            Op::ForceFail { kind } => {
                let unfinished = JobFilter::default().kinds([KINDS[*kind]]).states([
                    JobState::Queued,
                    JobState::Errored,
                    JobState::Processing,
                ]);
                self.admin
                    .force_fail(&Targets::matching(unfinished, 100), "stuck")
                    .await
                    .expect("a force-fail");
            }
            Op::ResetStalled { max_resets } => {
                // Every running job counts as stalled; its holder's late
                // finish is then stale.
                let params = ResetParams {
                    stalled_before: now + TimeDelta::hours(1),
                    max_resets: *max_resets,
                    delivery: Delivery::AtLeastOnce,
                    now,
                };
                self.admin.reset(params).await.expect("a reset");
            }
        }
    }

    /// The rows whose finish and due times disagree with their state
    /// (`JobState::times_agree`, spelled in SQL).
    async fn times_disagreeing(&self) -> Vec<(i64, String)> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, state FROM {} WHERE {} ORDER BY id",
            self.table.name().quoted(),
            support::TIMES_DISAGREE
        )))
        .fetch_all(&self.pool)
        .await
        .expect("a read of the times")
    }

    /// Jobs per (stored state, kind), counted by `GROUP BY`.
    async fn recount(&self) -> BTreeMap<(String, String), u64> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT state, kind, count(*) FROM {} GROUP BY state, kind",
            self.table.name().quoted()
        )))
        .fetch_all(&self.pool)
        .await
        .expect("a recount");
        rows.into_iter()
            .map(|(state, kind, n)| ((state, kind), n as u64))
            .collect()
    }
}

/// The figures by (stored state, kind), with whether each is estimated.
fn figures(stats: &QueueStats) -> BTreeMap<(String, String), (u64, bool)> {
    stats
        .counts
        .iter()
        .map(|c| {
            let kind = c.kind.clone().unwrap_or_default();
            ((c.stored_state.clone(), kind), (c.count, c.estimated))
        })
        .collect()
}

async fn check(pool: &PgPool, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut case = Case::new(pool).await;
    for (step, op) in ops.iter().enumerate() {
        case.run(op).await;
        let disagreeing = case.times_disagreeing().await;
        prop_assert!(
            disagreeing.is_empty(),
            "after step {} ({:?}) these rows' times disagree with their state: {:?}",
            step,
            op,
            disagreeing
        );
    }
    let now = Utc::now();
    let params = StatsParams::new(now, now - TimeDelta::minutes(5));
    let truth = case.recount().await;
    let exact = case
        .admin
        .stats(params.exact())
        .await
        .expect("exact figures");
    let counted: BTreeMap<_, _> = figures(&exact)
        .into_iter()
        .filter(|(_, (n, _))| *n > 0)
        .collect();
    let expected: BTreeMap<_, _> = truth
        .iter()
        .map(|(k, n)| (k.clone(), (*n, false)))
        .collect();
    prop_assert_eq!(&counted, &expected, "exact figures against the recount");

    let cheap = case.admin.stats(params).await.expect("the figures");
    let cheap_figures = figures(&cheap);
    for state in ["queued", "errored", "processing"] {
        for kind in KINDS {
            let key = (state.to_owned(), kind.to_owned());
            let truth = truth.get(&key).copied().unwrap_or(0);
            let found = cheap_figures.get(&key).copied().unwrap_or((0, false));
            prop_assert_eq!(found, (truth, false), "{} jobs of kind {}", state, kind);
        }
    }
    for ((state, kind), (_, estimated)) in &cheap_figures {
        if ["completed", "failed", "canceled"].contains(&state.as_str()) {
            prop_assert!(
                *estimated,
                "finished figure {}/{} is marked estimated",
                state,
                kind
            );
        }
    }
    prop_assert_eq!(
        (cheap.oldest_claimable_since, cheap.stalled),
        (exact.oldest_claimable_since, exact.stalled),
        "the oldest claimable time and the stalled count"
    );
    drop(case.held);
    Ok(())
}

#[test]
fn the_figures_of_a_big_table_match_a_recount() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let Some(pool) = runtime.block_on(pool("the_figures_of_a_big_table_match_a_recount")) else {
        return;
    };
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..40))| {
        runtime.block_on(check(&pool, &ops))?;
    });
}
