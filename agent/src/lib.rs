//! `athenz-identity-agent`: the node daemon (docs/design.md §4.2, §4.10). Pods reach it through
//! the socket their volume holds, the kubelet through the CSI driver, and the API server's
//! bindings through a watch. Its code reads by concern (docs/architecture.md, "The agent"):
//! [`attest`] (who is calling: which pod, and who on this node says so), [`manager`] (what is
//! issued and held: every issuance through one queue by priority, and the volumes' records) and
//! [`serve`] (how it is served: the socket's routes, CSI, the tunnel to ZTS).

pub mod attest;
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

use athenz_core::crypto::KeyAlgorithm;
use athenz_core::daemon::{OpsArgs, Shutdown, StartError};
use athenz_core::http::{HttpMetrics, Listener, Readiness, Server, ServerLimits};
use athenz_core::tls;
use athenz_core::volume::{AGENT_SOCKET_NAME, VolumesDir};
use athenz_core::zts::{ZtsClient, ZtsClientConfig};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Command line of `athenz-identity-agent`; every flag has an environment fallback.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "athenz-identity-agent",
    version,
    about = "Node agent issuing Athenz identities to pods"
)]
pub struct Config {
    /// Directory of the socket (bound into every pod by the flex driver).
    #[arg(long, env = "ATHENZ_AGENT_DIR", default_value = athenz_core::volume::DEFAULT_AGENT_DIR)]
    pub agent_dir: PathBuf,
    /// Directory of the volumes the flex driver makes.
    #[arg(long, env = "ATHENZ_VOLUMES_DIR", default_value = athenz_core::volume::DEFAULT_VOLUMES_DIR)]
    pub volumes_dir: PathBuf,
    /// Kubelet base URL: https://<node>:10250 (with --kubelet-ca and a token or the node certificate) or the read-only http://127.0.0.1:10255.
    #[arg(long, env = "KUBELET_URL")]
    pub kubelet_url: String,
    /// CA bundle of the kubelet's serving certificate (https).
    #[arg(long, env = "KUBELET_CA_FILE")]
    pub kubelet_ca: Option<PathBuf>,
    /// Bearer token file for the kubelet (e.g. the service-account token).
    #[arg(long, env = "KUBELET_TOKEN_FILE")]
    pub kubelet_token: Option<PathBuf>,
    /// How long the kubelet's pod list is reused.
    #[arg(long, env = "KUBELET_CACHE_TTL", default_value = "1s", value_parser = athenz_core::refresh::parse_duration)]
    pub kubelet_cache_ttl: Duration,
    /// Kubelet pod lists allowed back to back when pods the agent has not seen arrive at once
    /// (each missing pod needs a list made after it arrived; concurrent misses share one).
    #[arg(long, env = "KUBELET_LIST_BURST", default_value_t = 20)]
    pub kubelet_list_burst: u32,
    /// Kubelet pod lists per second in the long run, however fast pods arrive or unknown ones
    /// are asked for.
    #[arg(long, env = "KUBELET_LIST_RATE", default_value_t = 50.0)]
    pub kubelet_list_rate: f64,
    /// How long to wait for the kubelet to list a pod it has not listed yet.
    #[arg(long, env = "POD_WAIT", default_value = "5s", value_parser = athenz_core::refresh::parse_duration)]
    pub pod_wait: Duration,
    /// When this node started, Unix seconds (default: the kernel's `btime` in /proc/stat). A
    /// pod IP the kubelet lists from a sandbox made before it is not the pod's IP any more
    /// (that sandbox died with the node): no identity names it. Set it only where a node is
    /// restarted without rebooting its host (a test bed).
    #[arg(long, env = "NODE_BOOT_TIME")]
    pub node_boot_time: Option<i64>,
    /// jwt-service base URL (https).
    #[arg(long, env = "JWT_SERVICE_URL")]
    pub jwt_service_url: String,
    /// This node's name (the agent's instance id; in a DaemonSet, `spec.nodeName` by the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The agent pod's projected service-account token (audience `athenz-node`), which attests
    /// the node identity to ZTS; re-read for every renewal, as the kubelet rotates it.
    #[arg(long, env = "NODE_TOKEN_FILE")]
    pub node_token_file: PathBuf,
    /// The node agents' Athenz principal; default `<admin-domain>.athenz-agent`.
    #[arg(long, env = "AGENT_PRINCIPAL")]
    pub agent_principal: Option<String>,
    /// Keep the node key and certificate here (0600) so a restarted agent serves at once; a
    /// memory-backed volume of the agent pod. Unset: memory only.
    #[arg(long, env = "NODE_IDENTITY_DIR")]
    pub node_identity_dir: Option<PathBuf>,
    /// Whether a caller on the socket must be a process of the volume's pod (its cgroup names
    /// the pod UID): enforce (403 otherwise), log (allow, log the mismatch) or off.
    #[arg(long, env = "PEER_CHECK", value_enum, default_value_t = athenz_core::peer::PeerCheck::Enforce)]
    pub peer_check: athenz_core::peer::PeerCheck,
    /// CA bundle verifying the jwt-service.
    #[arg(long, env = "JWT_SERVICE_CA_FILE")]
    pub jwt_service_ca: PathBuf,
    /// ZTS base URL ending in /zts/v1.
    #[arg(long, env = "ZTS_URL")]
    pub zts_url: String,
    /// CA bundle verifying ZTS.
    #[arg(long, env = "ZTS_CA_FILE")]
    pub zts_ca: PathBuf,
    /// How often --zts-ca is read again: a changed bundle is published to the pods (beside the
    /// socket, `zts-ca.pem`) and told to those refreshing through the tunnel.
    #[arg(long, env = "ZTS_CA_RELOAD_INTERVAL", default_value = "30s", value_parser = athenz_core::refresh::parse_duration)]
    pub zts_ca_reload_interval: Duration,
    /// CA bundle that issues Athenz instance certificates: a certificate a pod presents for
    /// refresh must chain to it, or it is refused before ZTS sees it. Default: the --zts-ca
    /// bundle (right when one CA signs both, as in the devstack; set it when ZTS's server
    /// certificate comes from another CA).
    #[arg(long, env = "ATHENZ_CA_FILE")]
    pub athenz_ca: Option<PathBuf>,
    /// Provider, DNS suffix and namespace mapping (shared with the callback).
    #[command(flatten)]
    pub identity: athenz_core::daemon::PodIdentityArgs,
    /// Cluster DNS domain; when set, `<service>.<namespace>.svc.<domain>` is looked up for a service IP SAN.
    #[arg(long, env = "CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    /// DNS server for that lookup (`ip:port`, e.g. the cluster DNS service `10.96.0.10:53`; the agent
    /// runs with the host network, whose resolver does not know cluster names). Without it: the
    /// system resolver.
    #[arg(long, env = "DNS_RESOLVER")]
    pub dns_resolver: Option<std::net::SocketAddr>,
    /// Where the keys of socket-mode pods (flex, csi-socket) are made: `pod` (the SIA makes its
    /// key and sends only a CSR; no key crosses the socket; refreshes go to ZTS from the pod,
    /// through this agent's CONNECT tunnel) or `agent` (the agent makes each key, hands it
    /// over and is shown it at every refresh). CSI files-mode volumes always get agent-made keys.
    #[arg(long, env = "KEY_SOURCE", value_enum, default_value_t = athenz_core::agent_api::KeySource::Pod)]
    pub key_source: athenz_core::agent_api::KeySource,
    /// Most CONNECT tunnels to ZTS open at once (pod-made keys).
    #[arg(long, env = "MAX_TUNNELS", default_value_t = 64)]
    pub max_tunnels: usize,
    /// Key type the agent makes for pods (agent-made keys and CSI files mode): p256 or rsa2048.
    #[arg(long, env = "KEY_ALGORITHM", default_value = "p256")]
    pub key_algorithm: KeyAlgorithm,
    /// Most RSA keys made ahead in the background (the pool follows recent demand up to this;
    /// 0: none). P-256 keys are cheap and always made on the request path.
    #[arg(long, env = "KEY_POOL_MAX", default_value_t = 32)]
    pub key_pool_max: usize,
    /// Most identities issued at once (each holds one jwt-service call, a key generation and one
    /// ZTS call); the rest queue. Bounds upstream connections and memory when many pods start.
    #[arg(long, env = "MAX_ZTS_CALLS", default_value_t = 8)]
    pub max_zts_calls: usize,
    /// Most of those that are early issuances (`--csi-early-issue`: for pods bound here, before
    /// their publish). A flood of pods bound here and deleted at once costs at most this many
    /// registrations at a time; the rest are cancelled while they wait. With
    /// --max-background-issuances, below --max-zts-calls: the kubelet's and pods' own requests
    /// always find a slot.
    #[arg(long, env = "MAX_WARMUP_ISSUANCES", default_value_t = 2)]
    pub max_warmup_issuances: usize,
    /// Early issuances started per second in the long run, however fast pods are bound here
    /// (and deleted again): a tenant's flood of bindings costs ZTS at most this many
    /// registrations a second; the rest wait, are cancelled with their pod, or are overtaken by
    /// their publish (which registers itself).
    #[arg(long, env = "EARLY_ISSUE_RATE", default_value_t = 5.0)]
    pub early_issue_rate: f64,
    /// Early issuances started back to back after a quiet spell (a Deployment scaled up).
    #[arg(long, env = "EARLY_ISSUE_BURST", default_value_t = 32)]
    pub early_issue_burst: u32,
    /// Most of those that are files-mode re-issues at their refresh time.
    #[arg(long, env = "MAX_BACKGROUND_ISSUANCES", default_value_t = 2)]
    pub max_background_issuances: usize,
    /// Threads serving requests (0: one per CPU). One serves a node: an identity costs the agent
    /// about a millisecond of CPU, the rest is waiting on the kubelet, the jwt-service and ZTS;
    /// a second worker only adds the wake-ups of handing work between them (measured: 15 % more
    /// CPU per identity one at a time). Key generation and blocking work have threads of their own.
    #[arg(long, env = "AGENT_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,
    /// Time allowed for one upstream call (kubelet, jwt-service, ZTS).
    #[arg(long, env = "UPSTREAM_TIMEOUT", default_value = "10s", value_parser = athenz_core::refresh::parse_duration)]
    pub upstream_timeout: Duration,
    /// Driver binary to install into the flex plugin dir at start.
    #[arg(long, env = "DRIVER_SOURCE")]
    pub driver_source: Option<PathBuf>,
    /// Kubelet's flex volume plugin dir.
    #[arg(
        long,
        env = "FLEX_PLUGIN_DIR",
        default_value = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
    )]
    pub flex_plugin_dir: PathBuf,
    /// Serve the CSI driver csi.athenz.io on this Unix socket (kubelet finds it through the
    /// registration below, or a node-driver-registrar); unset: no CSI. The usual path is
    /// /var/lib/kubelet/plugins/csi.athenz.io/csi.sock.
    #[arg(long, env = "CSI_SOCKET")]
    pub csi_socket: Option<PathBuf>,
    /// kubelet's plugin registration directory (/var/lib/kubelet/plugins_registry on the
    /// host): with --csi-socket the agent registers the driver with kubelet itself, serving
    /// csi.athenz.io-reg.sock there (the node-driver-registrar's job); unset: it does not.
    #[arg(long, env = "CSI_REGISTRATION_DIR", requires = "csi_socket")]
    pub csi_registration_dir: Option<PathBuf>,
    /// The CSI socket's path as kubelet dials it on the host, which the registration gives
    /// kubelet (the agent's container may mount it elsewhere); default: --csi-socket.
    #[arg(long, env = "CSI_KUBELET_SOCKET", requires = "csi_registration_dir")]
    pub csi_kubelet_socket: Option<PathBuf>,
    /// Size in bytes of each CSI files-mode volume's tmpfs (its credential set is a few KiB).
    #[arg(long, env = "CSI_TMPFS_BYTES", default_value_t = athenz_core::volume_mount::files_mode::DEFAULT_FILES_TMPFS_BYTES)]
    pub csi_tmpfs_bytes: u64,
    /// Longest a CSI files-mode publish waits for the first identity before answering
    /// UNAVAILABLE, which kubelet retries (its own call timeout is 2 minutes).
    #[arg(long, env = "CSI_ISSUE_TIMEOUT", default_value = "60s", value_parser = athenz_core::refresh::parse_duration)]
    pub csi_issue_timeout: Duration,
    /// Issue a files-mode pod's identity as soon as the API server binds the pod to this node,
    /// before the kubelet's publish asks (docs/design.md §4.10): watches this node's pending
    /// pods that carry the injection label, which needs `list` and `watch` on pods.
    #[arg(long, env = "CSI_EARLY_ISSUE", default_value_t = false, action = clap::ArgAction::Set, requires = "csi_socket")]
    pub csi_early_issue: bool,
    /// Kubernetes API URL for `--csi-early-issue` (plain, no auth; for the local stack).
    /// Without it: the in-cluster configuration or kubeconfig.
    #[arg(long, env = "KUBE_API_URL")]
    pub kube_api_url: Option<String>,
    /// The latest a CSI files-mode certificate is re-issued, whatever its lifetime (as the
    /// SIA's REFRESH_INTERVAL); normally it is re-issued at 70 % of its lifetime.
    #[arg(long, env = "CSI_REFRESH_INTERVAL", default_value = "24h", value_parser = athenz_core::refresh::parse_duration)]
    pub csi_refresh_interval: Duration,
    /// Operations endpoint and logging.
    #[command(flatten)]
    pub ops: OpsArgs,
}

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
    let (zts, athenz_ca) = zts_client(&config)?;
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

