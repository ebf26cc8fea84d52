//! `cluster.json`: what a running cluster tells scripts and tests (docs/design.md §5.1), written
//! only once the node is Ready.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `{url, ca}` of the API server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiServer {
    /// `https://<node ip>:<port>`.
    pub url: String,
    /// The cluster CA, which verifies it.
    pub ca: PathBuf,
}

/// `{socket, namespace}` of containerd.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Containerd {
    /// Its gRPC socket (`ctr --address`, the kubelet's CRI endpoint).
    pub socket: PathBuf,
    /// The namespace the CRI plugin uses, where images must be imported.
    pub namespace: String,
}

/// One node of the cluster, in `cluster.json`'s `nodes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Its name (the primary's is also `node_name`).
    pub name: String,
    /// Its address.
    pub ip: String,
    /// Its pod range.
    pub pod_cidr: String,
    /// Its containerd.
    pub containerd: Containerd,
    /// A further node's namespaces (`nsenter --net --mount` runs a command on it); absent on
    /// the primary, which is the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<NodeNamespaceFiles>,
}

impl NodeInfo {
    /// A command running `program` on this node as its root would: inside a further node's
    /// namespaces (through `nsenter`), as it is on the primary.
    pub fn command(&self, program: &str) -> std::process::Command {
        match &self.namespaces {
            Some(ns) => super::nodes::NodeNamespaces {
                net: ns.net.clone(),
                mount: ns.mount.clone(),
            }
            .command(Path::new(program)),
            None => std::process::Command::new(program),
        }
    }
}

/// The files naming a further node's namespaces.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeNamespaceFiles {
    /// Its network namespace (`/run/netns/<name>`).
    pub net: PathBuf,
    /// Its mount namespace.
    pub mount: PathBuf,
}

/// `cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub api_server: ApiServer,
    /// The primary node's name (the host's node).
    pub node_name: String,
    /// The primary node's address (the API server's advertise address, its kubelet's node IP).
    pub node_ip: String,
    /// What the API server's /version says, e.g. `v1.37.2`.
    pub kubernetes_version: String,
    /// The primary node's containerd.
    pub containerd: Containerd,
    /// The directory of the binaries (`kubectl` is there).
    pub kube_bin: PathBuf,
    /// The admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// The sandbox image containerd uses.
    pub pause_image: String,
    /// The primary node's pod range.
    pub pod_cidr: String,
    /// The Services' range.
    pub service_cidr: String,
    /// One log per component.
    pub logs: PathBuf,
    /// Each component's pid, by name, and `cluster up`'s own as `supervisor`.
    pub pids: BTreeMap<String, u32>,
    /// Every node, the primary first.
    #[serde(default)]
    pub nodes: Vec<NodeInfo>,
    /// The dev ZTS beside the cluster (`{url, ca}`); absent with `--bare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zts: Option<crate::stack_json::UrlCa>,
    /// The release image the workloads run; absent with `--bare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The overlay applied (`kubectl apply -k`); absent with `--bare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<PathBuf>,
}

impl ClusterInfo {
    /// Reads `cluster.json`.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
}
