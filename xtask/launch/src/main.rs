//! `cargo xtask <command>`: before anything else is built, checks that the
//! machine has what the command needs (the PostgreSQL server binaries,
//! Chromium, Node.js and npm, Python's venv, openssl, libpq), then runs the
//! xtask program (`cargo run --package xtask`).
//!
//! This program has no dependencies, so on a fresh machine it compiles in
//! about a second: a missing prerequisite is named within seconds, never
//! after the minutes it takes to build the workspace. Run as root where
//! `apt-get` exists (as CI does), it installs what is missing and says so;
//! otherwise it names everything missing in one message, with the command
//! that installs it. `QUEUE_XTASK_NO_INSTALL=1` turns the installing off.

mod prerequisites;

use std::process::{Command, ExitCode};

use prerequisites::{Machine, Prerequisite};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = args.first().map(String::as_str).unwrap_or_default();
    let machine = Machine::this();
    let missing: Vec<&Prerequisite> = prerequisites::needed(command, &machine)
        .into_iter()
        .filter(|p| !(p.present)())
        .collect();
    if !missing.is_empty() {
        if machine.may_install() {
            if let Err(problem) = install(&missing) {
                eprintln!("xtask: {problem}");
                return ExitCode::FAILURE;
            }
            let still: Vec<&Prerequisite> =
                missing.into_iter().filter(|p| !(p.present)()).collect();
            if !still.is_empty() {
                eprintln!("{}", prerequisites::explain(command, &still));
                return ExitCode::FAILURE;
            }
        } else {
            eprintln!("{}", prerequisites::explain(command, &missing));
            return ExitCode::FAILURE;
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    match Command::new(cargo)
        .args(["run", "--quiet", "--package", "xtask", "--"])
        .args(&args)
        .status()
    {
        Ok(status) => match status.code() {
            Some(0) => ExitCode::SUCCESS,
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Installs the Debian packages of `missing` with apt-get, saying which.
fn install(missing: &[&Prerequisite]) -> Result<(), String> {
    let packages = prerequisites::packages(missing);
    eprintln!(
        "xtask: installing {} (apt-get install -y {})",
        missing
            .iter()
            .map(|p| p.what)
            .collect::<Vec<_>>()
            .join(", "),
        packages.join(" ")
    );
    // apt-get's and dpkg's progress goes nowhere; their errors show.
    let quiet = |program: &str, args: &[&str]| -> Result<(), String> {
        let status = Command::new(program)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{program} {} failed ({status})", args.join(" ")))
        }
    };
    quiet("apt-get", &["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(packages.iter().map(String::as_str));
    quiet("apt-get", &install)
}
