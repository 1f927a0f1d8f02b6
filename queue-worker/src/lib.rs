#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod budget;
mod error;
pub mod metrics;
mod pruner;
mod resetter;
mod router;
mod scheduler;
pub mod shutdown;
mod worker;

pub use crate::budget::Budget;
pub use crate::error::WorkerError;
pub use crate::pruner::{Pruner, PrunerOptions};
pub use crate::resetter::{Resetter, ResetterOptions};
pub use crate::router::Router;
pub use crate::scheduler::{CatchUp, Occurrence, Schedule, Scheduler, SchedulerOptions};
pub use crate::worker::{
    default_worker_name, Worker, WorkerOptions, WorkerReport, AT_MOST_ONCE_SHUTDOWN_MESSAGE,
};
