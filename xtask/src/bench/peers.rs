//! The peer job queues (graphile_worker, sqlxmq, apalis, awa), built from
//! `bench/peers` and run on the same server, over the same plain (not TLS)
//! connections as this queue's: their drains and wake-ups, and the
//! head-to-heads with graphile_worker, the fastest of them at 16 handlers.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{ensure, Context, Result};
use sqlx::PgPool;

use super::alternating::rotating;
use super::drain::{drain, StoreSetup, LEASE, LEASE_DELETING};
use super::report::{rows, Results};
use super::Sizes;
use crate::pg::Postgres;

/// The peer benchmarks' package, built (their own target directory inside
/// the workspace's, reused across runs).
pub(super) struct Peers {
    cargo: String,
    manifest: PathBuf,
    target: PathBuf,
}

/// How graphile_worker's cold drain is run: the flags of the peer
/// program's `--cold`. A user meets it with none of them; each can make it
/// faster.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct GraphileCold {
    /// Its `init()` (pool, schema check) before the clock starts.
    pub init_before_clock: bool,
    /// Its pool's size; 40 when `None`.
    pub max_pg_conn: Option<u32>,
    /// `ANALYZE` of its jobs table before the clock starts.
    pub analyze: bool,
}

impl GraphileCold {
    /// As a user first meets it: `init()` inside the clock, a pool of 40,
    /// no statistics on the freshly filled table.
    pub const AS_MET: GraphileCold = GraphileCold {
        init_before_clock: false,
        max_pg_conn: None,
        analyze: false,
    };

    /// graphile_worker at its best (see docs/benchmarks.md, "Cold start"):
    /// the statistics this queue's store gathers for itself at
    /// start-up, inside its clock, given to graphile_worker outside its
    /// clock, with its `init()` outside the clock too and a pool of 20.
    pub const BEST: GraphileCold = GraphileCold {
        init_before_clock: true,
        max_pg_conn: Some(20),
        analyze: true,
    };

    fn args(&self) -> Vec<String> {
        let mut args = vec!["--cold".to_owned()];
        if self.init_before_clock {
            args.push("--init-before-clock".to_owned());
        }
        if let Some(n) = self.max_pg_conn {
            args.extend(["--max-pg-conn".to_owned(), n.to_string()]);
        }
        if self.analyze {
            args.push("--analyze".to_owned());
        }
        args
    }
}

/// One figure a peer run printed.
pub(super) struct PeerRow {
    pub peer: String,
    pub scenario: String,
    pub value: f64,
    pub unit: &'static str,
    pub note: String,
}

impl Peers {
    pub(super) async fn build() -> Result<Peers> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let peers = Peers {
            cargo: std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
            manifest: root.join("../bench/peers/Cargo.toml"),
            target: root.join("../target/peers"),
        };
        println!("peers: building {}", peers.manifest.display());
        // Offline: with DATABASE_URL set, sqlx's macros in the peers would
        // check their queries against our database instead of the data
        // they ship.
        let build = tokio::process::Command::new(&peers.cargo)
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(&peers.manifest)
            .env("CARGO_TARGET_DIR", &peers.target)
            .env_remove("DATABASE_URL")
            .env("SQLX_OFFLINE", "true")
            .status()
            .await?;
        ensure!(build.success(), "building the peer benchmarks failed");
        Ok(peers)
    }

    /// Runs the peers (`only`: one of them) on `pg`; `wake_jobs` 0 skips
    /// the wake scenario; `cold`: graphile_worker's cold drain alone.
    pub(super) async fn run(
        &self,
        pg: &Postgres,
        jobs: usize,
        wake_jobs: usize,
        only: Option<&str>,
        cold: Option<GraphileCold>,
    ) -> Result<Vec<PeerRow>> {
        let mut args = vec![
            "--jobs".to_owned(),
            jobs.to_string(),
            "--wake-jobs".to_owned(),
            wake_jobs.to_string(),
        ];
        if let Some(peer) = only {
            args.extend(["--only".to_owned(), peer.to_owned()]);
        }
        if let Some(cold) = cold {
            args.extend(cold.args());
        }
        let stdout = self.run_args(pg, &args).await?;
        peer_rows(&stdout)
    }
}

