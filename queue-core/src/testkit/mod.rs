//! Test support for store implementations (feature `testkit`).
//!
//! - [`conformance`]: the store conformance suite, generic over [`Store`](crate::Store).
//! - [`database_url`]: where tests that need Postgres find it.
//! - [`model`]: a pure model of the store contract, for state-machine
//!   property tests.

pub mod conformance;
mod database;
pub mod model;

pub use database::database_url;
