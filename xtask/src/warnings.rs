//! Counts the warnings and errors this process logs (through `tracing`),
//! by message, so that a fault run can report the noise an operator would
//! see and fail on noise that should never appear.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// By message: how many, and the `error` field of the first (an example).
type Counts = Arc<Mutex<BTreeMap<String, (usize, Option<String>)>>>;

/// The process-wide counts, once [`install`] has run.
static COUNTS: OnceLock<Counts> = OnceLock::new();

/// Installs the counter as the process's subscriber (once; later calls do
/// nothing). Events are counted, not printed.
pub fn install() {
    COUNTS.get_or_init(|| {
        let counts = Counts::default();
        let subscriber = tracing_subscriber::registry().with(Counter(counts.clone()));
        if tracing::subscriber::set_global_default(subscriber).is_err() {
            eprintln!("xtask: another tracing subscriber is installed; warnings are not counted");
        }
        counts
    });
}

/// The warnings and errors logged since the last call, by `LEVEL target:
/// message` (with the first one's error, if it had one, as an example),
/// most frequent first.
pub fn take() -> Vec<(String, usize)> {
    let Some(counts) = COUNTS.get() else {
        return Vec::new();
    };
    let taken = std::mem::take(&mut *counts.lock().unwrap_or_else(PoisonError::into_inner));
    let mut taken: Vec<(String, usize)> = taken
        .into_iter()
        .map(|(message, (n, error))| match error {
            Some(error) => (format!("{message} (first: {error})"), n),
            None => (message, n),
        })
        .collect();
    taken.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    taken
}

struct Counter(Counts);

impl<S: Subscriber> Layer<S> for Counter {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let level = *event.metadata().level();
        // More verbose levels compare greater.
        if level > Level::WARN {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let key = format!("{level} {}: {}", event.metadata().target(), fields.message);
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = counts.entry(key).or_insert((0, fields.error));
        entry.0 += 1;
    }
}

/// The event's `message` (what it is counted by) and `error` fields; the
/// others (keys, waits) differ from event to event.
#[derive(Default)]
struct Fields {
    message: String,
    error: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            "error" => self.error = Some(format!("{value:?}")),
            _ => {}
        }
    }
}
