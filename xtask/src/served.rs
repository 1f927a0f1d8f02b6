//! `queue serve` as a child of xtask: the binary built for the profile
//! asked, started on a free loopback port, stopped when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{ensure, Context, Result};

/// The target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Builds the `queue` binary (`release` or debug) and returns its path.
pub fn queue_binary(release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--quiet", "-p", "queue-cli", "--bin", "queue"]);
    if release {
        build.arg("--release");
    }
    ensure!(
        build.status()?.success(),
        "building the queue binary failed"
    );
    Ok(target_dir()
        .join(if release { "release" } else { "debug" })
        .join("queue"))
}

/// Starts `queue serve` (this profile's binary) on `table`, with a config
/// file of that name in the target directory naming it.
pub fn serve_table(
    url: &str,
    table: &queue_store_postgres::JobTable,
    config_name: &str,
) -> Result<Served> {
    let binary = queue_binary(!cfg!(debug_assertions))?;
    let config = target_dir().join(config_name);
    std::fs::write(
        &config,
        format!(
            "schema = {:?}\ntable = {:?}\n",
            table.name().schema.as_str(),
            table.name().name.as_str()
        ),
    )?;
    start(&binary, url, &config, &[])
}

/// A running `queue serve`.
pub struct Served {
    child: Child,
    /// Where it listens: `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `binary --config config serve` on the database at `url`, with
/// `env` set, on a free loopback port.
pub fn start(binary: &Path, url: &str, config: &Path, env: &[(&str, &str)]) -> Result<Served> {
    let mut command = Command::new(binary);
    command
        .env("DATABASE_URL", url)
        .env_remove("QUEUE_CONFIG")
        .arg("--config")
        .arg(config)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().context("starting queue serve")?;
    let stdout = child.stdout.take().context("queue serve's output")?;
    let mut first = String::new();
    let read = BufReader::new(stdout).read_line(&mut first);
    let base = first
        .trim()
        .strip_prefix("listening on ")
        .map(str::to_owned);
    let served = Served {
        child,
        base: base.clone().unwrap_or_default(),
    };
    read.context("reading queue serve's first line")?;
    base.with_context(|| format!("queue serve said {first:?}"))?;
    Ok(served)
}
