//! What every TLS daemon shares (docs/design.md §4.8): the settings of its server certificate,
//! client CA, allow-list and operations address (clap argument groups, each flag with an
//! environment fallback), and starting the TLS server and the ops server from them.

use crate::http::{Handler, HttpMetrics, Listener, OpsHandler, Readiness, Server, ServerLimits};
use crate::tls::{self, PrincipalAllowList, ReloadingIdentity, TlsError};
use clap::Args;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Settings of a mutual-TLS server.
#[derive(Debug, Clone, Args)]
pub struct TlsServerArgs {
    /// Address the API listens on.
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:4443")]
    pub listen: SocketAddr,
    /// Server certificate (PEM, leaf then chain); reloaded when it changes.
    #[arg(long, env = "TLS_CERT_FILE")]
    pub tls_cert: PathBuf,
    /// Server private key (PEM); reloaded with the certificate.
    #[arg(long, env = "TLS_KEY_FILE")]
    pub tls_key: PathBuf,
    /// CA bundle that client certificates must chain to.
    #[arg(long, env = "CLIENT_CA_FILE")]
    pub client_ca: PathBuf,
    /// Client principals served: exact names and `prefix.*` patterns, comma-separated.
    #[arg(
        long,
        env = "ALLOWED_PRINCIPALS",
        value_delimiter = ',',
        required = true
    )]
    pub allowed_principals: Vec<String>,
    /// How often the certificate files are checked for changes.
    #[arg(long, env = "TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = crate::refresh::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Most connections served at once.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
}

/// Settings of the operations endpoint.
#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "OPS_LISTEN", default_value = "0.0.0.0:9090")]
    pub ops_listen: SocketAddr,
    /// Log format: human or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "human")]
    pub log_format: crate::telemetry::LogFormat,
    /// Seconds to go on accepting connections after SIGTERM, before draining. A deleted pod's
    /// Service endpoint leaves every kube-proxy (and load balancer) a moment after the kubelet
    /// signals it; a server that stops accepting at once refuses the connections routed to it
    /// meanwhile (ZTS's to the callback during a rollout). 0 stops accepting at once.
    #[arg(long, env = "DRAIN_DELAY_SECONDS", default_value_t = 0)]
    pub drain_delay_seconds: u64,
}

/// The identity rules the agent and the callback must share: what one issues for, the other
/// checks against.
#[derive(Debug, Clone, Args)]
pub struct PodIdentityArgs {
    /// Our provider name, e.g. k8s.admin.athenz-callback.
    #[arg(long, env = "PROVIDER")]
    pub provider: String,
    /// DNS suffix of pod SANs.
    #[arg(long, env = "DNS_SUFFIX")]
    pub dns_suffix: String,
    /// Athenz domain of system namespaces.
    #[arg(long, env = "ADMIN_DOMAIN")]
    pub admin_domain: String,
    /// System namespaces besides kube-*, comma-separated.
    #[arg(long, env = "SYSTEM_NAMESPACES", value_delimiter = ',')]
    pub system_namespaces: Vec<String>,
    /// Put before every tenant namespace's domain (`acme.` + `payments` = `acme.payments`), as
    /// k8s-athenz-sia's ATHENZ_PREFIX; empty: none.
    #[arg(long, env = "DOMAIN_PREFIX", default_value = "")]
    pub domain_prefix: String,
    /// Put after every tenant namespace's domain, as k8s-athenz-sia's ATHENZ_SUFFIX; empty: none.
    #[arg(long, env = "DOMAIN_SUFFIX", default_value = "")]
    pub domain_suffix: String,
    /// The domains a namespace may name in its athenz.io/domain annotation, comma-separated
    /// (`acme.payments`, `acme.*` for any below acme); empty (the default): the annotation is
    /// refused and no namespace is read.
    #[arg(long, env = "DOMAIN_ANNOTATION_ALLOW", value_delimiter = ',')]
    pub domain_annotation_allow: Vec<String>,
}

