//! Arguments shared by several commands: the job filter and times.

use anyhow::{anyhow, bail, Result};
use chrono::{DateTime, TimeDelta, Utc};
use queue_core::{JobFilter, JobState};

use crate::serve::TextAdmin;

/// Which jobs a command looks at; every option given must hold.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Only jobs in these states: standard names (queued, processing,
    /// completed, errored, failed, canceled) or the table's own values.
    /// Repeat, or separate with commas.
    #[arg(long = "state", value_name = "STATE", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Only jobs of these kinds. Repeat, or separate with commas.
    #[arg(long = "kind", value_name = "KIND", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Only jobs whose failure message contains this text (any case).
    #[arg(long, value_name = "TEXT")]
    pub failure_contains: Option<String>,
    /// Only jobs whose payload contains this JSON (as jsonb's @>), such as
    /// '{"customer": 42}'.
    #[arg(long, value_name = "JSON", value_parser = json_value)]
    pub payload: Option<serde_json::Value>,
    /// Only the job holding this unique key.
    #[arg(long, value_name = "KEY")]
    pub unique_key: Option<String>,
    /// Only jobs last claimed by this worker (its name, as in `show`).
    #[arg(long, value_name = "NAME")]
    pub worker: Option<String>,
    /// Only jobs running for longer than this (processing, their attempt
    /// started that long ago), such as 10m.
    #[arg(long, value_name = "DURATION", value_parser = age, conflicts_with = "states")]
    pub running_longer_than: Option<TimeDelta>,
    /// Only jobs enqueued at or after this time (RFC 3339, or an age such
    /// as 2h for two hours ago).
    #[arg(long, value_name = "TIME", value_parser = past)]
    pub queued_after: Option<DateTime<Utc>>,
    /// Only jobs enqueued before this time.
    #[arg(long, value_name = "TIME", value_parser = past)]
    pub queued_before: Option<DateTime<Utc>>,
    /// Only jobs that finished at or after this time.
    #[arg(long, value_name = "TIME", value_parser = past)]
    pub finished_after: Option<DateTime<Utc>>,
    /// Only jobs that finished before this time.
    #[arg(long, value_name = "TIME", value_parser = past)]
    pub finished_before: Option<DateTime<Utc>>,
}

impl FilterArgs {
    /// Whether no option was given (the filter admits every job).
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
            && self.kinds.is_empty()
            && self.failure_contains.is_none()
            && self.payload.is_none()
            && self.unique_key.is_none()
            && self.worker.is_none()
            && self.running_longer_than.is_none()
            && self.queued_after.is_none()
            && self.queued_before.is_none()
            && self.finished_after.is_none()
            && self.finished_before.is_none()
    }

    /// The options given, as JSON (what the audit log records of a
    /// filter).
    pub fn describe(&self) -> serde_json::Value {
        let mut given = serde_json::Map::new();
        let mut put = |name: &str, value: serde_json::Value| {
            if !value.is_null() {
                given.insert(name.to_owned(), value);
            }
        };
        let list = |l: &Vec<String>| {
            if l.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::json!(l)
            }
        };
        put("states", list(&self.states));
        put("kinds", list(&self.kinds));
        put("failure_contains", serde_json::json!(self.failure_contains));
        put("payload", serde_json::json!(self.payload));
        put("unique_key", serde_json::json!(self.unique_key));
        put("worker", serde_json::json!(self.worker));
        put(
            "running_longer_than_secs",
            serde_json::json!(self.running_longer_than.map(|d| d.num_seconds())),
        );
        put("queued_after", serde_json::json!(self.queued_after));
        put("queued_before", serde_json::json!(self.queued_before));
        put("finished_after", serde_json::json!(self.finished_after));
        put("finished_before", serde_json::json!(self.finished_before));
        serde_json::Value::Object(given)
    }

    /// The filter, with state names read in the store's vocabulary.
    pub fn to_filter(&self, admin: &TextAdmin) -> Result<JobFilter> {
        let mut states = Vec::new();
        for name in &self.states {
            for state in states_named(admin, name)? {
                if !states.contains(&state) {
                    states.push(state);
                }
            }
        }
        let mut filter = JobFilter::default();
        filter.states = (!self.states.is_empty()).then_some(states);
        filter.kinds = (!self.kinds.is_empty()).then(|| self.kinds.clone());
        filter.queued_from = self.queued_after;
        filter.queued_before = self.queued_before;
        filter.finished_from = self.finished_after;
        filter.finished_before = self.finished_before;
        filter.failure_contains = self.failure_contains.clone();
        if let Some(running) = self.running_longer_than {
            filter = filter.running_since_before(Utc::now() - running);
        }
        filter.payload_contains = self.payload.clone();
        filter.unique_key = self.unique_key.clone();
        filter.worker = self.worker.clone();
        Ok(filter)
    }
}

