//! Errors: building options ([`OptionsError`]), and the mapping of sqlx
//! errors onto [`StoreError`].

use queue_core::StoreError;

/// A problem with [`PgStoreOptions`](crate::PgStoreOptions) found before
/// touching the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// A name cannot be a Postgres identifier.
    #[error("{name:?} cannot be used as a Postgres identifier: {problem}")]
    InvalidIdent {
        /// The name given.
        name: String,
        /// Why not.
        problem: &'static str,
    },
    /// A required column was declared absent.
    #[error("the {column} column cannot be absent: the store needs it to {why}")]
    RequiredColumn {
        /// The standard column name.
        column: &'static str,
        /// What it is needed for.
        why: &'static str,
    },
    /// Two states were mapped to the same value.
    #[error("states {first} and {second} are both mapped to the value {value:?}; each state needs its own value")]
    DuplicateStateValue {
        /// One state.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// The shared value.
        value: String,
    },
    /// Two standard columns are mapped onto one column of the table.
    #[error("columns {first} and {second} are both mapped to {name}; a statement that sets both would assign it twice. Map each to a column of its own, or declare one absent with `without(Column::..)` (in a config file: {second} = false)")]
    SharedColumn {
        /// One standard column.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// The table's column both name, quoted.
        name: String,
    },
    /// Neither a claim token nor a started_at column is available to a
    /// store that runs jobs.
    #[error(
        "a store that runs jobs needs a fencing column to tell claims apart: keep claim_token or started_at, or keep a bookkeeping table (PgStoreOptions::bookkeeping_table; in a config file, bookkeeping_table), which carries one (the admin contract and the queue CLI read the table without one)"
    )]
    NoFencingColumn,
    /// Another option is out of range.
    #[error("invalid option {option}: {problem}")]
    Invalid {
        /// The option.
        option: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl From<OptionsError> for StoreError {
    fn from(error: OptionsError) -> Self {
        StoreError::Config(error.to_string())
    }
}

/// Whether `error` says the connection itself failed (the server closed it,
/// is shutting down or restarting, or the socket broke), rather than the
/// statement: the same statement may succeed on another connection, and
/// this one is of no further use.
pub(crate) fn is_connection_fault(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            Some("57P01" | "57P02" | "57P03" | "08000" | "08003" | "08006")
        ),
        _ => false,
    }
}

/// Maps a sqlx error onto the store's error kinds: lost connections are
/// `Unavailable`, serialization failures and deadlocks `Conflict`, undefined
/// tables, columns, types and functions `Config`, the rest `Backend`.
pub(crate) fn store_error(context: &str, error: sqlx::Error) -> StoreError {
    let context = context.to_owned();
    if is_connection_fault(&error)
        || matches!(error, sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
    {
        return StoreError::Unavailable {
            context,
            source: Box::new(error),
        };
    }
    match &error {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("40001" | "40P01" | "55P03") => StoreError::Conflict {
                context,
                source: Box::new(error),
            },
            Some("42P01" | "42703" | "42704" | "42883" | "3F000") => {
                StoreError::Config(format!("{context}: {}", db.message()))
            }
            // A partitioned default table's guard (version 2).
            Some("23514")
                if db
                    .constraint()
                    .is_some_and(|c| c.ends_with("_keys_held_while_live")) =>
            {
                StoreError::Refused(format!(
                    "{context}: the table is partitioned, and Postgres keeps an index unique only within one partition, so a key cannot be held for as long as its job exists; enqueue with UniqueScope::Active (a key held while its job waits or runs)"
                ))
            }
            _ => StoreError::Backend {
                context,
                source: Box::new(error),
            },
        },
        _ => StoreError::Backend {
            context,
            source: Box::new(error),
        },
    }
}
