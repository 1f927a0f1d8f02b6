//! [`PgConfig`]: the store's options read from a TOML file (feature
//! `config`), so that an operator tool can be pointed at any table without
//! code. Names are checked while the file is read, so every mistake is
//! reported with the file, line and column of the key that holds it.
//!
//! ```
//! use queue_store_postgres::{Column, PgConfig, PgKeyType};
//!
//! let config = PgConfig::parse(
//!     "tasks.toml",
//!     r#"
//!     schema = "app"
//!     table = "tasks"
//!     key_type = "uuid"
//!     mode = "lease"
//!
//!     [columns]
//!     id = "task_id"
//!     state = "status"
//!     execution_logs = false
//!
//!     [states]
//!     queued = "pending"
//!     processing = "running"
//!     completed = "done"
//!
//!     [resetter]
//!     stalled_max_age = "2m"
//!     "#,
//! )?;
//! let options = config.store_options()?;
//! assert_eq!(options.table_name().quoted(), "\"app\".\"tasks\"");
//! assert_eq!(options.column_name(Column::Id).unwrap().as_str(), "task_id");
//! assert!(options.column_name(Column::ExecutionLogs).is_none());
//! assert_eq!(config.key_type, Some(PgKeyType::Uuid));
//! assert_eq!(config.resetter.stalled_max_age, Some(std::time::Duration::from_secs(120)));
//!
//! let err = PgConfig::parse("tasks.toml", "table = \"tasks\"\n[colums]\nid = \"x\"\n").unwrap_err();
//! assert!(err.to_string().starts_with("tasks.toml:2:"), "{err}");
//! assert!(err.to_string().contains("colums"), "{err}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;
use std::time::Duration;

use queue_core::{Delivery, JobState};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::ident::Ident;
use crate::job_table::JobTable;
use crate::key_type::PgKeyType;
use crate::options::{ClaimCommit, Column, CompletedJobs, ExecutionMode, PgStoreOptions};

/// A problem with a config file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the config file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a key or value is wrong; the message
    /// starts with `file:line:column:`.
    #[error("{0}")]
    Invalid(String),
}

/// How a standard column is mapped: a name, its standard name (`true`), or
/// absent (`false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnSetting {
    /// The table's own name for it.
    Named(Ident),
    /// The standard name.
    Standard,
    /// The table lacks it; the features that need it are off.
    Absent,
}

impl<'de> Deserialize<'de> for ColumnSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Setting;
        impl Visitor<'_> for Setting {
            type Value = ColumnSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a column name, or false for a column the table lacks")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<ColumnSetting, E> {
                Ident::new(name)
                    .map(ColumnSetting::Named)
                    .map_err(E::custom)
            }
            fn visit_bool<E: de::Error>(self, present: bool) -> Result<ColumnSetting, E> {
                Ok(if present {
                    ColumnSetting::Standard
                } else {
                    ColumnSetting::Absent
                })
            }
        }
        deserializer.deserialize_any(Setting)
    }
}

impl<'de> Deserialize<'de> for Ident {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ident::new(name).map_err(de::Error::custom)
    }
}

/// The `[columns]` table: each standard column's name in the table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ColumnsConfig {
    pub id: Option<ColumnSetting>,
    pub state: Option<ColumnSetting>,
    pub kind: Option<ColumnSetting>,
    pub payload: Option<ColumnSetting>,
    pub priority: Option<ColumnSetting>,
    pub failure_message: Option<ColumnSetting>,
    pub queued_at: Option<ColumnSetting>,
    pub started_at: Option<ColumnSetting>,
    pub finished_at: Option<ColumnSetting>,
    pub process_after: Option<ColumnSetting>,
    pub num_resets: Option<ColumnSetting>,
    pub num_failures: Option<ColumnSetting>,
    pub last_heartbeat_at: Option<ColumnSetting>,
    pub execution_logs: Option<ColumnSetting>,
    pub worker_hostname: Option<ColumnSetting>,
    pub cancel: Option<ColumnSetting>,
    pub claim_token: Option<ColumnSetting>,
    pub unique_key: Option<ColumnSetting>,
    pub unique_forever: Option<ColumnSetting>,
    pub max_attempts: Option<ColumnSetting>,
    pub expires_at: Option<ColumnSetting>,
    pub at_most_once: Option<ColumnSetting>,
    pub attempts_left: Option<ColumnSetting>,
}

