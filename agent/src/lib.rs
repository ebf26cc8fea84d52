//! `athenz-identity-agent`: the node daemon (docs/design.md §4.2, §4.10). Pods reach it through
//! the socket their volume holds, the kubelet through the CSI driver, and the API server's
//! bindings through a watch. Its code reads by concern (docs/architecture.md, "The agent"):
//! [`attest`] (who is calling: which pod, and who on this node says so), [`manager`] (what is
//! issued and held: every issuance through one queue by priority, and the volumes' records) and
//! [`serve`] (how it is served: the socket's routes, CSI, the tunnel to ZTS).

pub mod attest;
mod config;
pub use config::Config;
pub mod csr_check;
pub mod failure;
pub mod install;
pub mod jwt_client;
pub mod key_pool;
pub mod kubelet;
pub mod manager;
pub mod metrics;
pub mod node_identity;
pub mod rate;
pub mod serve;
pub mod service_dns;
pub mod status;
pub mod volume_expiry;
pub mod zts_ca;

use athenz_core::daemon::{Shutdown, StartError};
use athenz_core::http::{HttpMetrics, Listener, Readiness, Server, ServerLimits};
use athenz_core::tls;
use athenz_core::volume::{AGENT_SOCKET_NAME, VolumesDir};
use athenz_core::zts::{ZtsClient, ZtsClientConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Command line of `athenz-identity-agent`; every flag has an environment fallback.
fn read_cas(
    path: &std::path::Path,
    setting: &'static str,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, StartError> {
    tls::read_certs_file(path).map_err(|e| StartError::new(setting, e))
}

/// Where a started agent listens.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The socket.
    pub socket: PathBuf,
    /// /healthz, /readyz, /metrics.
    pub ops: std::net::SocketAddr,
    /// The CSI socket, when served.
    pub csi_socket: Option<PathBuf>,
}

/// The namespace → domain mapping, reading namespaces' `athenz.io/domain` annotations from the
/// API when the install allows domains by annotation (`--domain-annotation-allow`).
async fn namespace_domains(
    config: &Config,
) -> Result<athenz_core::names::NamespaceDomains, StartError> {
    let mapper = config.identity.mapper()?;
    let source: Option<Arc<dyn athenz_core::names::AnnotationSource>> =
        if mapper.honours_annotation() {
            let client = serve::csi::kube_client(
                config,
                "--domain-annotation-allow/--kube-api-url (DOMAIN_ANNOTATION_ALLOW/KUBE_API_URL)",
                config.upstream_timeout,
            )
            .await?;
            Some(Arc::new(athenz_core::names::KubeNamespaces::new(
                client,
                config.upstream_timeout,
            )))
        } else {
            None
        };
    Ok(athenz_core::names::NamespaceDomains::new(mapper, source))
}

