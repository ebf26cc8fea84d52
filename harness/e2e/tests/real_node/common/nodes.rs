//! Reaching into one node of a cluster with several (`cluster up --nodes N`) as that node's own
//! root would: its agent's process and the files its container holds (its tokens and node
//! certificate), its CSI socket and kubelet root, its volume records.

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::info::{ClusterInfo, NodeInfo};
use athenz_devstack::cluster::nodes;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario, Workload};
use athenz_devstack::cluster::tenant_pods;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The agent's binary name (deploy/base/agent.yaml's command).
const AGENT: &str = "athenz-identity-agent";

/// The kubelet root of node `index` as the host sees it: `/var/lib/kubelet` on the primary,
/// the directory bound over it in a further node's mount namespace.
pub fn kubelet_root(state_dir: &Path, index: usize) -> PathBuf {
    let root = match index {
        0 => PathBuf::from(nodes::KUBELET_ROOT),
        i => own_path(state_dir, i, nodes::KUBELET_ROOT),
    };
    assert!(
        root.join("pods").is_dir(),
        "{} is not node {}'s kubelet root",
        root.display(),
        index + 1
    );
    root
}

/// `/var/athenz` of node `index` as the host sees it (see [`kubelet_root`]).
pub fn agent_host_dir(state_dir: &Path, index: usize) -> PathBuf {
    match index {
        0 => PathBuf::from(nodes::AGENT_HOST_DIR),
        i => own_path(state_dir, i, nodes::AGENT_HOST_DIR),
    }
}

/// A further node's own `path`, as the host sees it.
fn own_path(state_dir: &Path, index: usize, path: &str) -> PathBuf {
    nodes::host_path(&node_dir(state_dir, index), Path::new(path))
        .unwrap_or_else(|| panic!("{path} is not a node's own"))
}

/// A further node's own directory (the devstack's `nodes/<n>/`).
fn node_dir(state_dir: &Path, index: usize) -> PathBuf {
    state_dir.join("nodes").join((index + 1).to_string())
}

/// The pid of the agent running on `node`: the process named [`AGENT`] in the node's network
/// namespace (the agent runs on the host network), the host's for the primary.
pub fn agent_pid(node: &NodeInfo) -> u32 {
    let net = match &node.namespaces {
        Some(ns) => ns.net.clone(),
        // the test runs in the host's network namespace, as the primary node does
        None => PathBuf::from("/proc/self/ns/net"),
    };
    let found: Vec<i32> = nodes::processes_in(&net, "net")
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                Path::new(std::str::from_utf8(argv0).unwrap_or_default())
                    .file_name()
                    .is_some_and(|n| n == AGENT)
            })
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {AGENT} on node {}, found pids {found:?}",
        node.name
    );
    found[0] as u32
}

/// A file inside the agent's container on `node` (its root as the kernel shows it).
pub fn agent_file(node: &NodeInfo, path: &str) -> String {
    let pid = agent_pid(node);
    let full = format!("/proc/{pid}/root{path}");
    std::fs::read_to_string(&full)
        .unwrap_or_else(|e| panic!("reading {path} in node {}'s agent: {e}", node.name))
}

/// Whether some volume the agent of `node` recorded (`<agent dir>/volumes/*/data.json`) is pod
/// `uid`'s.
pub fn has_volume_of(state_dir: &Path, index: usize, uid: &str) -> bool {
    let volumes = agent_host_dir(state_dir, index).join("volumes");
    std::fs::read_dir(&volumes)
        .into_iter()
        .flatten()
        .flatten()
        .any(|volume| {
            std::fs::read_to_string(volume.path().join("data.json"))
                .is_ok_and(|data| data.contains(uid))
        })
}

/// A csi-socket and a csi-files pod pinned to each node, in the `restricted` namespace as its
/// tenants write them (the webhook adds the rest), as service accounts `<prefix>-socket` and
/// `<prefix>-files`; their names (`<account>-<node number>`) by node, once Ready.
pub fn pods_on_every_node(
    scenario: &Scenario,
    info: &ClusterInfo,
    prefix: &str,
) -> Vec<Vec<(String, VolumeMode)>> {
    scenario
        .ensure_restricted_namespace(RESTRICTED_NAMESPACE)
        .unwrap();
    let mut all = Vec::new();
    for (index, node) in info.nodes.iter().enumerate() {
        let mut on_node = Vec::new();
        for (kind, mode) in [
            ("socket", VolumeMode::CsiSocket),
            ("files", VolumeMode::CsiFiles),
        ] {
            // a Workload names its account for the program's life (a handful per test)
            let sa: &'static str = Box::leak(format!("{prefix}-{kind}").into_boxed_str());
            scenario
                .ensure_service_account(RESTRICTED_NAMESPACE, sa)
                .unwrap();
            let name = format!("{sa}-{}", index + 1);
            let mut pod = tenant_pods::restricted_pod(&Workload {
                namespace: RESTRICTED_NAMESPACE,
                service_account: sa,
                mode,
                service: false,
            });
            pod["metadata"]["name"] = name.clone().into();
            pod["spec"]["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node.name});
            scenario
                .kubectl()
                .apply_manifest(&pod.to_string(), &format!("pod {name}"))
                .unwrap();
            on_node.push((name, mode));
        }
        all.push(on_node);
    }
    for (name, _) in all.iter().flatten() {
        scenario
            .wait_pod_ready(RESTRICTED_NAMESPACE, name, Duration::from_secs(180))
            .unwrap();
    }
    all
}
