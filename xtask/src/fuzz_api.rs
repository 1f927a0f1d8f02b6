//! The HTTP API fuzzed from its own OpenAPI document by schemathesis (from
//! the Python package index, in a virtualenv xtask keeps under `target/`):
//! `queue serve` on the test database, a few jobs in the table, an admin
//! token, and every check schemathesis has but one.
//!
//! Left out: `positive_data_acceptance`, which expects every schema-valid
//! request to succeed. Postgres cannot store a NUL character in text or
//! jsonb, so a kind or payload holding `\u0000` is refused (400, naming the
//! problem), which no JSON schema can say.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::served;

/// The schemathesis release the checks were written against.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";
const TOKEN: &str = "fuzz-admin-token";

/// The virtualenv with schemathesis, made on first use.
fn schemathesis(target: &Path) -> Result<PathBuf> {
    let venv = target.join("schemathesis-venv");
    let program = venv.join("bin").join("schemathesis");
    if program.is_file() {
        // A virtualenv names its interpreter by absolute path: one moved
        // with its target directory no longer runs, and is made again.
        let runs = Command::new(&program)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if runs {
            return Ok(program);
        }
        eprintln!(
            "fuzz-api: {} does not run (moved?); making it again",
            venv.display()
        );
        std::fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    eprintln!(
        "fuzz-api: installing {SCHEMATHESIS} into {}",
        venv.display()
    );
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .context("running python3 -m venv (install python3 and python3-venv)")?;
    if !made.success() {
        bail!("python3 -m venv failed (on Debian: apt-get install -y python3-venv)");
    }
    let installed = Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", SCHEMATHESIS])
        .status()
        .context("running pip install schemathesis")?;
    if !installed.success() {
        bail!("pip install {SCHEMATHESIS} failed");
    }
    Ok(program)
}

/// Fuzzes `queue serve` on the database at `url` for `seconds`.
pub fn run(url: &str, seconds: u32) -> Result<()> {
    let target = served::target_dir();
    // Absolute: it runs in a directory of its own (below).
    let schemathesis = std::fs::canonicalize(schemathesis(&target)?)?;
    let queue = served::queue_binary(false)?;
    let schema = format!("fuzz_api_{}", std::process::id());
    let config = target.join("fuzz-api.toml");
    std::fs::write(&config, format!("schema = \"{schema}\"\n"))?;
    let queue_command = |args: &[&str]| {
        let mut command = Command::new(&queue);
        command
            .env("DATABASE_URL", url)
            .env_remove("QUEUE_CONFIG")
            .arg("--config")
            .arg(&config)
            .args(args);
        command
    };
    for args in [
        &["migrate"][..],
        &["enqueue", "email", r#"{"to": "a@example.com"}"#],
        &["enqueue", "resize", r#"{"w": 640}"#, "--priority", "3"],
        &["enqueue", "report", "{}", "--run-at", "1h"],
    ] {
        let out = queue_command(args).output()?;
        if !out.status.success() {
            bail!("queue {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let server = served::start(&queue, url, &config, &[("QUEUE_ADMIN_TOKENS", TOKEN)])?;
    let base = server.base.clone();
    eprintln!("fuzz-api: schemathesis against {base} for {seconds}s");
    // schemathesis writes its cache (.schemathesis/) where it runs: in
    // target/, never in the work tree.
    let workdir = target.join("schemathesis-run");
    std::fs::create_dir_all(&workdir)?;
    let status = Command::new(&schemathesis)
        .current_dir(&workdir)
        .arg("run")
        .arg(format!("{base}/openapi.json"))
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        .args(["--max-time", &seconds.to_string()])
        .args(["--wait-for-schema", "10"])
        .env("NO_COLOR", "1")
        .status()
        .context("running schemathesis")?;
    drop(server);
    if !status.success() {
        bail!("schemathesis found problems in the HTTP API (see above)");
    }
    Ok(())
}