/// The states `name` stands for: the states the table stores as `name`
/// (several where values are shared), else the standard state of that name.
pub fn states_named(admin: &TextAdmin, name: &str) -> Result<Vec<JobState>> {
    states_named_in(|s| admin.stored_state(s), name)
}

/// [`states_named`] for a store that writes each state as `stored`.
pub fn states_named_in(stored: impl Fn(JobState) -> String, name: &str) -> Result<Vec<JobState>> {
    let matching: Vec<JobState> = JobState::ALL
        .into_iter()
        .filter(|s| stored(*s) == name)
        .collect();
    if !matching.is_empty() {
        return Ok(matching);
    }
    if let Some(state) = JobState::ALL.into_iter().find(|s| s.as_str() == name) {
        return Ok(vec![state]);
    }
    let known: Vec<String> = JobState::ALL
        .into_iter()
        .map(|s| {
            let value = stored(s);
            if value == s.as_str() {
                value
            } else {
                format!("{value} ({s})")
            }
        })
        .collect();
    bail!(
        "unknown state {name:?}; the states are {}",
        known.join(", ")
    )
}

/// JSON given on the command line.
pub fn json_value(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| anyhow!("{text:?} is not JSON: {e}"))
}

/// A time in the past: RFC 3339, or an age (`90s`, `2h`, `30d`) before now.
pub fn past(text: &str) -> Result<DateTime<Utc>> {
    time(text, -1)
}

/// A time in the future: RFC 3339, or a delay (`10m`) after now.
pub fn future(text: &str) -> Result<DateTime<Utc>> {
    time(text, 1)
}

fn time(text: &str, sign: i32) -> Result<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let span = match humantime::parse_duration(text) {
        Ok(_) => age(text)?,
        Err(_) => bail!(
            "{text:?} is neither an RFC 3339 time (2026-11-24T10:00:00Z) nor a duration (90s, 2h, 30d)"
        ),
    };
    let now = Utc::now();
    let at = if sign < 0 {
        now.checked_sub_signed(span)
    } else {
        now.checked_add_signed(span)
    };
    at.ok_or_else(|| anyhow!("{text:?} from now is out of range"))
}

/// The longest age or delay accepted: 1000 years. Now plus or minus it
/// stays well within the times chrono and Postgres both hold (a longer one,
/// such as 300000y, would overflow them).
const LONGEST_YEARS: u64 = 1000;

/// A duration such as `30d` or `1h 30m`, at most 1000 years.
pub fn age(text: &str) -> Result<TimeDelta> {
    let duration = age_std(text)?;
    TimeDelta::from_std(duration).map_err(|_| anyhow!("{text:?} is too long a duration"))
}

/// [`age`] as a `std::time::Duration`.
pub fn age_std(text: &str) -> Result<std::time::Duration> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| anyhow!("{text:?} is not a duration such as 90s, 2h or 30d: {e}"))?;
    within_range(duration).map_err(|e| anyhow!("{text:?}: {e}"))
}

/// `duration`, refused past [`LONGEST_YEARS`].
pub fn within_range(duration: std::time::Duration) -> Result<std::time::Duration> {
    const YEAR_SECS: u64 = 31_557_600; // 365.25 days
    if duration.as_secs() > LONGEST_YEARS * YEAR_SECS {
        bail!(
            "{} is out of range: ages and delays go up to {LONGEST_YEARS} years",
            humantime::format_duration(duration)
        );
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use queue_store_memory::MemoryStore;

    #[test]
    fn times_are_rfc_3339_or_an_age() {
        let at = past("2026-11-24T10:00:00Z").unwrap();
        assert_eq!(at.to_rfc3339(), "2026-11-24T10:00:00+00:00");
        let two_hours_ago = past("2h").unwrap();
        let delta = Utc::now() - two_hours_ago;
        assert!((delta.num_seconds() - 7200).abs() < 5, "{delta}");
        assert!(future("10m").unwrap() > Utc::now());
        let err = past("yesterday").unwrap_err().to_string();
        assert!(err.contains("neither an RFC 3339 time"), "{err}");
    }

    #[test]
    fn an_unknown_state_lists_the_known_ones() {
        let store = crate::serve::Erased(MemoryStore::new());
        assert_eq!(states_named(&store, "failed").unwrap(), [JobState::Failed]);
        let err = states_named(&store, "pending").unwrap_err().to_string();
        assert!(err.contains("unknown state \"pending\""), "{err}");
        assert!(err.contains("queued, processing"), "{err}");
    }
}