impl PodIdentityArgs {
    /// Validates the settings and builds the namespace ↔ domain mapper.
    pub fn mapper(&self) -> Result<crate::names::DomainMapper, StartError> {
        crate::names::validate_provider("provider", &self.provider)
            .map_err(|e| StartError::new("--provider (PROVIDER)", e))?;
        crate::names::validate_dns_name("dns suffix", &self.dns_suffix)
            .map_err(|e| StartError::new("--dns-suffix (DNS_SUFFIX)", e))?;
        crate::names::DomainMapper::new(
            &self.admin_domain,
            self.system_namespaces
                .iter()
                .filter(|s| !s.is_empty())
                .cloned(),
        )
        .map_err(|e| {
            StartError::new(
                "--admin-domain/--system-namespaces (ADMIN_DOMAIN/SYSTEM_NAMESPACES)",
                e,
            )
        })?
        .with_affixes(&self.domain_prefix, &self.domain_suffix)
        .map_err(|e| {
            StartError::new(
                "--domain-prefix/--domain-suffix (DOMAIN_PREFIX/DOMAIN_SUFFIX)",
                e,
            )
        })?
        .with_annotation_allow(&self.domain_annotation_allow)
        .map_err(|e| StartError::new("--domain-annotation-allow (DOMAIN_ANNOTATION_ALLOW)", e))
    }
}

/// A start-up failure naming the setting.
#[derive(Debug, Error)]
#[error("setting {setting}: {reason}")]
pub struct StartError {
    /// The flag and its environment variable.
    pub setting: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl StartError {
    /// An error for `setting`.
    pub fn new(setting: &'static str, reason: impl ToString) -> Self {
        Self {
            setting,
            reason: reason.to_string(),
        }
    }
}

/// A loaded TLS server setup.
pub struct TlsServerSetup {
    /// The listener, bound.
    pub listener: tokio::net::TcpListener,
    /// The server config (client certificate required), with its check of resumed sessions.
    pub config: tls::ServerTls,
    /// The server identity (reloaded in the background once [`Self::watch`] runs).
    pub identity: Arc<ReloadingIdentity>,
    /// The client CA bundle (reloaded likewise).
    pub client_ca: Arc<tls::ReloadingClientCa>,
    /// Who may call.
    pub allowed: PrincipalAllowList,
    /// Limits.
    pub limits: ServerLimits,
    reload_interval: Duration,
}

impl TlsServerArgs {
    /// Loads the certificate, key and client CA, parses the allow-list and binds the listener.
    pub async fn load(&self) -> Result<TlsServerSetup, StartError> {
        let identity = ReloadingIdentity::load(&self.tls_cert, &self.tls_key)
            .map_err(|e| StartError::new("--tls-cert/--tls-key (TLS_CERT_FILE/TLS_KEY_FILE)", e))?;
        let client_ca = tls::ReloadingClientCa::load(&self.client_ca)
            .map_err(|e| StartError::new("--client-ca (CLIENT_CA_FILE)", e))?;
        let config = tls::server_config_reloading(identity.clone(), client_ca.clone())
            .map_err(|e: TlsError| StartError::new("--client-ca (CLIENT_CA_FILE)", e))?;
        let allowed = PrincipalAllowList::new(&self.allowed_principals)
            .map_err(|e| StartError::new("--allowed-principals (ALLOWED_PRINCIPALS)", e))?;
        if allowed.is_empty() {
            return Err(StartError::new(
                "--allowed-principals (ALLOWED_PRINCIPALS)",
                "no principal is allowed",
            ));
        }
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|e| StartError::new("--listen (LISTEN)", format!("{}: {e}", self.listen)))?;
        Ok(TlsServerSetup {
            listener,
            config,
            identity,
            client_ca,
            allowed,
            limits: ServerLimits {
                max_connections: self.max_connections,
                ..ServerLimits::default()
            },
            reload_interval: self.tls_reload_interval,
        })
    }
}

impl TlsServerSetup {
    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Starts reloading the certificate and the client CA bundle in the background, every
    /// --tls-reload-interval.
    pub fn watch(&self) -> [tokio::task::JoinHandle<()>; 2] {
        [
            self.identity.spawn_watcher(self.reload_interval),
            self.client_ca.clone().spawn_watcher(self.reload_interval),
        ]
    }

