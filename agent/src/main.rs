//! `athenz-identity-agent`: see the library docs and `--help`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    athenz_core::install_crypto_provider();
    let config = athenz_identity_agent::Config::parse();
    let _ = athenz_core::telemetry::init_logging(config.ops.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = athenz_core::daemon::Shutdown::new();
        let (_, task) = match athenz_identity_agent::start(config, shutdown.clone()).await {
            Ok(started) => started,
            Err(e) => {
                tracing::error!("{e}");
                std::process::exit(2);
            }
        };
        athenz_core::http::termination_signal().await;
        shutdown.trigger();
        let _ = task.await;
        Ok(())
    })
}