impl ColumnsConfig {
    /// Each standard column with its setting, if the file gives one.
    pub fn settings(&self) -> [(Column, Option<&ColumnSetting>); 23] {
        [
            (Column::Id, self.id.as_ref()),
            (Column::State, self.state.as_ref()),
            (Column::Kind, self.kind.as_ref()),
            (Column::Payload, self.payload.as_ref()),
            (Column::Priority, self.priority.as_ref()),
            (Column::FailureMessage, self.failure_message.as_ref()),
            (Column::QueuedAt, self.queued_at.as_ref()),
            (Column::StartedAt, self.started_at.as_ref()),
            (Column::FinishedAt, self.finished_at.as_ref()),
            (Column::ProcessAfter, self.process_after.as_ref()),
            (Column::NumResets, self.num_resets.as_ref()),
            (Column::NumFailures, self.num_failures.as_ref()),
            (Column::LastHeartbeatAt, self.last_heartbeat_at.as_ref()),
            (Column::ExecutionLogs, self.execution_logs.as_ref()),
            (Column::WorkerHostname, self.worker_hostname.as_ref()),
            (Column::Cancel, self.cancel.as_ref()),
            (Column::ClaimToken, self.claim_token.as_ref()),
            (Column::UniqueKey, self.unique_key.as_ref()),
            (Column::UniqueForever, self.unique_forever.as_ref()),
            (Column::MaxAttempts, self.max_attempts.as_ref()),
            (Column::ExpiresAt, self.expires_at.as_ref()),
            (Column::AtMostOnce, self.at_most_once.as_ref()),
            (Column::AttemptsLeft, self.attempts_left.as_ref()),
        ]
    }
}

/// The `[states]` table: the value each state is stored as.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct StatesConfig {
    pub queued: Option<String>,
    pub processing: Option<String>,
    pub completed: Option<String>,
    pub errored: Option<String>,
    pub failed: Option<String>,
    pub canceled: Option<String>,
    /// The value expired jobs end in, if not failed's
    /// ([`PgStoreOptions::expired_state_value`]).
    pub expired: Option<String>,
}

impl StatesConfig {
    fn values(&self) -> [(JobState, Option<&String>); 6] {
        [
            (JobState::Queued, self.queued.as_ref()),
            (JobState::Processing, self.processing.as_ref()),
            (JobState::Completed, self.completed.as_ref()),
            (JobState::Errored, self.errored.as_ref()),
            (JobState::Failed, self.failed.as_ref()),
            (JobState::Canceled, self.canceled.as_ref()),
        ]
    }
}

/// The `[resetter]` table: how stalled jobs are judged and treated, for
/// the tools that reset them or count them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetterConfig {
    /// A processing job whose heartbeat is older than this is stalled.
    #[serde(default, with = "humantime_serde")]
    pub stalled_max_age: Option<Duration>,
    /// Resets a job may have before it fails instead.
    pub max_resets: Option<u32>,
    /// `at_least_once` or `at_most_once`.
    pub delivery: Option<Delivery>,
}

/// One `[[schedules]]` entry: a periodic job that `queue serve` enqueues
/// (`queue_worker::Schedule`). Exactly one of `cron` and `every`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The schedule's name (part of each job's unique key).
    pub name: String,
    /// A cron expression (five fields, or six with seconds first).
    pub cron: Option<String>,
    /// The cron expression's time zone: `UTC` (default), a fixed offset
    /// such as `+02:00`, or an IANA name such as `Europe/Berlin`.
    pub zone: Option<String>,
    /// A fixed interval instead, such as `5m` (aligned to the Unix epoch).
    #[serde(default, with = "humantime_serde")]
    pub every: Option<Duration>,
    /// The job's kind.
    pub kind: String,
    /// The job's payload (any TOML value, as JSON); default `{}`.
    pub payload: Option<serde_json::Value>,
    /// The job's priority; default 0.
    pub priority: Option<i32>,
    /// After downtime: `skip` (default) or `once`.
    pub catch_up: Option<CatchUpConfig>,
}

/// What a configured schedule does about occurrences missed while no
/// scheduler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUpConfig {
    /// Skip them.
    Skip,
    /// Run the latest of them once.
    Once,
}

