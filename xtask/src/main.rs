//! Project automation, run as `cargo xtask <command>`:
//!
//! - `test-pg [cargo test args]`: every test, with a real Postgres;
//! - `demo [flags]`: runs a worker on a throwaway Postgres over thousands of
//!   jobs and prints a summary;
//! - `bench [--quick] [--peers]`: the benchmark program.

mod bench;
mod dashboard_test;
mod demo;
mod faults;
mod fuzz_api;
mod pg;
mod served;
mod test_pg;
mod warnings;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test-pg [ARGS]   run every test against a real Postgres (DATABASE_URL,
                   testcontainers, or a throwaway cluster from the local
                   PostgreSQL binaries); ARGS go to `cargo test`; then fuzz
                   the HTTP API with schemathesis (a virtualenv in target/)
                   and test the dashboard in headless Chromium
  faults [restart|backend-kills|worker-kills|slots-held]
                   in both modes, stop PostgreSQL mid-drain, kill backends,
                   SIGKILL worker processes or hold the connection slots,
                   and check that nothing is
                   lost and the drain recovers (clusters of its own)
  dashboard [--screenshots DIR]
                   the dashboard's browser test alone (screenshots to DIR,
                   default target/dashboard-shots)
  demo [FLAGS]     on a throwaway Postgres, run a worker over jobs and print
                   a summary; FLAGS: --jobs N (10000), --handlers N (16),
                   --mode lease|transactional (lease), --noop
  bench [--quick] [--peers]
                   measure throughput, wake latency, memory and table growth
                   against pgbench's ceiling (and peer queues with --peers);
                   the full run writes docs/benchmarks.md";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = args.first().map(String::as_str);
    let docker = matches!(command, Some("test-pg" | "demo" | "bench")) && pg::wants_docker_build();
    // Benchmarks measure optimised code.
    let release = command == Some("bench") && cfg!(debug_assertions);
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
    match command {
        Some("test-pg") => runtime.block_on(test_pg::run(&args[1..])),
        Some("demo") => runtime.block_on(demo::run(&args[1..])),
        Some("dashboard") => runtime.block_on(dashboard_test::command(&args[1..])),
        Some("faults") => runtime.block_on(faults::run(&args[1..])),
        Some("bench") => runtime.block_on(bench::run(&args[1..])),
        Some("bench-memory-worker") => runtime.block_on(bench::memory_worker(&args[1..])),
        Some("help" | "--help" | "-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
