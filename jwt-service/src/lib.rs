//! `athenz-jwt-service`: signs the pod subjects that node agents attest into short-lived identity
//! JWTs (docs/design.md §4.3). Mutual TLS only; callers must be on the allow-list (node agents).
//! The callback later verifies these JWTs with the matching public keys.

pub mod keys;
pub mod service;
pub mod signer;

use athenz_core::daemon::{OpsArgs, Shutdown, StartError, TlsServerArgs};
use athenz_core::http::{HttpMetrics, Readiness};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Command line of `athenz-jwt-service`; every flag has an environment fallback.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "athenz-jwt-service",
    version,
    about = "Signs attested pod subjects into identity JWTs"
)]
pub struct Config {
    /// The TLS server.
    #[command(flatten)]
    pub tls: TlsServerArgs,
    /// Operations endpoint and logging.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// Directory of signing keys `v<N>.pem` (EC P-256 → ES256, RSA → RS256); the highest N signs.
    #[arg(long, env = "SIGNING_KEYS_DIR")]
    pub keys_dir: PathBuf,
    /// How often the key directory is re-read.
    #[arg(long, env = "KEYS_RELOAD_INTERVAL", default_value = "10s", value_parser = athenz_core::refresh::parse_duration)]
    pub keys_reload_interval: Duration,
    /// `iss` of the JWTs.
    #[arg(long, env = "JWT_ISSUER", default_value = athenz_core::identity_jwt::DEFAULT_ISSUER)]
    pub issuer: String,
    /// `aud` of the JWTs.
    #[arg(long, env = "JWT_AUDIENCE", default_value = athenz_core::identity_jwt::DEFAULT_AUDIENCE)]
    pub audience: String,
    /// The provider that issues node agents their identities: the caller's node is read from its
    /// certificate's `athenz://instanceid/<provider>/<node>` URI (docs/design.md §4.3, §4.9).
    #[arg(long, env = "PROVIDER")]
    pub provider: String,
    /// JWT lifetime.
    #[arg(long, env = "JWT_LIFETIME", default_value = "5m", value_parser = athenz_core::refresh::parse_duration)]
    pub lifetime: Duration,
}

pub use athenz_core::daemon::Bound;

/// Starts the service; it runs until `shutdown` is triggered. Returns where it listens and the
/// task to await.
pub async fn start(
    config: Config,
    shutdown: Shutdown,
) -> Result<(Bound, tokio::task::JoinHandle<()>), StartError> {
    athenz_core::names::validate_provider("provider", &config.provider)
        .map_err(|e| StartError::new("--provider (PROVIDER)", e))?;
    let keys = Arc::new(
        keys::KeyDir::load(&config.keys_dir)
            .map_err(|e| StartError::new("--keys-dir (SIGNING_KEYS_DIR)", e))?,
    );
    let setup = config.tls.load().await?;
    let api = setup
        .local_addr()
        .map_err(|e| StartError::new("--listen (LISTEN)", e))?;
    let ops_listener = config.ops.bind().await?;
    let mut registry = prometheus_client::registry::Registry::with_prefix("athenz_jwt_service");
    let http_metrics = HttpMetrics::register_tls(&mut registry);
    let handler = Arc::new(service::JwtHandler {
        keys: keys.clone(),
        allowed: setup.allowed.clone(),
        provider: config.provider.clone(),
        issuer: config.issuer.clone(),
        audience: config.audience.clone(),
        lifetime: config.lifetime,
        metrics: service::JwtMetrics::register(&mut registry),
    });
    let readiness = Readiness::default();
    readiness.set(true);
    let kid = keys.active().kid.clone();
    let (bound, task) = athenz_core::daemon::spawn_serving(
        api,
        ops_listener,
        registry,
        readiness,
        vec![keys.spawn_watcher(config.keys_reload_interval)],
        setup.serve(handler, http_metrics, shutdown.wait()),
        &shutdown,
    )?;
    tracing::info!(api = %bound.api, ops = %bound.ops, %kid, "jwt-service listening");
    Ok((bound, task))
}

/// The `athenz-jwt-service` command: parses `args` (the program name first; a bad setting exits 2 with
/// clap's message) and serves until SIGTERM. `main` runs it, and so does `athenz-devstack` when it
/// re-executes itself under this name.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::io::Result<()> {
    athenz_core::daemon::parse_and_run(
        args,
        |c: &Config| athenz_core::daemon::RunSettings::from_ops(&c.ops),
        start,
    )
}