/// The `[serve]` table: the settings of `queue serve`, the HTTP API.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Where to listen, such as `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// Bearer tokens that may read and write.
    #[serde(default)]
    pub admin_tokens: Vec<String>,
    /// Bearer tokens that may only read.
    #[serde(default)]
    pub read_tokens: Vec<String>,
    /// Bearer tokens that may read and make the everyday repairs
    /// (enqueue, retry, cancel, pause, resume).
    #[serde(default)]
    pub operate_tokens: Vec<String>,
    /// Named tokens, each with a role (`[[serve.tokens]]`): the name is
    /// what the audit log records as who acted.
    #[serde(default)]
    pub tokens: Vec<NamedToken>,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: Option<usize>,
}

/// A bearer token of `queue serve` with a name and a role
/// (`[[serve.tokens]]` in the config file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToken {
    /// Who acts with it, as the audit log records it: `ci`, `alice`.
    pub name: String,
    /// What it may do.
    pub role: TokenRole,
    /// The token (at least 16 characters).
    pub token: String,
}

/// What a token of `queue serve` may do; each role may do what the ones
/// before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenRole {
    /// Read only.
    Read,
    /// Read, and enqueue, retry, cancel, pause and resume.
    Operate,
    /// Everything: also delete and force-fail.
    Admin,
}

/// A claim cursor setting: a duration, or `false` for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorSetting(pub Option<Duration>);

impl<'de> Deserialize<'de> for CursorSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Setting;
        impl Visitor<'_> for Setting {
            type Value = CursorSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"10ms\", or false")
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<CursorSetting, E> {
                humantime::parse_duration(value)
                    .map(|d| CursorSetting(Some(d)))
                    .map_err(E::custom)
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<CursorSetting, E> {
                if on {
                    Err(E::custom(
                        "give the rescan interval, such as \"10ms\", or false",
                    ))
                } else {
                    Ok(CursorSetting(None))
                }
            }
        }
        deserializer.deserialize_any(Setting)
    }
}

/// A queue's configuration as a TOML file holds it: the database, the
/// table and how its columns and states map, the store's settings, and the
/// resetter's. Every key is optional; an empty file means the default
/// table (`public.queue_jobs`). See `docs/cli.md` for the reference.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgConfig {
    /// The database URL (a command-line flag or `DATABASE_URL` come first).
    pub database_url: Option<String>,
    /// The table's schema; default `public`.
    pub schema: Option<Ident>,
    /// The table; default `queue_jobs`.
    pub table: Option<Ident>,
    /// A view the workers read records through.
    pub view: Option<Ident>,
    /// The view's schema, if not the table's.
    pub view_schema: Option<Ident>,
    /// A table purged jobs move to instead of being deleted (in the
    /// table's schema); see [`PgStoreOptions::archive_table`].
    pub archive_table: Option<Ident>,
    /// The alias of the table in SQL expressions.
    pub alias: Option<Ident>,
    /// The workers' select list (SQL).
    pub select: Option<String>,
    /// The claim order (SQL).
    pub order_by: Option<String>,
    /// The key column's type; read from the catalog when not given.
    pub key_type: Option<PgKeyType>,
    /// `transactional` or `lease`.
    pub mode: Option<ExecutionMode>,
    /// The LISTEN/NOTIFY channel.
    pub channel: Option<String>,
    /// Lease mode: how long outcomes gather before a batched write.
    #[serde(default, with = "humantime_serde")]
    pub completion_delay: Option<Duration>,
    /// The claim cursor's rescan interval, or `false` for none.
    pub claim_cursor: Option<CursorSetting>,
    /// How long a job's lock may wait to ride on another commit.
    #[serde(default, with = "humantime_serde")]
    pub lock_rides: Option<Duration>,
    /// How long one operator read may run (default 10 s); see
    /// [`PgStoreOptions::admin_read_timeout`].
    #[serde(default, with = "humantime_serde")]
    pub admin_read_timeout: Option<Duration>,
    /// Where the figures stop counting and estimate; see
    /// [`PgStoreOptions::exact_counts_below`].
    pub exact_counts_below: Option<u64>,
    /// `async` or `durable`.
    pub claim_commit: Option<ClaimCommit>,
    /// `keep` or `delete`.
    pub completed_jobs: Option<CompletedJobs>,
    /// Whether job transactions use statements prepared in SQL.
    pub prepared_job_statements: Option<bool>,
    /// The bookkeeping table for what the table lacks
    /// ([`PgStoreOptions::bookkeeping_table`]).
    pub bookkeeping_table: Option<Ident>,
    /// Its schema, if not the table's.
    pub bookkeeping_schema: Option<Ident>,
    /// Where a JSON failure column keeps the message: keys joined by dots
    /// (`"error"`, `"error.message"`); default `"message"`.
    pub failure_message_path: Option<String>,
    /// The columns.
    #[serde(default)]
    pub columns: ColumnsConfig,
    /// The state values.
    #[serde(default)]
    pub states: StatesConfig,
    /// The resetter's settings.
    #[serde(default)]
    pub resetter: ResetterConfig,
    /// `queue serve`'s settings.
    #[serde(default)]
    pub serve: ServeConfig,
    /// Periodic jobs `queue serve` enqueues.
    #[serde(default)]
    pub schedules: Vec<ScheduleConfig>,
}

