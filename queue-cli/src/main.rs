//! The `queue` operator binary.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = queue_cli::Cli::parse();
    queue_cli::run(cli, &mut std::io::stdout().lock()).await
}