/// `peer`'s row of `scenario` among `rows`, or an error that says the
/// peer printed none.
pub(super) fn peer_row<'a>(rows: &'a [PeerRow], peer: &str, scenario: &str) -> Result<&'a PeerRow> {
    rows.iter()
        .find(|r| r.peer == peer && r.scenario == scenario)
        .with_context(|| format!("{peer} printed no {scenario:?} figure"))
}

/// The figures the peers' program printed, one a line:
/// `peer<TAB>scenario<TAB>value<TAB>unit<TAB>note`.
pub(super) fn peer_rows(stdout: &str) -> Result<Vec<PeerRow>> {
    let mut rows = Vec::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        if let [peer, scenario, value, unit, note] = fields[..] {
            rows.push(PeerRow {
                peer: peer.to_owned(),
                scenario: scenario.to_owned(),
                value: value
                    .parse()
                    .with_context(|| format!("bad figure in {line:?}"))?,
                unit: match unit {
                    "jobs/s" => "jobs/s",
                    "ms" => "ms",
                    _ => "",
                },
                note: note.to_owned(),
            });
        }
    }
    Ok(rows)
}

impl Peers {
    /// Runs the peers' program with `args` on `pg`; its standard output.
    pub(super) async fn run_args(&self, pg: &Postgres, args: &[String]) -> Result<String> {
        let out = tokio::process::Command::new(self.target.join("release/queue-bench-peers"))
            .args(args)
            .env("DATABASE_URL", &pg.url)
            .stderr(Stdio::inherit())
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            out.status.success(),
            "the peer benchmarks failed:\n{stdout}"
        );
        Ok(stdout)
    }

    /// graphile_worker's drain of `jobs` jobs at 16 handlers, prepared like
    /// the project's or `cold`; jobs per second.
    pub(super) async fn graphile_drain(
        &self,
        pg: &Postgres,
        jobs: usize,
        cold: Option<GraphileCold>,
    ) -> Result<f64> {
        let scenario = if cold.is_some() {
            "cold drain, 16 handlers"
        } else {
            "drain, 16 handlers"
        };
        let rows = self.run(pg, jobs, 0, Some("graphile_worker"), cold).await?;
        Ok(peer_row(&rows, "graphile_worker", scenario)?.value)
    }
}

/// Runs the peer benchmarks (a separate cargo package) and adds their rows;
/// returns the built peers for the head-to-heads.
pub(super) async fn run_peers(
    pg: &Postgres,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<Peers> {
    let peers = Peers::build().await?;
    for row in peers
        .run(pg, sizes.drain_jobs, sizes.wake_jobs, None, None)
        .await?
    {
        results.add(
            "peer",
            format!("{}: {}", row.peer, row.scenario),
            row.value,
            row.unit,
            row.note,
        );
    }
    Ok(peers)
}

/// The lease drain (16 handlers, keeping and deleting completed jobs, on
/// the default table as released and laid out for claims in place) and
/// graphile_worker's, one after the other for a few rounds (one in a quick
/// run): the machine's speed drifts by a fifth within minutes, and
/// alternating makes the drift hit all three alike ([`rotating`]). Medians.
pub(super) async fn head_to_head(
    peers: &Peers,
    pg: &Postgres,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let jobs = sizes.drain_jobs;
    let in_place = |setup: StoreSetup| StoreSetup {
        in_place: true,
        ..setup
    };
    let [theirs, ours, ours_deleting, ours_in_place, ours_in_place_deleting] =
        rotating("head-to-head", sizes.rounds, move |which| async move {
            let setup = match which {
                0 => return peers.graphile_drain(pg, jobs, None).await,
                1 => LEASE,
                2 => LEASE_DELETING,
                3 => in_place(LEASE),
                _ => in_place(LEASE_DELETING),
            };
            Ok(drain(pool, setup, 16, jobs).await?.jobs_per_second)
        })
        .await?;
    results.add_median("versus", rows::VERSUS_OURS, "jobs/s", &ours);
    results.add_median("versus", rows::VERSUS_DELETING, "jobs/s", &ours_deleting);
    results.add_median("versus", rows::VERSUS_IN_PLACE, "jobs/s", &ours_in_place);
    results.add_median(
        "versus",
        rows::VERSUS_IN_PLACE_DELETING,
        "jobs/s",
        &ours_in_place_deleting,
    );
    results.add_median("versus", rows::VERSUS_PEER, "jobs/s", &theirs);
    Ok(())
}
