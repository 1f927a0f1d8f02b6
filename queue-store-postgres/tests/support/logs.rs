//! The messages a test's store logs at one level, captured on the test's
//! own thread (a current-thread runtime, the `#[tokio::test]` default,
//! runs the store's spawned tasks there too).

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Keeps the message of every event at `level`.
#[derive(Clone)]
pub struct Logged {
    level: tracing::Level,
    messages: Arc<Mutex<Vec<String>>>,
}

impl Logged {
    /// Captures the messages at `level` until the guard is dropped.
    pub fn at(level: tracing::Level) -> (Logged, DefaultGuard) {
        let logged = Logged {
            level,
            messages: Arc::default(),
        };
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(logged.clone()));
        (logged, guard)
    }

    /// The messages so far.
    pub fn messages(&self) -> Vec<String> {
        self.messages.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl<S: tracing::Subscriber> Layer<S> for Logged {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == self.level {
            let mut message = Message(String::new());
            event.record(&mut message);
            if let Ok(mut messages) = self.messages.lock() {
                messages.push(message.0);
            }
        }
    }
}
