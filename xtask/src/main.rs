//! Project automation, run as `cargo xtask <command>`:
//!
//! - `test-pg [cargo test args]`: every test, with a real Postgres;
//! - `demo [flags]`: runs a worker on a throwaway Postgres over thousands of
//!   jobs and prints a summary.

mod demo;
mod pg;
mod test_pg;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test-pg [ARGS]   run every test against a real Postgres (DATABASE_URL, or a
                   throwaway cluster from the local PostgreSQL binaries);
                   ARGS go to `cargo test`
  demo [FLAGS]     on a throwaway Postgres, run a worker over jobs and print
                   a summary; FLAGS: --jobs N (10000), --handlers N (16),
                   --mode lease|transactional (lease), --noop";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), Some("test-pg" | "demo"))
        && pg::wants_docker_build()
    {
        // A Docker engine answers: run this command again from a build with
        // testcontainers in it.
        eprintln!("xtask: a Docker engine answers; using testcontainers");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args([
                "run",
                "--quiet",
                "--package",
                "xtask",
                "--features",
                "docker",
                "--",
            ])
            .args(&args)
            .status()?;
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
    match args.first().map(String::as_str) {
        Some("test-pg") => runtime.block_on(test_pg::run(&args[1..])),
        Some("demo") => runtime.block_on(demo::run(&args[1..])),
        Some("help" | "--help" | "-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