/// Starts the agent; it serves until `shutdown` is triggered, then removes its socket.
pub async fn start(
    config: Config,
    shutdown: Shutdown,
) -> Result<(Bound, tokio::task::JoinHandle<()>), StartError> {
    let domains = namespace_domains(&config).await?;
    check_kubelet_list_rate(&config)?;
    let (zts, athenz_ca, issuers) = zts_client(&config)?;
    let mut registry = prometheus_client::registry::Registry::with_prefix("athenz_agent");
    let readiness = Readiness::default();
    let node = node_identity(&config, &zts, &readiness, &mut registry)?;
    let jwt_client = jwt_http_client(&config, &node)?;
    let kubelet_client = kubelet_client(&config)?;
    let token = config.kubelet_token.clone();
    install_flex_driver(&config)?;
    let volumes = VolumesDir::new(&config.volumes_dir);
    volumes
        .ensure()
        .map_err(|e| StartError::new("--volumes-dir (ATHENZ_VOLUMES_DIR)", e))?;
    let (socket, listener) = bind_socket(&config)?;
    let ops_listener = config.ops.bind().await?;
    let bound = Bound {
        socket: socket.clone(),
        ops: ops_listener
            .local_addr()
            .map_err(|e| StartError::new("--ops-listen (OPS_LISTEN)", e))?,
        csi_socket: config.csi_socket.clone(),
    };

    let keys = key_pool::KeyPool::new(config.key_algorithm, config.key_pool_max);
    // the bundle pods verify ZTS with: published beside the socket, followed when it rotates
    let zts_ca = zts_ca::ZtsCa::load(&config.zts_ca, &config.agent_dir)
        .map_err(|e| StartError::new("--zts-ca (ZTS_CA_FILE)", e))?;
    let tunnel = serve::tunnel::Tunnel::new(
        &config.zts_url,
        config.max_tunnels,
        config.upstream_timeout.max(Duration::from_secs(30)),
        config.upstream_timeout,
    )
    .map_err(|e| StartError::new("--zts-url (ZTS_URL)", e))?;
    let queue = issuance_queue(&config, &mut registry)?;
    let metrics = metrics::AgentMetrics::register(&mut registry);
    let early_issues = manager::early::register_outcomes(&mut registry);
    metrics.set_key_source(config.key_source);
    let node_boot = match config.node_boot_time {
        Some(at) => at,
        None => kubelet::node_boot_time()
            .map_err(|e| StartError::new("--node-boot-time (NODE_BOOT_TIME)", e))?,
    };
    let attestor = attest::Attestor {
        metrics: metrics.clone(),
        pods: kubelet::PodCache::new(
            kubelet_client,
            &config.kubelet_url,
            token,
            config.kubelet_cache_ttl,
            kubelet::ListRate {
                burst: config.kubelet_list_burst,
                per_second: config.kubelet_list_rate,
            },
            node_boot,
        ),
        pod_wait: config.pod_wait,
        node_boot,
        domains,
        peer_check: config.peer_check,
        node_name: config.node_name.clone(),
        volumes: volumes.clone(),
    };
    let manager = manager::Manager {
        metrics: metrics.clone(),
        volumes,
        provider: config.identity.provider.clone(),
        dns_suffix: config.identity.dns_suffix.clone(),
        service_dns: config
            .cluster_domain
            .clone()
            .map(|domain| service_dns::ServiceDns::new(domain, config.dns_resolver)),
        keys: Arc::clone(&keys),
        jwt: jwt_client::JwtClient::new(jwt_client, &config.jwt_service_url, Arc::clone(&node)),
        zts,
        athenz_ca,
        queue,
        early: manager::early::EarlyIssues::new(manager::early::HOLD, early_issues),
        warmup_rate: std::sync::Mutex::new(rate::TokenBucket::new(
            rate::Rate {
                burst: config.early_issue_burst,
                per_second: config.early_issue_rate,
            },
            std::time::Instant::now(),
        )),
    };
    let agent = Arc::new(serve::Agent {
        attestor,
        manager,
        metrics,
        key_source: config.key_source,
        zts_url: config.zts_url.trim_end_matches('/').to_owned(),
        zts_ca: Arc::clone(&zts_ca),
        tunnel,
        node: Arc::clone(&node),
        locks: tokio::sync::Mutex::default(),
    });
    let csi = match &config.csi_socket {
        Some(path) => Some(serve::csi::start(&config, path, &agent, &mut registry)?),
        None => None,
    };
    let early_watch = if config.csi_early_issue {
        Some(serve::csi::watch_bound_pods(&config, &agent).await?)
    } else {
        None
    };
    let http_metrics = HttpMetrics::register(&mut registry);
    let filler = tokio::spawn(Arc::clone(&keys).fill(shutdown.wait()));
    let registry = Arc::new(registry);
    tracing::info!(socket = %socket.display(), ops = %bound.ops, node = %config.node_name, peer_check = %config.peer_check, key_source = %config.key_source, "agent listening");
    let ca_reload = config.zts_ca_reload_interval;
    let task = tokio::spawn(async move {
        let watcher = tokio::spawn(Arc::clone(&node).run(shutdown.wait()));
        let ca_watcher = zts_ca.spawn_watcher(ca_reload);
        let issuers_watcher = issuers.spawn_watcher(ca_reload);
        let csi = csi.map(|serve| tokio::spawn(serve(Box::pin(shutdown.wait()))));
        let ops = tokio::spawn(athenz_core::daemon::serve_ops(
            ops_listener,
            registry,
            readiness,
            shutdown.wait(),
        ));
        Server::new(
            Listener::Unix(listener),
            Arc::new(serve::routes::AgentHandler { agent }),
        )
        .with_limits(ServerLimits::default())
        .with_metrics(http_metrics)
        .serve(shutdown.wait())
        .await;
        let _ = watcher.await;
        let _ = filler.await;
        if let Some(csi) = csi {
            let _ = csi.await;
        }
        ca_watcher.abort();
        issuers_watcher.abort();
        if let Some(early_watch) = early_watch {
            early_watch.abort();
        }
        let _ = std::fs::remove_file(&socket);
        let _ = ops.await;
    });
    Ok((bound, task))
}

