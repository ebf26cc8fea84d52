//! The agent's command line: every flag with its environment fallback (docs/binaries/athenz-identity-agent.md).

use athenz_core::crypto::KeyAlgorithm;
use athenz_core::daemon::OpsArgs;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

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
