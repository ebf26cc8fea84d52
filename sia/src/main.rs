//! `athenz-sia init|refresh`: see the library docs and `--help`.

use athenz_sia::{Cli, Command, run::Sia};
use clap::Parser;

fn main() {
    // No TLS here (the agent is reached over a Unix socket), so no crypto provider is installed:
    // it would only add memory to a process that runs in every pod.
    let cli = Cli::parse();
    let (settings, refresh) = match cli.command {
        Command::Init(s) => (s, false),
        Command::Refresh(s) => (s, true),
    };
    let _ = athenz_core::telemetry::init_logging(settings.log_format);
    let sia = match Sia::load(settings) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            std::process::exit(2);
        }
    };
    // A single-threaded runtime: the SIA runs in every pod and must stay small.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        if refresh {
            sia.refresh(athenz_core::http::termination_signal()).await
        } else {
            sia.init().await
        }
    });
    if let Err(e) = result {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
