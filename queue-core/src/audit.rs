//! The audit log: every operator's write (from the CLI, the HTTP API, the
//! dashboard) as one entry: who, what, on which jobs, when, and how it
//! ended. Stores keep it ([`Admin::append_audit`](crate::Admin::append_audit));
//! the operator surfaces write it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most entries one read of the audit log returns.
pub const MAX_AUDIT_PAGE: usize = 1000;

/// An entry to append to the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct NewAuditEntry {
    /// Who acted: an operator's name (the CLI's `--actor`, else the OS
    /// user) or the name of the token a request presented.
    pub actor: String,
    /// What they did: `retry`, `cancel`, `fail`, `delete`, `purge`,
    /// `reset-stalled`, `enqueue`, `pause`, `resume`.
    pub action: String,
    /// On what: `{"ids": [..]}`, `{"filter": {..}}`, `{"kind": ..}`, and
    /// the action's options.
    pub target: serde_json::Value,
    /// How it ended, in the surface's words (its report, or the error).
    pub outcome: String,
    /// Whether it succeeded.
    pub ok: bool,
}

impl NewAuditEntry {
    /// `actor` did `action` on `target`, with `outcome`.
    pub fn new(
        actor: impl Into<String>,
        action: impl Into<String>,
        target: serde_json::Value,
        ok: bool,
        outcome: impl Into<String>,
    ) -> Self {
        NewAuditEntry {
            actor: actor.into(),
            action: action.into(),
            target,
            outcome: outcome.into(),
            ok,
        }
    }
}

/// One entry of the audit log: on the wire, its id and time and the
/// entry's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct AuditEntry {
    /// Its place in the log: later entries have higher ids.
    pub id: i64,
    /// When it was recorded, by the store's clock.
    pub at: DateTime<Utc>,
    /// What was recorded.
    #[serde(flatten)]
    pub entry: NewAuditEntry,
}

impl AuditEntry {
    /// Entry `id`, recorded at `at`.
    pub fn new(id: i64, at: DateTime<Utc>, entry: NewAuditEntry) -> Self {
        AuditEntry { id, at, entry }
    }
}

/// Which entries [`Admin::audit`](crate::Admin::audit) reads: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AuditParams {
    /// At most this many (capped at [`MAX_AUDIT_PAGE`]).
    pub limit: usize,
    /// Only entries before this id: the page after one that ended with it.
    pub before: Option<i64>,
    /// Only this actor's.
    pub actor: Option<String>,
}

impl AuditParams {
    /// The newest `limit` entries.
    pub fn newest(limit: usize) -> Self {
        AuditParams {
            limit: limit.min(MAX_AUDIT_PAGE),
            before: None,
            actor: None,
        }
    }

    /// Only entries before id `before`.
    pub fn before(mut self, before: Option<i64>) -> Self {
        self.before = before;
        self
    }

    /// Only `actor`'s entries.
    pub fn actor(mut self, actor: Option<String>) -> Self {
        self.actor = actor;
        self
    }
}
