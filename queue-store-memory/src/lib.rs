#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod admin;
mod clock;
mod operations;
mod store;

pub use crate::clock::ManualClock;
pub use crate::store::{MemoryCondition, MemoryStore};