    /// Serves `handler` until `shutdown`, recording request metrics in `metrics`.
    pub async fn serve<H: Handler>(
        self,
        handler: Arc<H>,
        metrics: HttpMetrics,
        shutdown: impl Future<Output = ()>,
    ) {
        let watchers = self.watch();
        Server::new(Listener::Tcp(self.listener), handler)
            .with_tls(self.config)
            .with_limits(self.limits)
            .with_metrics(metrics)
            .serve(shutdown)
            .await;
        for watcher in watchers {
            watcher.abort();
        }
    }
}

impl OpsArgs {
    /// Binds the ops address.
    pub async fn bind(&self) -> Result<tokio::net::TcpListener, StartError> {
        tokio::net::TcpListener::bind(self.ops_listen)
            .await
            .map_err(|e| {
                StartError::new(
                    "--ops-listen (OPS_LISTEN)",
                    format!("{}: {e}", self.ops_listen),
                )
            })
    }
}

/// Where a started daemon listens.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The API.
    pub api: SocketAddr,
    /// /healthz, /readyz, /metrics.
    pub ops: SocketAddr,
}

/// What every daemon's `start` ends with, once its API listener and handler are ready: the
/// task that serves `api_server` and the ops endpoints (`ops_listener`, with `registry` and
/// `readiness`) until `shutdown`, then stops `background` (its reloaders and probes) and waits
/// for the ops server to finish. `api` is the API's bound address, for [`Bound`].
pub fn spawn_serving(
    api: SocketAddr,
    ops_listener: tokio::net::TcpListener,
    registry: Registry,
    readiness: Readiness,
    background: Vec<tokio::task::JoinHandle<()>>,
    api_server: impl Future<Output = ()> + Send + 'static,
    shutdown: &Shutdown,
) -> Result<(Bound, tokio::task::JoinHandle<()>), StartError> {
    let ops = ops_listener
        .local_addr()
        .map_err(|e| StartError::new("--ops-listen (OPS_LISTEN)", e))?;
    let ops_server = serve_ops(ops_listener, Arc::new(registry), readiness, shutdown.wait());
    let task = tokio::spawn(async move {
        let ops_server = tokio::spawn(ops_server);
        api_server.await;
        for task in background {
            task.abort();
        }
        let _ = ops_server.await;
    });
    Ok((Bound { api, ops }, task))
}

/// Serves /healthz, /readyz and /metrics on `listener` until `shutdown`.
pub async fn serve_ops(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()>,
) {
    Server::new(
        Listener::Tcp(listener),
        Arc::new(OpsHandler::new(registry, readiness)),
    )
    .with_limits(ServerLimits {
        max_connections: 64,
        ..ServerLimits::default()
    })
    .serve(shutdown)
    .await;
}

/// How a daemon's process runs, from its settings.
#[derive(Debug, Clone, Copy)]
pub struct RunSettings {
    /// Log format.
    pub log_format: crate::telemetry::LogFormat,
    /// Worker threads of its runtime; `None`: one per CPU (tokio's default, which
    /// `TOKIO_WORKER_THREADS` overrides).
    pub worker_threads: Option<usize>,
    /// How long it goes on accepting after SIGTERM ([`OpsArgs::drain_delay_seconds`]).
    pub drain_delay: std::time::Duration,
}

impl RunSettings {
    /// The operations settings' log format and drain delay, a worker per CPU.
    pub fn from_ops(ops: &OpsArgs) -> Self {
        Self {
            log_format: ops.log_format,
            worker_threads: None,
            drain_delay: std::time::Duration::from_secs(ops.drain_delay_seconds),
        }
    }
}

