//! Test support for store implementations (feature `testkit`).
//!
//! - [`conformance`]: the store conformance suite, generic over [`Store`](crate::Store).
//! - [`database_url`]: where tests that need Postgres find it.
//! - [`Succeeds`], [`UntilCancelled`]: handlers that do no work, for any
//!   store.
//! - [`model`]: a pure model of the store contract, for state-machine
//!   property tests.
//! - [`probe_claims`]: times claims beside the work under test.

pub mod conformance;
mod database;
mod handlers;
pub mod model;
mod probe;

pub use database::database_url;
pub use handlers::{Succeeds, UntilCancelled};
pub use probe::probe_claims;
