//! Unique jobs: the one rule every enqueue keeps keys by, and how the
//! rows an enqueue with unique keys returns (the jobs it inserted, in
//! order, then the job holding each key that was taken) map back onto the
//! jobs asked for.
//!
//! The rule ([`Rounds`]): a statement inserts the jobs whose keys are
//! free and names the job holding each key that is not. A job whose key
//! was taken but whose holder the statement could not see (it committed
//! after the statement began, or finished meanwhile) goes into the next
//! statement, on the same connection, which sees the holder or finds the
//! key free. After [`ROUNDS`] statements the call gives up with a
//! retryable error.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use queue_core::{Enqueued, NewJob, StoreError};

/// Statements an enqueue runs before it gives up on a key whose holder
/// stays out of sight.
pub(crate) const ROUNDS: u32 = 10;

/// The statements of one enqueue with unique keys: which jobs each
/// enqueues, and each job's answer.
pub(crate) struct Rounds<'a, K> {
    jobs: &'a [NewJob],
    results: Vec<Option<Enqueued<K>>>,
    /// The jobs without an answer yet, by index.
    pending: Vec<usize>,
    run: u32,
}

impl<'a, K: Clone> Rounds<'a, K> {
    /// The enqueue of `jobs`, no statement run yet.
    pub(crate) fn new(jobs: &'a [NewJob]) -> Self {
        Rounds {
            jobs,
            results: vec![None; jobs.len()],
            pending: (0..jobs.len()).collect(),
            run: 0,
        }
    }

    /// The jobs the next statement enqueues (all of them, the first
    /// time); `None` once every job has its answer, or after [`ROUNDS`]
    /// statements.
    pub(crate) fn next_batch(&mut self) -> Option<Cow<'a, [NewJob]>> {
        if self.pending.is_empty() || self.run >= ROUNDS {
            return None;
        }
        self.run += 1;
        Some(if self.pending.len() == self.jobs.len() {
            Cow::Borrowed(self.jobs)
        } else {
            Cow::Owned(self.pending.iter().map(|i| self.jobs[*i].clone()).collect())
        })
    }

    /// Takes the answer of the statement that enqueued `batch` (the last
    /// [`Rounds::next_batch`]).
    pub(crate) fn record(&mut self, batch: &[NewJob], answers: Vec<Answer<K>>) {
        let pending = std::mem::take(&mut self.pending);
        for (i, result) in pending.into_iter().zip(align(batch, answers)) {
            match result {
                Some(result) => self.results[i] = Some(result),
                None => self.pending.push(i),
            }
        }
    }

    /// Each job's result, in order; a retryable error if a key's holder
    /// stayed out of sight for every statement.
    pub(crate) fn finish(self) -> Result<Vec<Enqueued<K>>, StoreError> {
        self.results
            .into_iter()
            .map(|r| {
                r.ok_or_else(|| StoreError::Conflict {
                    context: UNSEEN_HOLDER.into(),
                    source: format!(
                        "the job holding the key stayed out of sight for {ROUNDS} statements"
                    )
                    .into(),
                })
            })
            .collect()
    }
}

/// One row of a unique enqueue's answer.
#[derive(Debug, Clone)]
pub(crate) struct Answer<K> {
    pub id: K,
    pub key: Option<String>,
    pub inserted: bool,
}