/// The whole command of a daemon: parses `args` (the program name first; a bad setting exits 2
/// with clap's message) into `C`, then [`run_until_terminated`] with `start`. Each daemon crate's
/// `main_with_args` is this, so `main` and `athenz-devstack` run it the same way.
pub fn parse_and_run<C, S, Fut, B>(
    args: impl IntoIterator<Item = std::ffi::OsString>,
    settings: impl FnOnce(&C) -> RunSettings,
    start: S,
) -> std::io::Result<()>
where
    C: clap::Parser,
    S: FnOnce(C, Shutdown) -> Fut,
    Fut: Future<Output = Result<(B, tokio::task::JoinHandle<()>), StartError>>,
{
    let config = C::parse_from(args);
    let settings = settings(&config);
    run_until_terminated(settings, |shutdown| start(config, shutdown))
}

/// The `main` of every daemon: installs the crypto provider and logging, seeds the crypto
/// generator (see [`crate::random::seed_crypto_generator`]), starts the daemon on a
/// multi-threaded runtime, runs until SIGTERM or SIGINT, goes on serving for the drain delay (a
/// second signal cuts it short), then drains it. A start-up error is logged and ends the process
/// with exit code 2 (a usage error: it names the setting).
pub fn run_until_terminated<S, Fut, B>(settings: RunSettings, start: S) -> std::io::Result<()>
where
    S: FnOnce(Shutdown) -> Fut,
    Fut: Future<Output = Result<(B, tokio::task::JoinHandle<()>), StartError>>,
{
    crate::install_crypto_provider();
    let _ = crate::telemetry::init_logging(settings.log_format);
    let runtime = server_runtime_with(settings.worker_threads)?;
    runtime.block_on(async {
        let shutdown = Shutdown::new();
        let (_, task) = match start(shutdown.clone()).await {
            Ok(started) => started,
            Err(e) => {
                tracing::error!("{e}");
                std::process::exit(2);
            }
        };
        crate::http::termination_signal_after(settings.drain_delay).await;
        shutdown.trigger();
        let _ = task.await;
        Ok(())
    })
}

/// The runtime of a long-running server, its crypto generator seeded before it serves.
///
/// aws-lc's generator keeps an entropy source per thread, seeded by jitter entropy (tens of ms
/// of CPU each). This thread's is seeded now; the worker threads, where handshakes and keys
/// happen, seed theirs the first time they go idle, not inside a request. Only workers park: the
/// blocking pool's threads (file and mount work, started and retired on demand) never pay for a
/// generator they do not use — seeding them at start cost the agent a fifth of its CPU per
/// identity. The daemons run on it, and so do the testbed's stand-ins for ZTS and Kubernetes,
/// whose seeding would otherwise land in the first identities a benchmark measures.
pub fn server_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    server_runtime_with(None)
}

/// [`server_runtime`] with `worker_threads` workers (`None`: one per CPU).
pub fn server_runtime_with(
    worker_threads: Option<usize>,
) -> std::io::Result<tokio::runtime::Runtime> {
    if let Err(e) = crate::random::seed_crypto_generator() {
        // Not fatal here: whatever needs randomness later fails with its own error.
        tracing::warn!(error = %e, "seeding the crypto generator at start failed");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = worker_threads {
        builder.worker_threads(workers.max(1));
    }
    builder
        .enable_all()
        .on_thread_park(crate::random::seed_crypto_generator_once_per_thread)
        .build()
}

/// Runs a command-line tool's work (the SIAs' `init` or `refresh`) on a single-threaded runtime
/// and turns its outcome into the exit code: 0 done, 1 failed (the error logged).
pub fn run_to_completion<E, Fut>(work: impl FnOnce() -> Fut) -> std::process::ExitCode
where
    E: std::fmt::Display,
    Fut: Future<Output = Result<(), E>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Periodic reloads run on [`crate::periodic::every`] (below this module and [`crate::tls`]).
pub use crate::periodic::every;

/// A shutdown signal that many tasks can wait on: resolves for every waiter once triggered.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A new, untriggered signal.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }

    /// Triggers it.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once triggered.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shutdown_reaches_every_waiter() {
        let s = Shutdown::new();
        let a = tokio::spawn(s.wait());
        let b = tokio::spawn(s.wait());
        s.trigger();
        a.await.unwrap();
        b.await.unwrap();
        // waiting after the trigger resolves at once
        tokio::time::timeout(Duration::from_secs(1), s.wait())
            .await
            .unwrap();
    }
}