/// `file:line:column` of a byte offset.
fn position(origin: &str, text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{origin}:{line}:{column}")
}

impl PgConfig {
    /// Reads the config in `text`; `origin` (the file name) starts every
    /// error message.
    pub fn parse(origin: &str, text: &str) -> Result<PgConfig, ConfigError> {
        toml::from_str(text).map_err(|e: toml::de::Error| {
            let at = e
                .span()
                .map(|span| position(origin, text, span.start))
                .unwrap_or_else(|| origin.to_owned());
            ConfigError::Invalid(format!("{at}: {}", e.message().trim_end()))
        })
    }

    /// Reads the config file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<PgConfig, ConfigError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: origin.clone(),
            source,
        })?;
        PgConfig::parse(&origin, &text)
    }

    /// Whether the file describes the default table (nothing remapped), so
    /// that `queue migrate` may create or migrate it.
    pub fn is_default_table(&self) -> bool {
        self.columns
            .settings()
            .iter()
            .all(|(_, s)| s.is_none_or(|s| *s == ColumnSetting::Standard))
            && self.states.values().iter().all(|(_, v)| v.is_none())
            && self.states.expired.is_none()
            && self.view.is_none()
            && self.select.is_none()
    }

    /// The default table this config names (for migrations).
    pub fn job_table(&self) -> Result<JobTable, ConfigError> {
        let schema = self.schema.as_ref().map_or("public", |s| s.as_str());
        let table = self.table.as_ref().map_or("queue_jobs", |t| t.as_str());
        JobTable::new(schema, table).map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// The store's options.
    pub fn store_options(&self) -> Result<PgStoreOptions, ConfigError> {
        let invalid =
            |key: &str, e: crate::OptionsError| ConfigError::Invalid(format!("{key}: {e}"));
        let mut options = self.job_table()?.store_options();
        if let Some(view) = &self.view {
            options = match &self.view_schema {
                Some(schema) => options.view_in(schema.as_str(), view.as_str()),
                None => options.view(view.as_str()),
            }
            .map_err(|e| invalid("view", e))?;
        }
        if let Some(archive) = &self.archive_table {
            options = options
                .archive_table(archive.as_str())
                .map_err(|e| invalid("archive_table", e))?;
        }
        if let Some(alias) = &self.alias {
            options = options
                .alias(alias.as_str())
                .map_err(|e| invalid("alias", e))?;
        }
        if let Some(select) = &self.select {
            options = options.select(select.clone());
        }
        if let Some(order) = &self.order_by {
            options = options.order_by(order.clone());
        }
        for (column, setting) in self.columns.settings() {
            let key = format!("columns.{}", column.standard_name());
            options = match setting {
                None | Some(ColumnSetting::Standard) => options,
                Some(ColumnSetting::Named(name)) => options
                    .column(column, name.as_str())
                    .map_err(|e| invalid(&key, e))?,
                Some(ColumnSetting::Absent) => {
                    options.without(column).map_err(|e| invalid(&key, e))?
                }
            };
        }
        if let Some(side) = &self.bookkeeping_table {
            options = match &self.bookkeeping_schema {
                Some(schema) => options.bookkeeping_table_in(schema.as_str(), side.as_str()),
                None => options.bookkeeping_table(side.as_str()),
            }
            .map_err(|e| invalid("bookkeeping_table", e))?;
        } else if self.bookkeeping_schema.is_some() {
            return Err(ConfigError::Invalid(
                "bookkeeping_schema: set bookkeeping_table too (the schema alone names no table)"
                    .into(),
            ));
        }
        if let Some(path) = &self.failure_message_path {
            options = options
                .failure_message_path(path.split('.'))
                .map_err(|e| invalid("failure_message_path", e))?;
        }
        for (state, value) in self.states.values() {
            if let Some(value) = value {
                options = options.state_value(state, value.clone());
            }
        }
        if let Some(expired) = &self.states.expired {
            options = options.expired_state_value(expired.clone());
        }
        if let Some(mode) = self.mode {
            options = options.mode(mode);
        }
        if let Some(channel) = &self.channel {
            options = options.channel(channel.clone());
        }
        if let Some(delay) = self.completion_delay {
            options = options.completion_delay(delay);
        }
        if let Some(cursor) = self.claim_cursor {
            options = options.claim_cursor(cursor.0);
        }
        if let Some(limit) = self.admin_read_timeout {
            options = options.admin_read_timeout(Some(limit));
        }
        if let Some(rows) = self.exact_counts_below {
            options = options.exact_counts_below(rows);
        }
        if let Some(wait) = self.lock_rides {
            options = options.lock_rides(Some(wait));
        }
        if let Some(commit) = self.claim_commit {
            options = options.claim_commit(commit);
        }
        if let Some(completed) = self.completed_jobs {
            options = options.completed_jobs(completed);
        }
        if let Some(prepared) = self.prepared_job_statements {
            options = options.prepared_job_statements(prepared);
        }
        options
            .check()
            .map_err(|e| ConfigError::Invalid(format!("states: {e}")))?;
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_default_table() {
        let config = PgConfig::parse("q.toml", "").unwrap();
        assert!(config.is_default_table());
        let options = config.store_options().unwrap();
        assert_eq!(options.table_name().quoted(), "\"public\".\"queue_jobs\"");
        assert_eq!(options.execution_mode(), ExecutionMode::Transactional);
    }

    #[test]
    fn mistakes_name_the_file_line_and_key() {
        let cases = [
            ("table = \"t\"\nmode = \"leased\"\n", "q.toml:2:8", "leased"),
            ("[columns]\nstate = \"\"\n", "q.toml:2:9", "empty"),
            (
                "[columns]\nstatus = \"s\"\n",
                "q.toml:2:1",
                "unknown field `status`",
            ),
            (
                "[resetter]\nstalled_max_age = \"30 parsecs\"\n",
                "q.toml:2:19",
                "expected a duration",
            ),
            ("key_type = \"float\"\n", "q.toml:1:12", "float"),
            ("claim_cursor = true\n", "q.toml:1:16", "false"),
            ("table = [\n", "q.toml:1:", "unclosed array"),
        ];
        for (text, at, what) in cases {
            let err = PgConfig::parse("q.toml", text).unwrap_err().to_string();
            assert!(err.starts_with(at), "{text:?}: {err}");
            assert!(err.contains(what), "{text:?}: {err}");
        }
    }

    #[test]
    fn an_option_the_store_refuses_names_its_key() {
        let config = PgConfig::parse("q.toml", "[columns]\nstate = false\n").unwrap();
        let err = config.store_options().unwrap_err().to_string();
        assert!(err.starts_with("columns.state:"), "{err}");
        let config = PgConfig::parse("q.toml", "[states]\nfailed = \"queued\"\n").unwrap();
        let err = config.store_options().unwrap_err().to_string();
        assert!(err.contains("queued and failed"), "{err}");
    }

    #[test]
    fn a_failure_message_path_is_keys_joined_by_dots() {
        let config =
            PgConfig::parse("q.toml", "failure_message_path = \"error.message\"\n").unwrap();
        let options = config.store_options().unwrap();
        assert_eq!(options.failure_message_path, ["error", "message"]);
        let config = PgConfig::parse("q.toml", "failure_message_path = \"at\"\n").unwrap();
        let err = config.store_options().unwrap_err().to_string();
        assert!(
            err.starts_with("failure_message_path:") && err.contains("failed attempt's time"),
            "{err}"
        );
        let config = PgConfig::parse("q.toml", "failure_message_path = \"error.\"\n").unwrap();
        let err = config.store_options().unwrap_err().to_string();
        assert!(err.contains("a key of the path is empty"), "{err}");
    }

    #[test]
    fn a_remapped_table_is_not_the_default_table() {
        for text in [
            "[columns]\nid = \"task_id\"\n",
            "[states]\nqueued = \"new\"\n",
            "view = \"v\"\n",
        ] {
            assert!(
                !PgConfig::parse("q.toml", text).unwrap().is_default_table(),
                "{text}"
            );
        }
        assert!(
            PgConfig::parse("q.toml", "table = \"jobs\"\n[columns]\nid = true\n")
                .unwrap()
                .is_default_table()
        );
    }
}
