//! The kind router: each kind reaches its own handler and hooks; an unknown
//! kind fails at once with a message naming it.

mod common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use common::{fast_options, start, wait_for_state};
use queue_core::{Handler, Job, JobContext, JobError, JobState, NewJob, Outcome};
use queue_store_memory::MemoryStore;
use queue_worker::Router;

struct Named {
    name: &'static str,
    seen: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Handler<MemoryStore> for Named {
    async fn pre_handle(&self, _: &JobContext, job: &Job) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("{} pre {}", self.name, job.id));
    }
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        self.seen
            .lock()
            .unwrap()
            .push(format!("{} handle {}", self.name, job.id));
        Ok(())
    }
    async fn post_handle(&self, _: &JobContext, job: &Job, outcome: &Outcome) {
        self.seen.lock().unwrap().push(format!(
            "{} post {} {}",
            self.name,
            job.id,
            outcome.label()
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_reach_the_handler_of_their_kind() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = Router::new()
        .route(
            "email",
            Named {
                name: "email",
                seen: seen.clone(),
            },
        )
        .route(
            "resize",
            Named {
                name: "resize",
                seen: seen.clone(),
            },
        );
    let store = MemoryStore::new();
    let email = store.enqueue(NewJob::new("email", serde_json::json!({})));
    let resize = store.enqueue(NewJob::new("resize", serde_json::json!({})));
    let unknown = store.enqueue(NewJob::new("fax", serde_json::json!({})));
    let running = start(&store, router, fast_options().handlers(1));
    wait_for_state(&store, email, JobState::Completed).await;
    wait_for_state(&store, resize, JobState::Completed).await;
    wait_for_state(&store, unknown, JobState::Failed).await;
    running.stop().await;

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "email pre 1",
            "email handle 1",
            "email post 1 completed",
            "resize pre 2",
            "resize handle 2",
            "resize post 2 completed",
        ]
    );
    assert_eq!(
        store.get(unknown).unwrap().failure_message.as_deref(),
        Some("no handler is registered for job kind \"fax\" (registered: email, resize)")
    );
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct SendEmail {
    to: String,
}

impl queue_core::JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

/// Records the addresses it was given.
struct Mailer(Arc<Mutex<Vec<String>>>);

#[async_trait]
impl queue_core::ArgsHandler<MemoryStore, SendEmail> for Mailer {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut MemoryStore,
        email: SendEmail,
    ) -> Result<(), JobError> {
        self.0.lock().unwrap().push(email.to);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_handler_gets_decoded_arguments_and_a_bad_payload_fails_with_the_decoders_message()
{
    let store = MemoryStore::new();
    let good = store.enqueue(
        NewJob::from_args(&SendEmail {
            to: "ops@example.com".into(),
        })
        .expect("encodes"),
    );
    let bad = store.enqueue(NewJob::new("send_email", serde_json::json!({"to": 42})));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let router = Router::new().args::<SendEmail>(Mailer(sent.clone()));
    let running = common::start(&store, router, common::fast_options());
    common::wait_for_state(&store, good, JobState::Completed).await;
    common::wait_for_state(&store, bad, JobState::Failed).await;
    running.stop().await;
    assert_eq!(*sent.lock().unwrap(), ["ops@example.com"]);
    let message = store
        .get(bad)
        .and_then(|j| j.failure_message)
        .unwrap_or_default();
    assert!(
        message.contains("does not decode as") && message.contains("invalid type: integer `42`"),
        "{message}"
    );
}

/// A running worker is in the registry from its start, with its router's
/// kinds, its handler slots and its name, keeps beating, and leaves the
/// registry when it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_beats_into_the_registry_with_its_kinds() {
    use queue_core::Admin;
    struct Done;
    #[async_trait]
    impl Handler<MemoryStore> for Done {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            Ok(())
        }
    }
    let store = MemoryStore::new();
    let router = Router::<MemoryStore>::new()
        .route("email", Done)
        .route("report", Done);
    let mut options = fast_options().handlers(3);
    options.name = "registry-test".into();
    let running = start(&store, router, options);
    let since = chrono::Utc::now() - chrono::TimeDelta::minutes(1);
    let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    common::eventually("the worker beat twice", || {
        let (store, seen) = (store.clone(), seen.clone());
        async move {
            let workers = Admin::workers(&store, since).await.expect("workers");
            let mut seen = seen.lock().expect("not poisoned");
            if let Some(w) = workers.first() {
                seen.insert(w.last_seen_at);
            }
            seen.len() >= 2
        }
    })
    .await;
    let workers = Admin::workers(&store, since).await.expect("workers");
    assert_eq!(workers.len(), 1, "{workers:?}");
    let w = &workers[0].beat;
    assert_eq!(w.name, "registry-test");
    assert_eq!(w.kinds, vec!["email".to_owned(), "report".to_owned()]);
    assert_eq!((w.handlers, w.in_flight), (3, 0));
    assert_eq!(w.pid, std::process::id());
    running.shutdown.cancel();
    running.task.await.expect("joined").expect("a clean stop");
    assert!(
        Admin::workers(&store, since)
            .await
            .expect("workers")
            .is_empty(),
        "a worker that stopped on purpose leaves the registry"
    );
}
