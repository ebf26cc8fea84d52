//! `athenz-control-sia init|refresh`: see the library docs and `--help`.

use athenz_control_sia::{Cli, Command, ControlSia, run};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    athenz_core::install_crypto_provider();
    let cli = Cli::parse();
    let (settings, refresh) = match cli.command {
        Command::Init(s) => (s, false),
        Command::Refresh(s) => (s, true),
    };
    let _ = athenz_core::telemetry::init_logging(settings.log_format);
    let loaded = match settings.load() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{e}");
            // a configuration error: exit 2 like any usage error
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let sia = ControlSia::new(loaded)?;
        if refresh {
            run::refresh(&sia, athenz_core::http::termination_signal()).await;
            Ok(())
        } else {
            run::init(&sia).await.map_err(anyhow::Error::from)
        }
    })
}
