//! `athenz-callback`: the Athenz instance-provider endpoint (docs/design.md §4.4). ZTS asks it,
//! over mutual TLS, whether a launch or refresh is genuine; it verifies the identity JWT the node's
//! jwt-service signed, reads the pod from the Kubernetes API, and checks every requested name.

pub mod checks;
pub mod decision;
pub mod handler;
pub mod keys;
pub mod node;
pub mod pod_cache;
pub mod pods;
pub mod replay;

use athenz_core::daemon::{OpsArgs, Shutdown, StartError, TlsServerArgs};
use athenz_core::http::{HttpMetrics, Readiness};
use clap::Parser;
use jsonwebtoken::Algorithm;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Command line of `athenz-callback`; every flag has an environment fallback.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "athenz-callback",
    version,
    about = "Athenz provider callback: confirms pod identities for ZTS"
)]
pub struct Config {
    /// The TLS server (`--allowed-principals` are the ZTS principals).
    #[command(flatten)]
    pub tls: TlsServerArgs,
    /// Operations endpoint and logging.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// Path prefix of /instance and /refresh (the provider endpoint's path).
    #[arg(long, env = "BASE_PATH", default_value = "/")]
    pub base_path: String,
    /// Provider, DNS suffix and namespace mapping (shared with the agent).
    #[command(flatten)]
    pub identity: athenz_core::daemon::PodIdentityArgs,
    /// Directory of JWT public keys `v<N>.pem`.
    #[arg(long, env = "JWT_PUBLIC_KEYS_DIR")]
    pub public_keys_dir: PathBuf,
    /// How often the public keys are re-read.
    #[arg(long, env = "KEYS_RELOAD_INTERVAL", default_value = "5s", value_parser = athenz_core::refresh::parse_duration)]
    pub keys_reload_interval: Duration,
    /// JWT algorithms accepted (ES256, RS256; none and HMAC can never be enabled).
    #[arg(
        long,
        env = "JWT_ALGORITHMS",
        value_delimiter = ',',
        default_value = "ES256,RS256"
    )]
    pub algorithms: Vec<String>,
    /// Expected `aud`.
    #[arg(long, env = "JWT_AUDIENCE", default_value = athenz_core::identity_jwt::DEFAULT_AUDIENCE)]
    pub audience: String,
    /// Expected `iss` (empty: not checked).
    #[arg(long, env = "JWT_ISSUER", default_value = athenz_core::identity_jwt::DEFAULT_ISSUER)]
    pub issuer: String,
    /// Allowed clock skew.
    #[arg(long, env = "CLOCK_SKEW", default_value = "60s", value_parser = athenz_core::refresh::parse_duration)]
    pub clock_skew: Duration,
    /// Longest remaining validity a JWT may have (its jti is remembered that long).
    #[arg(long, env = "MAX_TOKEN_LIFETIME", default_value = "1h", value_parser = athenz_core::refresh::parse_duration)]
    pub max_token_lifetime: Duration,
    /// Most token ids remembered for replay detection.
    #[arg(long, env = "REPLAY_CACHE_SIZE", default_value_t = 200_000)]
    pub replay_cache_size: usize,
    /// Certificate lifetime granted (certExpiryTime), minutes.
    #[arg(long, env = "CERT_EXPIRY_MINUTES", default_value_t = 1440)]
    pub cert_expiry_minutes: u32,
    /// The node agents' Athenz principal (docs/design.md §4.9); default
    /// `<admin-domain>.athenz-agent`. A registration for it is attested by a service-account token,
    /// not an identity JWT.
    #[arg(long, env = "AGENT_PRINCIPAL")]
    pub agent_principal: Option<String>,
    /// Audience the agents' projected service-account tokens are minted for.
    #[arg(long, env = "NODE_TOKEN_AUDIENCE", default_value = "athenz-node")]
    pub node_token_audience: String,
    /// Namespace of the agent pods.
    #[arg(long, env = "AGENT_NAMESPACE", default_value = "athenz-system")]
    pub agent_namespace: String,
    /// Service account of the agent pods.
    #[arg(long, env = "AGENT_SERVICE_ACCOUNT", default_value = "athenz-agent")]
    pub agent_service_account: String,
    /// Kubernetes API URL (plain, no auth; for the local stack). Without it: in-cluster config or kubeconfig.
    #[arg(long, env = "KUBE_API_URL")]
    pub kube_api_url: Option<String>,
    /// Time allowed for one Kubernetes API call.
    #[arg(long, env = "KUBE_API_TIMEOUT", default_value = "5s", value_parser = athenz_core::refresh::parse_duration)]
    pub kube_api_timeout: Duration,
    /// Keep a watch-fed copy of the pods, so most confirmations read no pod from the API
    /// (needs `list` and `watch` on pods; without them every confirmation reads its pod).
    #[arg(long, env = "POD_CACHE", default_value_t = true, action = clap::ArgAction::Set)]
    pub pod_cache: bool,
    /// Label selector of the pods the cache holds (empty: all); a pod outside it is read from
    /// the API when confirmed. The default holds the pods the initializer injected, so the
    /// replicas neither receive nor keep the cluster's other pods.
    #[arg(long, env = "POD_CACHE_SELECTOR", default_value = athenz_core::volume_mode::INJECTED_LABEL)]
    pub pod_cache_selector: String,
    /// Field selector of the pods the cache holds (empty: all). The default holds a pod only
    /// while it is bound to a node and `Pending`, when its first certificate is confirmed (a
    /// CSI publish and an init container both come before the pod runs): a running pod's
    /// status and deletion events, most of a pod's watch events, are then never sent to the
    /// replicas, and a refresh reads its pod with one `GET`.
    #[arg(long, env = "POD_CACHE_FIELDS", default_value = pod_cache::PENDING_ON_A_NODE)]
    pub pod_cache_fields: String,
}

