//! `athenz-control-sia`: identity for the control-plane services themselves (docs/design.md §4.6).
//!
//! The callback, the jwt-service, the initializer and the node agents are part of the pod identity
//! path, so they cannot use it; they prove ownership of a service key registered in Athenz instead.
//! From `service.key` and `service.version` this signs an ntoken, sends ZTS a CSR made with the same
//! key (`POST /zts/v1/instance/{domain}/{service}/refresh`, the ntoken in `Athenz-Principal-Auth`),
//! and writes `service.cert.pem` (leaf + chain), `ca.cert.pem` and `ntoken` as one atomic set.

pub mod config;
pub mod identity;
pub mod metrics;
pub mod ops;
pub mod run;

pub use config::{Cli, Command, RefreshSettings, Settings};
pub use identity::ControlSia;

/// Why `init` or `refresh` failed (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Getting or writing the identity.
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    /// Serving the operations endpoint.
    #[error(transparent)]
    Ops(#[from] ops::OpsError),
}

/// The `athenz-control-sia` command: parses `args` (the program name first), runs `init` or
/// `refresh` and says how it ended: 0 done (or SIGTERM during refresh), 1 failed, 2 bad settings
/// (an operations address that cannot be bound included).
/// `main` runs it, and so does `athenz-devstack` when it re-executes itself under this name.
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    use clap::Parser;
    use std::process::ExitCode;
    athenz_core::install_crypto_provider();
    let cli = Cli::parse_from(args);
    // refresh: Some(its operations address, if any)
    let (settings, refresh) = match cli.command {
        Command::Init(s) => (s, None),
        Command::Refresh(RefreshSettings {
            settings,
            ops_listen,
        }) => (settings, Some(ops_listen)),
    };
    let _ = athenz_core::telemetry::init_logging(settings.log_format);
    // a configuration error: exit 2 like any usage error
    let started = settings
        .load()
        .and_then(|loaded| Ok((loaded, config::bind_ops(refresh.flatten())?)));
    let (loaded, ops) = match started {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    athenz_core::daemon::run_to_completion(|| async {
        let sia = ControlSia::new(loaded)?;
        if refresh.is_some() {
            ops::refresh_serving(&sia, ops, athenz_core::http::termination_signal()).await?;
            Ok::<(), RunError>(())
        } else {
            Ok(run::init(&sia).await?)
        }
    })
}
