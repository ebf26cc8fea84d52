//! `stack.json`: what a running stack tells scripts and tests (its addresses, credentials, nodes
//! and settings). The contract of `athenz-devstack up`.
//!
//! Plain data, apart from [`crate::stack`] that writes it, so what reads it (the pod runtimes,
//! the kubelet player, the pods' volumes) does not depend on the stack itself.

use athenz_core::agent_api::KeySource;
use athenz_core::peer::PeerCheck;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `{url, ca}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UrlCa {
    /// Base URL.
    pub url: String,
    /// CA bundle that verifies it.
    pub ca: PathBuf,
}

/// `{url}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Url {
    /// Base URL.
    pub url: String,
}

/// The callback: URL without a path, and the path of its routes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallbackInfo {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Starts with `/`.
    pub base_path: String,
}

/// The agent: its socket and metrics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentInfo {
    /// `<agent_dir>/agent.sock`.
    pub socket: PathBuf,
    /// Full `/metrics` URL.
    pub metrics_url: String,
}

/// A certificate, its key and the CA bundle that verifies the stack's servers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credential {
    /// Leaf + chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA bundle.
    pub ca: PathBuf,
}

/// The three principals tests need.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credentials {
    /// `sys.auth.zts`: what the callback accepts.
    pub zts: Credential,
    /// The first node's agent identity (its node certificate from ZTS): what the jwt-service
    /// accepts, for that node's pods.
    pub node: Credential,
    /// A principal allowed nowhere.
    pub stranger: Credential,
}

/// One node of the stack (docs/design.md §5, `up --nodes N`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
    /// Its kubelet stand-in.
    pub kubelet: Url,
    /// Its agent.
    pub agent: NodeAgentInfo,
    /// Its volumes dir (the driver's ATHENZ_VOLUMES_DIR).
    pub volumes_dir: PathBuf,
    /// Its agent's socket dir (the driver's ATHENZ_AGENT_DIR).
    pub agent_dir: PathBuf,
    /// That node's own agent identity (cert, key, CA).
    pub credentials: Credential,
}

/// A node's agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeAgentInfo {
    /// `<agent_dir>/agent.sock`.
    pub socket: PathBuf,
    /// Full `/metrics` URL.
    pub metrics_url: String,
    /// Its CSI socket, when it serves CSI (else `null`).
    pub csi_socket: Option<PathBuf>,
    /// Its pod, as the API stand-in holds it (scheduled on this node).
    pub pod: crate::kube::PodRef,
}

/// How node agents attest (docs/design.md §4.9).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeAttestation {
    /// Audience of their projected tokens.
    pub audience: String,
    /// Their pods' namespace.
    pub namespace: String,
    /// Their pods' service account.
    pub service_account: String,
    /// Their Athenz principal.
    pub principal: String,
}

/// `<state-dir>/stack.json` (docs/design.md §5).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackInfo {
    /// Dev ZTS; `url` ends in `/zts/v1`.
    pub zts: UrlCa,
    /// Kubernetes API stand-in (plain http on loopback).
    pub kube_api: Url,
    /// Kubelet stand-in (plain http on loopback).
    pub kubelet: Url,
    pub jwt_service: Url,
    /// Provider callback.
    pub callback: CallbackInfo,
    /// Admission webhook (`POST <url>/mutate`).
    pub initializer: Url,
    /// Node agent.
    pub agent: AgentInfo,
    /// The agent's and driver's volumes dir.
    pub volumes_dir: PathBuf,
    /// The agent's socket dir.
    pub agent_dir: PathBuf,
    /// The node.
    pub node_name: String,
    /// argv prefix running the real driver (reads ATHENZ_VOLUMES_DIR / ATHENZ_AGENT_DIR).
    pub volume_driver: Vec<String>,
    /// argv prefix running the real pod SIA.
    pub sia: Vec<String>,
    /// Provider name.
    pub provider: String,
    /// DNS suffix, no leading dot.
    pub dns_suffix: String,
    /// Admin domain.
    pub admin_domain: String,
    /// Where the callback reads the JWT public keys (v<N>.pem).
    pub jwt_public_keys_dir: PathBuf,
    /// Client credentials.
    pub credentials: Credentials,
    /// Every node, the first being the one the fields above describe.
    pub nodes: Vec<NodeInfo>,
    /// How node agents attest.
    pub node_attestation: NodeAttestation,
    /// The agents' `--peer-check`.
    pub peer_check: PeerCheck,
    /// Where socket-mode pods' keys are made: the agents' and the SIAs' `--key-source`.
    #[serde(default)]
    pub key_source: KeySource,
    /// The key type made for pods (the agents' `--key-algorithm`, and the SIAs' with pod-made
    /// keys).
    #[serde(default = "default_key_algorithm")]
    pub key_algorithm: String,
    /// How pods' processes are started: a container runtime or plain processes, and why.
    #[serde(default)]
    pub runtime: RuntimeInfo,
    /// Where pod cgroups are made (kubelet-shaped, `kubepods-pod<uid_>.slice/…`); `null` when
    /// this host lets the stack make none (then `peer_check` is `off` unless overridden).
    pub pod_cgroup_root: Option<PathBuf>,
    /// Process ids by component (they change when a component is restarted).
    pub processes: BTreeMap<String, u32>,
}

fn default_key_algorithm() -> String {
    "p256".into()
}

/// How the stack starts pods' processes (`--runtime`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuntimeInfo {
    /// `runc`, `crun` or `process`.
    pub kind: athenz_testbed::runtime::RuntimeKind,
    /// Why this one (asked for, or what the host has).
    pub reason: String,
    /// The runtime's `--root` and the containers' bundles, image and logs; `null` for
    /// `process`.
    pub state_dir: Option<PathBuf>,
    /// The first component of every container's `linux.cgroupsPath` (kubelet's
    /// `--cgroup-root`), the stack's own; `null` for `process`.
    pub cgroup_root: Option<String>,
}

impl Default for RuntimeInfo {
    /// What a `stack.json` from before runtimes described.
    fn default() -> Self {
        Self {
            kind: athenz_testbed::runtime::RuntimeKind::Process,
            reason: "not recorded".into(),
            state_dir: None,
            cgroup_root: None,
        }
    }
}