pub use athenz_core::daemon::Bound;

fn algorithms(names: &[String]) -> Result<Vec<Algorithm>, StartError> {
    let setting = "--algorithms (JWT_ALGORITHMS)";
    let mut algs = Vec::new();
    for name in names {
        let alg = match name.trim() {
            "ES256" => Algorithm::ES256,
            "RS256" => Algorithm::RS256,
            other => {
                return Err(StartError::new(
                    setting,
                    format!("{other:?} is not allowed: use ES256 and/or RS256"),
                ));
            }
        };
        algs.push(alg);
    }
    if algs.is_empty() {
        return Err(StartError::new(setting, "no algorithm"));
    }
    Ok(algs)
}

fn node_policy(config: &Config) -> Result<decision::NodePolicy, StartError> {
    use athenz_core::names;
    let principal = config
        .agent_principal
        .clone()
        .unwrap_or_else(|| names::principal(&config.identity.admin_domain, "athenz-agent"));
    names::split_service_name("agent principal", &principal)
        .map_err(|e| StartError::new("--agent-principal (AGENT_PRINCIPAL)", e))?;
    names::validate_dns_label("agent namespace", &config.agent_namespace)
        .map_err(|e| StartError::new("--agent-namespace (AGENT_NAMESPACE)", e))?;
    names::validate_dns_subdomain("agent service account", &config.agent_service_account)
        .map_err(|e| StartError::new("--agent-service-account (AGENT_SERVICE_ACCOUNT)", e))?;
    if config.node_token_audience.trim().is_empty() {
        return Err(StartError::new(
            "--node-token-audience (NODE_TOKEN_AUDIENCE)",
            "must not be empty",
        ));
    }
    Ok(decision::NodePolicy {
        principal,
        audience: config.node_token_audience.clone(),
        namespace: config.agent_namespace.clone(),
        service_account: config.agent_service_account.clone(),
    })
}

