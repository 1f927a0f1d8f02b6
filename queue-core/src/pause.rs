//! Pausing a kind: its jobs stay where they are, and no worker claims them
//! until an operator resumes it ([`Admin::pause`](crate::Admin::pause)).
//!
//! A pause is kept by the store, not by a worker process: it survives
//! restarts and holds for every worker that claims from the store. Jobs of
//! a paused kind keep their place in the claim order and lose no attempt;
//! jobs already running finish as usual.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// The longest kind name a pause takes, in bytes.
pub const MAX_KIND_LEN: usize = 1000;

/// A kind whose jobs no worker claims until it is resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct PausedKind {
    /// The kind.
    pub kind: String,
    /// When it was paused, by the store's clock.
    pub since: DateTime<Utc>,
    /// Who paused it: an operator's name, a token's name, or a process.
    pub by: String,
}

impl PausedKind {
    /// `kind`, paused by `by` since `since`.
    pub fn new(kind: impl Into<String>, since: DateTime<Utc>, by: impl Into<String>) -> Self {
        PausedKind {
            kind: kind.into(),
            since,
            by: by.into(),
        }
    }
}

/// Refuses a kind no job could have, or a name of who paused it that says
/// nothing ([`StoreError::Refused`], naming the problem); the stores check
/// both before they write a pause.
pub fn check_pause(kind: &str, by: &str) -> Result<(), StoreError> {
    check_kind(kind)?;
    check_name(
        "the name of who paused the kind",
        by,
        "a pause must say who paused the kind (an operator, a token or a process name)",
    )
}

/// Refuses a kind no job could have ([`StoreError::Refused`]): empty,
/// holding a NUL character, or longer than [`MAX_KIND_LEN`].
pub fn check_kind(kind: &str) -> Result<(), StoreError> {
    check_name(
        "the kind to pause or resume",
        kind,
        "the kind to pause or resume is empty",
    )
}

/// Refuses `value` (`what`, in a message) if blank (saying `blank`), if it
/// holds a NUL character (which Postgres cannot store), or if longer than
/// [`MAX_KIND_LEN`] bytes.
fn check_name(what: &str, value: &str, blank: &str) -> Result<(), StoreError> {
    if value.trim().is_empty() {
        return Err(StoreError::Refused(blank.to_owned()));
    }
    if value.contains('\0') {
        return Err(StoreError::Refused(format!("{what} holds a NUL character")));
    }
    if value.len() > MAX_KIND_LEN {
        return Err(StoreError::Refused(format!(
            "{what} is {} bytes long; the longest a pause takes is {MAX_KIND_LEN}",
            value.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_needs_a_kind_and_someone_who_paused_it() {
        assert!(check_pause("email", "alice").is_ok());
        for (kind, by, says) in [
            ("", "alice", "empty"),
            ("email", " ", "who paused"),
            ("em\0ail", "alice", "NUL"),
            ("email", "al\0ice", "NUL"),
            (&"k".repeat(MAX_KIND_LEN + 1), "alice", "1001 bytes"),
        ] {
            let error = check_pause(kind, by).expect_err("refused").to_string();
            assert!(error.contains(says), "{error}");
        }
    }
}