/// The ZTS client and the CA bundle Athenz issues instance certificates under.
fn zts_client(config: &Config) -> Result<(ZtsClient, tls::IssuerCheck), StartError> {
    let zts = ZtsClient::new(ZtsClientConfig {
        url: config.zts_url.clone(),
        ca_certs: read_cas(&config.zts_ca, "--zts-ca (ZTS_CA_FILE)")?,
        timeout: config.upstream_timeout,
        connect_timeout: config.upstream_timeout.min(Duration::from_secs(5)),
    })
    .map_err(|e| StartError::new("--zts-url (ZTS_URL)", e))?;
    let athenz_ca = match &config.athenz_ca {
        Some(path) => read_cas(path, "--athenz-ca (ATHENZ_CA_FILE)")?,
        None => read_cas(&config.zts_ca, "--zts-ca (ZTS_CA_FILE)")?,
    };
    let athenz_ca = tls::IssuerCheck::new(&athenz_ca)
        .map_err(|e| StartError::new("--athenz-ca (ATHENZ_CA_FILE)", e))?;
    Ok((zts, athenz_ca))
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

/// The jwt-service's HTTP client, presenting the node's certificate.
fn jwt_http_client(
    config: &Config,
    node: &node_identity::NodeIdentity,
) -> Result<reqwest::Client, StartError> {
    let jwt_tls = tls::client_config(
        &read_cas(
            &config.jwt_service_ca,
            "--jwt-service-ca (JWT_SERVICE_CA_FILE)",
        )?,
        Some(node.client_identity()),
    )
    .map_err(|e| StartError::new("--jwt-service-ca (JWT_SERVICE_CA_FILE)", e))?;
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
