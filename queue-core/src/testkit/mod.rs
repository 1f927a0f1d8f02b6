//! Test support for store implementations (feature `testkit`).
//!
//! - [`conformance`]: the store conformance suite, generic over [`Store`](crate::Store).
//! - [`model`]: a pure model of the store contract, for state-machine
//!   property tests.

pub mod conformance;
pub mod model;
