//! The `queue` operator binary: a thin `main` over the `queue_cli` library.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = queue_cli::Cli::parse();
    // Warnings (the store's start-up findings among them) always show;
    // -v adds info, -vv debug. RUST_LOG, when set, decides instead.
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("queue: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(queue_cli::run(cli, &mut std::io::stdout().lock()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, each said once (some
            // errors repeat their source in their own message).
            let mut reason = String::new();
            for cause in e.chain() {
                let text = cause.to_string().replace('\n', " ");
                if reason.contains(&text) {
                    continue;
                }
                if !reason.is_empty() {
                    reason.push_str(": ");
                }
                reason.push_str(&text);
            }
            // Errors can quote job data (a key, a state): printable.
            eprintln!("queue: {}", queue_cli::output::printable_line(&reason));
            ExitCode::FAILURE
        }
    }
}
