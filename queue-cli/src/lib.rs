//! The `queue` operator commands, as a library so they can be tested: each
//! command writes to a passed-in `impl Write`.

use std::io::Write;

use clap::{Parser, Subcommand};

/// Operate a job queue.
#[derive(Debug, Parser)]
#[command(name = "queue", version, about = "Operate a Postgres job queue")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version of the queue crates this binary was built with.
    Version,
}

/// Runs `cli`, writing its output to `out`.
pub fn run(cli: Cli, out: &mut impl Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => writeln!(out, "queue {}", env!("CARGO_PKG_VERSION"))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_prints_the_crate_version() {
        let mut out = Vec::new();
        run(Cli::parse_from(["queue", "version"]), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("queue {}\n", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn help_lists_the_commands() {
        let err = Cli::try_parse_from(["queue", "--help"]).unwrap_err();
        assert!(err.to_string().contains("version"));
    }
}
