//! Unique jobs: how the rows an enqueue with unique keys returns (the jobs
//! it inserted, in order, then the job holding each key that was taken)
//! map back onto the jobs asked for.

use std::collections::{HashMap, HashSet};

use queue_core::{Enqueued, NewJob};

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
