//! The registry of live worker processes: each worker says, every
//! heartbeat, who it is and how busy ([`Store::beat`](crate::Store::beat)),
//! and operator surfaces list those seen lately
//! ([`Admin::workers`](crate::Admin::workers)). A worker that stops
//! beating ages out.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a worker process says of itself on each beat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct WorkerBeat {
    /// Its name (unique per process: by default host and pid).
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The kinds its handler runs; empty for any.
    pub kinds: Vec<String>,
    /// How many jobs it runs at once at most.
    pub handlers: u32,
    /// How many jobs it holds now (running or prefetched).
    pub in_flight: u32,
    /// When it started.
    pub started_at: DateTime<Utc>,
}

impl WorkerBeat {
    /// A beat of worker `name` on `host`, process `pid`.
    pub fn new(name: impl Into<String>, host: impl Into<String>, pid: u32) -> Self {
        WorkerBeat {
            name: name.into(),
            host: host.into(),
            pid,
            kinds: Vec::new(),
            handlers: 0,
            in_flight: 0,
            started_at: Utc::now(),
        }
    }

    /// Running `kinds`.
    pub fn kinds(mut self, kinds: Vec<String>) -> Self {
        self.kinds = kinds;
        self
    }

    /// With `handlers` slots, `in_flight` of them taken.
    pub fn load(mut self, handlers: u32, in_flight: u32) -> Self {
        self.handlers = handlers;
        self.in_flight = in_flight;
        self
    }

    /// Started at `at`.
    pub fn started_at(mut self, at: DateTime<Utc>) -> Self {
        self.started_at = at;
        self
    }
}

/// A worker the registry has heard from: on the wire, its beat's fields
/// and `last_seen_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct WorkerInfo {
    /// Its last beat.
    #[serde(flatten)]
    pub beat: WorkerBeat,
    /// When the store received it, by the store's clock.
    pub last_seen_at: DateTime<Utc>,
}

impl WorkerInfo {
    /// `beat`, received at `last_seen_at`.
    pub fn new(beat: WorkerBeat, last_seen_at: DateTime<Utc>) -> Self {
        WorkerInfo { beat, last_seen_at }
    }
}
