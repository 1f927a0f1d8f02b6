//! What each command needs of the machine, how to tell whether it is
//! there, and which Debian package brings it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A thing a command needs.
pub struct Prerequisite {
    /// What it is, for people.
    pub what: &'static str,
    /// What needs it.
    pub why: &'static str,
    /// The Debian package that brings it.
    pub package: &'static str,
    /// Whether this machine has it.
    pub present: fn() -> bool,
}

/// What decides the prerequisites beyond the command.
pub struct Machine {
    /// `DATABASE_URL` is set: the tests' database is given.
    pub database_url: bool,
    /// Running as root with apt-get, and installing not turned off.
    pub can_apt: bool,
}

impl Machine {
    /// This process's machine.
    pub fn this() -> Machine {
        let installing = std::env::var_os("QUEUE_XTASK_NO_INSTALL").is_none();
        Machine {
            database_url: std::env::var("DATABASE_URL").is_ok_and(|u| !u.is_empty()),
            can_apt: installing && is_root() && on_path("apt-get").is_some(),
        }
    }

    /// Whether missing prerequisites may be installed here.
    pub fn may_install(&self) -> bool {
        self.can_apt
    }
}

const POSTGRES: Prerequisite = Prerequisite {
    what: "the PostgreSQL server binaries (initdb, pg_ctl, postgres, pgbench)",
    why: "the throwaway clusters",
    package: "postgresql",
    present: || {
        ["initdb", "pg_ctl", "postgres", "pgbench"]
            .iter()
            .all(|t| postgres_tool(t).is_some())
    },
};
const CHROMIUM: Prerequisite = Prerequisite {
    what: "Chromium (/usr/bin/chromium)",
    why: "the dashboard's browser test",
    package: "chromium",
    present: || Path::new("/usr/bin/chromium").is_file(),
};
const NODE: Prerequisite = Prerequisite {
    what: "Node.js",
    why: "the dashboard's browser test (playwright-core)",
    package: "nodejs",
    present: || on_path("node").is_some(),
};
const NPM: Prerequisite = Prerequisite {
    what: "npm",
    why: "the dashboard's browser test (playwright-core)",
    package: "npm",
    present: || on_path("npm").is_some(),
};
const VENV: Prerequisite = Prerequisite {
    what: "Python 3 with venv and ensurepip",
    why: "the API fuzzing (schemathesis, in a virtualenv)",
    package: "python3-venv",
    present: || {
        Command::new("python3")
            .args(["-c", "import ensurepip, venv"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    },
};
const OPENSSL: Prerequisite = Prerequisite {
    what: "openssl",
    why: "the throwaway cluster's TLS certificate (the sslmode=require test)",
    package: "openssl",
    present: || on_path("openssl").is_some(),
};
const LIBPQ: Prerequisite = Prerequisite {
    what: "libpq's development files (libpq.so)",
    why: "the diesel features' tests, which link libpq",
    package: "libpq-dev",
    present: has_libpq,
};

/// What `command` needs on `machine`, in the order the message names them.
pub fn needed(command: &str, machine: &Machine) -> Vec<&'static Prerequisite> {
    // A given database spares the throwaway cluster, except for the faults
    // (test-pg runs them too), which stop and start clusters of their own.
    let cluster = !machine.database_url;
    match command {
        "test-pg" => vec![&POSTGRES, &CHROMIUM, &NODE, &NPM, &VENV, &OPENSSL, &LIBPQ],
        "faults" => vec![&POSTGRES],
        "dashboard" if cluster => vec![&POSTGRES, &CHROMIUM, &NODE, &NPM],
        "dashboard" => vec![&CHROMIUM, &NODE, &NPM],
        "demo" | "bench" if cluster => vec![&POSTGRES],
        _ => Vec::new(),
    }
}

/// The Debian packages that bring `missing`, each once.
pub fn packages(missing: &[&Prerequisite]) -> Vec<String> {
    let mut packages: Vec<String> = Vec::new();
    for p in missing {
        if !packages.iter().any(|q| q == p.package) {
            packages.push(p.package.to_owned());
        }
    }
    packages
}

/// The one message naming everything `command` lacks, and the command that
/// installs it all.
pub fn explain(command: &str, missing: &[&Prerequisite]) -> String {
    let mut text = format!(
        "xtask: `cargo xtask {command}` needs what this machine lacks; nothing was built or run:"
    );
    for p in missing {
        text.push_str(&format!("\n  - {}, for {}", p.what, p.why));
    }
    text.push_str(&format!(
        "\nInstall them (Debian or Ubuntu) with:\n  sudo apt-get update && sudo apt-get install -y {}\nor run `cargo xtask {command}` as root, which installs them itself.",
        packages(missing).join(" ")
    ));
    text
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `name` in a directory of PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A PostgreSQL program: on PATH, or in Debian's versioned directories
/// (where xtask looks for them too).
fn postgres_tool(name: &str) -> Option<PathBuf> {
    on_path(name).or_else(|| {
        std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|version| version.path().join("bin").join(name))
            .find(|tool| tool.is_file())
    })
}

/// Whether libpq's linkable library is where pg_config (or the usual
/// multiarch directory) says.
fn has_libpq() -> bool {
    let from_pg_config = Command::new("pg_config")
        .arg("--libdir")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    from_pg_config
        .into_iter()
        .chain(
            std::fs::read_dir("/usr/lib")
                .into_iter()
                .flatten()
                .flatten()
                .map(|d| d.path()),
        )
        .chain([PathBuf::from("/usr/lib")])
        .any(|dir| dir.join("libpq.so").exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(database_url: bool) -> Machine {
        Machine {
            database_url,
            can_apt: false,
        }
    }

    #[test]
    fn each_command_needs_what_it_runs() {
        let named = |command, url| {
            needed(command, &machine(url))
                .iter()
                .map(|p| p.package)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            named("test-pg", true),
            [
                "postgresql",
                "chromium",
                "nodejs",
                "npm",
                "python3-venv",
                "openssl",
                "libpq-dev"
            ],
            "the faults need the binaries even with a database given"
        );
        assert_eq!(named("demo", false), ["postgresql"]);
        assert!(named("demo", true).is_empty());
        assert_eq!(named("dashboard", true), ["chromium", "nodejs", "npm"]);
        assert!(named("help", false).is_empty());
    }

    #[test]
    fn one_message_names_everything_missing_and_the_command() {
        let missing = [&CHROMIUM, &NODE, &NPM, &LIBPQ];
        let text = explain("test-pg", &missing);
        for p in missing {
            assert!(text.contains(p.what), "{text}");
        }
        assert!(
            text.contains("sudo apt-get install -y chromium nodejs npm libpq-dev"),
            "{text}"
        );
        assert!(text.contains("nothing was built or run"), "{text}");
    }
}