/// The kubelet list's and early issuance's token buckets must let them through.
fn check_kubelet_list_rate(config: &Config) -> Result<(), StartError> {
    if !(config.early_issue_rate.is_finite() && config.early_issue_rate > 0.0)
        || config.early_issue_burst == 0
    {
        return Err(StartError::new(
            "--early-issue-rate/--early-issue-burst (EARLY_ISSUE_RATE/EARLY_ISSUE_BURST)",
            "both must be above zero",
        ));
    }
    if !(config.kubelet_list_rate.is_finite() && config.kubelet_list_rate > 0.0)
        || config.kubelet_list_burst == 0
    {
        return Err(StartError::new(
            "--kubelet-list-rate/--kubelet-list-burst (KUBELET_LIST_RATE/KUBELET_LIST_BURST)",
            "both must be above zero",
        ));
    }
    Ok(())
}

/// The queue every pod identity is issued through, with its limits and metrics.
fn issuance_queue(
    config: &Config,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<Arc<manager::queue::Queue>, StartError> {
    let limits = manager::queue::Limits::new(
        config.max_zts_calls,
        config.max_warmup_issuances,
        config.max_background_issuances,
    )
    .map_err(|e| {
        StartError::new(
            "--max-zts-calls/--max-warmup-issuances/--max-background-issuances \
             (MAX_ZTS_CALLS/MAX_WARMUP_ISSUANCES/MAX_BACKGROUND_ISSUANCES)",
            e,
        )
    })?;
    let metrics = manager::queue::QueueMetrics::register(registry);
    Ok(manager::queue::Queue::new(limits, metrics))
}

/// The ZTS client and the CA bundle Athenz issues instance certificates under, both followed as
/// their files change (docs/design.md §6: a CA rotation reaches the agent with no restart). The
/// issuer bundle's file is read again by the watcher the returned handle spawns.
fn zts_client(
    config: &Config,
) -> Result<(ZtsClient, tls::IssuerCheck, Arc<tls::ReloadingClientCa>), StartError> {
    let ca = tls::ServerCaBundle::from_file(&config.zts_ca)
        .map_err(|e| StartError::new("--zts-ca (ZTS_CA_FILE)", e))?;
    let zts = ZtsClient::new(ZtsClientConfig {
        url: config.zts_url.clone(),
        ca,
        timeout: config.upstream_timeout,
        connect_timeout: config.upstream_timeout.min(Duration::from_secs(5)),
    })
    .map_err(|e| StartError::new("--zts-url (ZTS_URL)", e))?;
    let (path, setting) = match &config.athenz_ca {
        Some(path) => (path, "--athenz-ca (ATHENZ_CA_FILE)"),
        None => (&config.zts_ca, "--zts-ca (ZTS_CA_FILE)"),
    };
    let issuers = tls::ReloadingClientCa::load(path).map_err(|e| StartError::new(setting, e))?;
    Ok((
        zts,
        tls::IssuerCheck::reloading(Arc::clone(&issuers)),
        issuers,
    ))
}

/// The node's own identity, its kept certificate loaded; its token file must exist.
fn node_identity(
    config: &Config,
    zts: &ZtsClient,
    readiness: &Readiness,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<Arc<node_identity::NodeIdentity>, StartError> {
    let node = Arc::new(
        node_identity::NodeIdentity::new(
            node_identity::NodeIdentitySettings {
                principal: config.agent_principal.clone().unwrap_or_else(|| {
                    athenz_core::names::principal(&config.identity.admin_domain, "athenz-agent")
                }),
                provider: config.identity.provider.clone(),
                dns_suffix: config.identity.dns_suffix.clone(),
                node_name: config.node_name.clone(),
                token_file: config.node_token_file.clone(),
                keep_dir: config.node_identity_dir.clone(),
                policy: athenz_core::refresh::RefreshPolicy::default(),
                backoff: athenz_core::refresh::Backoff::default(),
            },
            zts.clone(),
            readiness.clone(),
            registry,
        )
        .map_err(|e| {
            StartError::new(
                "--node-name/--agent-principal (NODE_NAME/AGENT_PRINCIPAL)",
                e,
            )
        })?,
    );
    std::fs::metadata(&config.node_token_file).map_err(|e| {
        StartError::new(
            "--node-token-file (NODE_TOKEN_FILE)",
            format!("{}: {e}", config.node_token_file.display()),
        )
    })?;
    node.load_kept();
    Ok(node)
}

/// The jwt-service's HTTP client, presenting the node's certificate. The jwt-service's
/// certificate comes from ZTS, so its CA bundle is followed as its file changes, as the ZTS
/// client's is (docs/design.md §6): after a CA rotation the jwt-service serves a certificate
/// under the new CA, which a bundle read once at start would refuse.
fn jwt_http_client(
    config: &Config,
    node: &node_identity::NodeIdentity,
) -> Result<reqwest::Client, StartError> {
    let setting = "--jwt-service-ca (JWT_SERVICE_CA_FILE)";
    let bundle = tls::ServerCaBundle::from_file(&config.jwt_service_ca)
        .map_err(|e| StartError::new(setting, e))?;
    let jwt_tls = tls::client_config_with_bundle(&bundle, Some(node.client_identity()))
        .map_err(|e| StartError::new(setting, e))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(jwt_tls)
        .timeout(config.upstream_timeout)
        .build()
        .map_err(|e| StartError::new("--jwt-service-url (JWT_SERVICE_URL)", e))
}

/// The kubelet's HTTP client; its token file, when given, must be readable now.
fn kubelet_client(config: &Config) -> Result<reqwest::Client, StartError> {
    let kubelet_client = {
        let mut b = reqwest::Client::builder().timeout(config.upstream_timeout);
        if let Some(ca) = &config.kubelet_ca {
            let cas = read_cas(ca, "--kubelet-ca (KUBELET_CA_FILE)")?;
            // the kubelet authenticates the agent by its bearer token, not a certificate
            let tls = tls::client_config(&cas, None)
                .map_err(|e| StartError::new("--kubelet-ca (KUBELET_CA_FILE)", e))?;
            b = b.tls_backend_preconfigured(tls);
        }
        b.build()
            .map_err(|e| StartError::new("--kubelet-url (KUBELET_URL)", e))?
    };
    // Checked now so a wrong path stops the agent at start; read again for every list, since
    // projected service-account tokens are rotated by the kubelet.
    if let Some(path) = &config.kubelet_token {
        std::fs::read_to_string(path).map_err(|e| {
            StartError::new(
                "--kubelet-token (KUBELET_TOKEN_FILE)",
                format!("{}: {e}", path.display()),
            )
        })?;
    }
    Ok(kubelet_client)
}

/// Installs the flex driver into the kubelet's plugin dir, when asked.
fn install_flex_driver(config: &Config) -> Result<(), StartError> {
    if let Some(source) = &config.driver_source {
        match install::install_driver(source, &config.flex_plugin_dir) {
            Ok(true) => {
                tracing::info!(dir = %config.flex_plugin_dir.display(), "installed the volume driver")
            }
            Ok(false) => {}
            Err(e) => return Err(StartError::new("--driver-source/--flex-plugin-dir", e)),
        }
    }
    Ok(())
}

/// Binds the agent's socket in its dir, replacing whatever a crashed run left there.
fn bind_socket(config: &Config) -> Result<(PathBuf, tokio::net::UnixListener), StartError> {
    // The socket: a stale one from a crashed run is removed; pods of any uid may connect.
    std::fs::create_dir_all(&config.agent_dir)
        .map_err(|e| StartError::new("--agent-dir (ATHENZ_AGENT_DIR)", e))?;
    let socket = config.agent_dir.join(AGENT_SOCKET_NAME);
    // The socket dir is the agent's own: whatever a crashed run left at the path goes, even a
    // file that is not a socket (unix_socket::bind refuses those on paths it shares).
    match std::fs::remove_file(&socket) {
        Ok(()) => tracing::info!(socket = %socket.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(StartError::new(
                "--agent-dir (ATHENZ_AGENT_DIR)",
                format!("{}: {e}", socket.display()),
            ));
        }
    }
    let listener = athenz_core::unix_socket::bind(
        &socket,
        athenz_core::unix_socket::Access {
            mode: 0o666,
            gid: None,
        },
    )
    .map_err(|e| StartError::new("--agent-dir (ATHENZ_AGENT_DIR)", e))?;
    Ok((socket, listener))
}

/// The `athenz-identity-agent` command: parses `args` (the program name first; a bad setting exits 2 with
/// clap's message) and serves until SIGTERM. `main` runs it, and so does `athenz-devstack` when it
/// re-executes itself under this name.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::io::Result<()> {
    athenz_core::daemon::parse_and_run(args, run_settings, start)
}

/// The process's operations settings and its runtime's workers (`--worker-threads 0`: one per
/// CPU).
fn run_settings(config: &Config) -> athenz_core::daemon::RunSettings {
    athenz_core::daemon::RunSettings {
        worker_threads: (config.worker_threads > 0).then_some(config.worker_threads),
        ..athenz_core::daemon::RunSettings::from_ops(&config.ops)
    }
}

/// `main`: `athenz-identity-agent status …` is the operator's command ([`status`]); anything
/// else runs the daemon ([`main_with_args`]).
pub fn main_dispatch(args: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    if args.get(1).is_some_and(|a| a == "status") {
        return status::main(args.into_iter().skip(2));
    }
    match main_with_args(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "athenz-identity-agent: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    fn config(extra: &[&str]) -> Config {
        let required = [
            "athenz-identity-agent",
            "--kubelet-url=http://127.0.0.1:10255",
            "--jwt-service-url=https://127.0.0.1:1",
            "--node-name=node-1",
            "--node-token-file=t",
            "--jwt-service-ca=c",
            "--zts-url=https://127.0.0.1:2/zts/v1",
            "--zts-ca=c",
            "--provider=k8s.admin.athenz-provider",
            "--dns-suffix=athenz.cloud",
            "--admin-domain=k8s.admin",
        ];
        Config::try_parse_from(required.iter().chain(extra)).unwrap()
    }

    /// One worker unless asked otherwise; 0 is one per CPU.
    #[test]
    fn the_runtime_has_one_worker_unless_set() {
        assert_eq!(run_settings(&config(&[])).worker_threads, Some(1));
        assert_eq!(
            run_settings(&config(&["--worker-threads=4"])).worker_threads,
            Some(4)
        );
        assert_eq!(
            run_settings(&config(&["--worker-threads=0"])).worker_threads,
            None
        );
    }
}
