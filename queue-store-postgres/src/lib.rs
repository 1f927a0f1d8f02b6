#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
