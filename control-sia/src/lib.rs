//! `athenz-control-sia`: identity for the control-plane services themselves (DESIGN.md 4.6).
//!
//! The callback, the jwt-service, the initializer and the node agents are part of the pod identity
//! path, so they cannot use it; they prove ownership of a service key registered in Athenz instead.
//! From `service.key` and `service.version` this signs an ntoken, sends ZTS a CSR made with the same
//! key (`POST /zts/v1/instance/{domain}/{service}/refresh`, the ntoken in `Athenz-Principal-Auth`),
//! and writes `service.cert.pem` (leaf + chain), `ca.cert.pem` and `ntoken` as one atomic set.

pub mod config;
pub mod identity;
pub mod run;

pub use config::{Cli, Command, Settings};
pub use identity::ControlSia;

/// The `athenz-control-sia` command: parses `args` (the program name first), runs `init` or
/// `refresh` and says how it ended: 0 done (or SIGTERM during refresh), 1 failed, 2 bad settings.
/// `main` runs it, and so does `athenz-devstack` when it re-executes itself under this name.
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    use clap::Parser;
    use std::process::ExitCode;
    athenz_core::install_crypto_provider();
    let cli = Cli::parse_from(args);
    let (settings, refresh) = match cli.command {
        Command::Init(s) => (s, false),
        Command::Refresh(s) => (s, true),
    };
    let _ = athenz_core::telemetry::init_logging(settings.log_format);
    let loaded = match settings.load() {
        Ok(l) => l,
        Err(e) => {
            // a configuration error: exit 2 like any usage error
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    athenz_core::daemon::run_to_completion(|| async {
        let sia = ControlSia::new(loaded)?;
        if refresh {
            run::refresh(&sia, athenz_core::http::termination_signal()).await;
            Ok(())
        } else {
            run::init(&sia).await
        }
    })
}