/// Each job's result, in order. `None` where the job's key was taken but
/// the statement saw no job holding it: the holder committed after the
/// statement began, or finished meanwhile. Enqueue those jobs again (a new
/// statement sees the holder, or finds the key free).
pub(crate) fn align<K: Clone>(
    jobs: &[NewJob],
    answers: Vec<Answer<K>>,
) -> Vec<Option<Enqueued<K>>> {
    let mut keyless = answers
        .iter()
        .filter(|a| a.key.is_none())
        .map(|a| a.id.clone());
    let by_key: HashMap<&str, Enqueued<K>> = answers
        .iter()
        .filter_map(|a| {
            let key = a.key.as_deref()?;
            Some((
                key,
                Enqueued {
                    id: a.id.clone(),
                    inserted: a.inserted,
                },
            ))
        })
        .collect();
    let mut seen: HashSet<&str> = HashSet::new();
    jobs.iter()
        .map(|job| match &job.unique {
            None => keyless.next().map(|id| Enqueued { id, inserted: true }),
            Some(unique) => {
                let first = seen.insert(unique.key.as_str());
                by_key.get(unique.key.as_str()).map(|e| Enqueued {
                    id: e.id.clone(),
                    // A later job of the same call with the key: the first
                    // one took it.
                    inserted: e.inserted && first,
                })
            }
        })
        .collect()
}

/// The context of the error when a key's holder stays out of sight.
pub(crate) const UNSEEN_HOLDER: &str =
    "enqueueing a unique job: the job holding its key committed or finished while the enqueue ran; enqueue it again";

#[cfg(test)]
mod tests {
    use super::*;
    use queue_core::UniqueScope;

    fn job(key: Option<&str>) -> NewJob {
        let job = NewJob::new("k", serde_json::json!(null));
        match key {
            Some(key) => job.unique(key, UniqueScope::Active),
            None => job,
        }
    }

    fn answer(id: i64, key: Option<&str>, inserted: bool) -> Answer<i64> {
        Answer {
            id,
            key: key.map(str::to_owned),
            inserted,
        }
    }

    /// A job whose key's holder a statement did not see goes into the
    /// next statement alone, and gets that statement's answer; one whose
    /// holder never shows up ends in a retryable error.
    #[test]
    fn rounds_enqueue_again_only_the_jobs_without_an_answer() {
        let jobs = [job(Some("a")), job(Some("b")), job(None)];
        let mut rounds = Rounds::new(&jobs);
        let first = rounds.next_batch().expect("a first statement");
        assert_eq!(first.len(), 3);
        // a inserted, b's holder unseen, the keyless job inserted.
        rounds.record(
            &first,
            vec![answer(1, Some("a"), true), answer(2, None, true)],
        );
        let second = rounds.next_batch().expect("a second statement");
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].unique.as_ref().map(|u| u.key.as_str()), Some("b"));
        rounds.record(&second, vec![answer(9, Some("b"), false)]);
        assert!(rounds.next_batch().is_none(), "every job has its answer");
        let got: Vec<(i64, bool)> = rounds
            .finish()
            .expect("answered")
            .into_iter()
            .map(|e| (e.id, e.inserted))
            .collect();
        assert_eq!(got, [(1, true), (9, false), (2, true)]);

        let jobs = [job(Some("gone"))];
        let mut rounds: Rounds<i64> = Rounds::new(&jobs);
        let mut statements = 0;
        while let Some(batch) = rounds.next_batch() {
            statements += 1;
            rounds.record(&batch, Vec::new());
        }
        assert_eq!(statements, ROUNDS);
        assert!(matches!(rounds.finish(), Err(StoreError::Conflict { .. })));
    }

    #[test]
    fn results_follow_the_jobs_asked_for() {
        let jobs = [
            job(None),
            job(Some("a")),
            job(Some("b")),
            job(None),
            job(Some("a")),
            job(Some("c")),
        ];
        // Inserted in order: 10 (no key), 11 (a), 12 (no key); b is held
        // by 7; c's holder was not seen.
        let answers = vec![
            answer(10, None, true),
            answer(11, Some("a"), true),
            answer(12, None, true),
            answer(7, Some("b"), false),
        ];
        let got: Vec<Option<(i64, bool)>> = align(&jobs, answers)
            .into_iter()
            .map(|e| e.map(|e| (e.id, e.inserted)))
            .collect();
        assert_eq!(
            got,
            [
                Some((10, true)),
                Some((11, true)),
                Some((7, false)),
                Some((12, true)),
                Some((11, false)),
                None
            ]
        );
    }
}