/// Starts the callback; it runs until `shutdown` is triggered.
pub async fn start(
    config: Config,
    shutdown: Shutdown,
) -> Result<(Bound, tokio::task::JoinHandle<()>), StartError> {
    if !config.base_path.starts_with('/') {
        return Err(StartError::new(
            "--base-path (BASE_PATH)",
            "must start with /",
        ));
    }
    let mapper = config.identity.mapper()?;
    let node = node_policy(&config)?;
    let keys = Arc::new(
        keys::PublicKeys::load(&config.public_keys_dir)
            .map_err(|e| StartError::new("--public-keys-dir (JWT_PUBLIC_KEYS_DIR)", e))?,
    );
    let mut registry = prometheus_client::registry::Registry::with_prefix("athenz_callback");
    let api_latency = Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ]);
    registry.register(
        "kube_api_duration_seconds",
        "Kubernetes API call latency",
        api_latency.clone(),
    );
    let cluster = pods::Cluster::connect(
        config.kube_api_url.as_deref(),
        config.kube_api_timeout,
        api_latency,
    )
    .await
    .map_err(|e| StartError::new("--kube-api-url (KUBE_API_URL)", e))?;
    // a namespace's athenz.io/domain annotation, read only when the install allows domains by
    // annotation
    let domains = athenz_core::names::NamespaceDomains::new(
        mapper.clone(),
        Some(Arc::new(athenz_core::names::KubeNamespaces::new(
            cluster.client(),
            config.kube_api_timeout,
        ))),
    );
    let pod_cache = config.pod_cache.then(pod_cache::PodCache::default);
    let pod_watch = pod_cache.as_ref().map(|cache| {
        let held = Gauge::<i64>::default();
        registry.register("pod_cache_pods", "Pods held by the pod cache", held.clone());
        let answered = cluster.clone();
        let counted = cache.clone();
        cache.spawn_watch(
            cluster.watch_client(),
            &pod_cache::Selectors {
                labels: &config.pod_cache_selector,
                fields: &config.pod_cache_fields,
            },
            move || {
                answered.note_answer();
                held.set(i64::try_from(counted.len()).unwrap_or(i64::MAX));
            },
        )
    });
    let setup = config.tls.load().await?;
    let api = setup
        .local_addr()
        .map_err(|e| StartError::new("--listen (LISTEN)", e))?;
    let ops_listener = config.ops.bind().await?;
    let http_metrics = HttpMetrics::register_tls(&mut registry);
    let handler = Arc::new(handler::CallbackHandler {
        base_path: config.base_path.clone(),
        allowed: setup.allowed.clone(),
        policy: decision::Policy {
            provider: config.identity.provider.clone(),
            algorithms: algorithms(&config.algorithms)?,
            audience: config.audience.clone(),
            issuer: (!config.issuer.is_empty()).then(|| config.issuer.clone()),
            skew_secs: i64::try_from(config.clock_skew.as_secs()).unwrap_or(60),
            max_lifetime_secs: i64::try_from(config.max_token_lifetime.as_secs()).unwrap_or(3600),
            mapper,
            dns_suffix: config.identity.dns_suffix.clone(),
            node,
        },
        keys: keys.clone(),
        replay: replay::ReplayCache::new(config.replay_cache_size),
        cluster: cluster.clone(),
        domains,
        pod_cache,
        cert_expiry_minutes: config.cert_expiry_minutes,
        metrics: handler::CallbackMetrics::register(&mut registry),
    });
    let readiness = Readiness::default();
    let kids = keys.kids();
    let key_watcher = keys.spawn_watcher(config.keys_reload_interval);
    // readiness follows whether the Kubernetes API answers: the confirmations' own reads and the
    // pod watch's events show it while they come; only a callback without one in the period
    // asks `/version` (on the reload thread's ticks: an idle callback's CPU is its wake-ups)
    let probe = {
        let readiness = readiness.clone();
        tokio::spawn(async move {
            const PERIOD: Duration = Duration::from_secs(5);
            let ticks = athenz_core::periodic::Ticks::new(PERIOD);
            loop {
                readiness.set(cluster.reachable_within(PERIOD).await);
                ticks.tick().await;
            }
        })
    };
    let (bound, task) = athenz_core::daemon::spawn_serving(
        api,
        ops_listener,
        registry,
        readiness,
        [key_watcher, probe].into_iter().chain(pod_watch).collect(),
        setup.serve(handler, http_metrics, shutdown.wait()),
        &shutdown,
    )?;
    tracing::info!(api = %bound.api, ops = %bound.ops, ?kids, "callback listening");
    Ok((bound, task))
}

/// The `athenz-callback` command: parses `args` (the program name first; a bad setting exits 2 with
/// clap's message) and serves until SIGTERM. `main` runs it, and so does `athenz-devstack` when it
/// re-executes itself under this name.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::io::Result<()> {
    athenz_core::daemon::parse_and_run(
        args,
        |c: &Config| athenz_core::daemon::RunSettings::from_ops(&c.ops),
        start,
    )
}
