//! Project automation, run as `cargo xtask <command>` (`cargo xtask help`
//! lists the commands and their flags).

mod bench;
mod dashboard_test;
mod demo;
mod faults;
mod fuzz_api;
mod pg;
mod served;
mod test_pg;
mod warnings;

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

/// Project automation.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
enum Command {
    /// Run every test against a real Postgres (DATABASE_URL, testcontainers,
    /// or a throwaway cluster from the local PostgreSQL binaries), then fuzz
    /// the HTTP API with schemathesis (a virtualenv in target/), test the
    /// dashboard in headless Chromium, and inject faults.
    TestPg {
        /// Passed on to `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_test_args: Vec<String>,
    },
    /// In both modes, stop PostgreSQL mid-drain, kill backends, SIGKILL
    /// worker processes or hold the connection slots, and check that nothing
    /// is lost and the drain recovers (clusters of its own); with several
    /// schedulers, that each occurrence is enqueued once.
    Faults {
        /// Which: restart, backend-kills, worker-kills, slots-held,
        /// schedulers (all without one).
        faults: Vec<String>,
    },
    /// The dashboard's browser test alone.
    Dashboard {
        /// Where the screenshots go (default target/dashboard-shots).
        #[arg(long)]
        screenshots: Option<PathBuf>,
    },
    /// On a throwaway Postgres, run a worker over jobs and print a summary.
    Demo(demo::Args),
    /// Measure throughput, wake latency, memory and table growth against
    /// pgbench's ceiling (and peer queues with --peers); the full run writes
    /// docs/benchmarks.md (on a machine as fast as the recorded run's).
    Bench(bench::Args),
    /// The worker process the bench's memory scenario measures.
    #[command(hide = true)]
    BenchMemoryWorker {
        /// In-flight jobs to hold.
        jobs: usize,
    },
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = Command::parse();
    let docker = matches!(
        command,
        Command::TestPg { .. } | Command::Demo(_) | Command::Bench(_)
    ) && pg::wants_docker_build();
    // Benchmarks measure optimised code.
    let release = matches!(command, Command::Bench(_)) && cfg!(debug_assertions);
    if docker || release {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut rerun = std::process::Command::new(cargo);
        rerun.args(["run", "--quiet", "--package", "xtask"]);
        if docker {
            // A Docker engine answers: run again from a build with
            // testcontainers in it.
            eprintln!("xtask: a Docker engine answers; using testcontainers");
            rerun.args(["--features", "docker"]);
        }
        if release {
            eprintln!("xtask: building in release mode for the benchmarks");
            rerun.arg("--release");
        }
        let status = rerun.arg("--").args(&args).status()?;
        std::process::exit(status.code().unwrap_or(1));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Catch Ctrl-C so that this process outlives its children and removes
    // the throwaway cluster; the children get the signal themselves.
    runtime.spawn(async {
        while tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("xtask: interrupted; cleaning up");
        }
    });
    runtime.block_on(async {
        match command {
            Command::TestPg { cargo_test_args } => test_pg::run(&cargo_test_args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Dashboard { screenshots } => dashboard_test::command(screenshots).await,
            Command::Faults { faults } => faults::run(&faults).await,
            Command::Bench(args) => bench::run(args).await,
            Command::BenchMemoryWorker { jobs } => bench::memory_worker(jobs).await,
        }
    })
}
