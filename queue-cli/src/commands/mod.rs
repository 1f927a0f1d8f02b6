//! One module per group of commands.

pub mod audit;
pub mod bulk;
pub mod enqueue;
pub mod limits;
pub mod maintenance;
pub mod migrate;
pub mod ops;
pub mod pause;
pub mod read;
