#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod admin;
mod bind;
pub mod bookkeeping;
mod clock_offset;
mod completer;
mod conditions;
#[cfg(feature = "config")]
mod config;
mod cursor;
#[cfg(any(feature = "diesel", feature = "diesel-async"))]
mod diesel_enqueue;
mod enqueue;
mod error;
mod ident;
mod job_table;
mod job_transaction;
mod key_type;
pub mod kinds;
mod listen;
mod migrate;
mod options;
mod partitions;
mod record;
mod ride;
mod sql;
mod stash;
mod statistics;
mod store;
mod unique;

pub use crate::admin::PgAdmin;
pub use crate::conditions::{PgArg, PgCondition, PgConditions};
#[cfg(feature = "config")]
pub use crate::config::{
    CatchUpConfig, ColumnSetting, ColumnsConfig, ConfigError, CursorSetting, NamedToken, PgConfig,
    ResetterConfig, ScheduleConfig, ServeConfig, StatesConfig, TokenRole,
};
pub use crate::error::OptionsError;
pub use crate::ident::{Ident, QualifiedName};
pub use crate::job_table::{ConnectionOrPool, JobTable};
pub use crate::job_transaction::PgJobTransaction;
pub use crate::key_type::PgKeyType;
pub use crate::migrate::{migrate_beside, migrations_beside, Migration};
pub use crate::options::{
    ClaimCommit, Column, CompletedJobs, ExecutionMode, PgStoreOptions, StateValues,
};
pub use crate::partitions::FinishPartitions;
pub use crate::record::{decode_job, Decoder, PgKey};
pub use crate::store::PgStore;

/// The Rust in `docs/*.md` and the workspace README, compiled and run as doctests so that the guides
/// cannot drift from the code (blocks that need a database are `no_run`).
#[cfg(doctest)]
mod docs {
    #[doc = include_str!("../../docs/existing-tables.md")]
    struct ExistingTables;
    #[doc = include_str!("../../docs/cli.md")]
    struct Cli;
    #[doc = include_str!("../../docs/job-lifecycle.md")]
    struct JobLifecycle;
    #[doc = include_str!("../../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../../docs/enqueue.md")]
    struct Enqueue;
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[cfg(all(feature = "diesel", feature = "diesel-async"))]
    #[doc = include_str!("../../docs/diesel.md")]
    struct Diesel;
}
