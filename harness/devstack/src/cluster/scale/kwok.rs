//! kwok's controller (sigs.k8s.io/kwok, built from its module by
//! `harness/real-node/kube/build.sh --kwok`): it keeps the fake nodes' leases and plays their
//! pods' lives ([`CONFIG`]) against the real API server, as thousands of kubelets would.

use crate::procs::{Command, Process};
use anyhow::Context;
use std::path::{Path, PathBuf};

/// kwok's configuration: the nodes it manages (annotated [`FAKE_NODE_ANNOTATION`]) and this
/// repository's stages for them and their pods.
pub const CONFIG: &str = include_str!("kwok.yaml");

/// The annotation (and its value) that makes a node kwok's.
pub const FAKE_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// A node's lease, renewed by kwok every quarter of it: a kubelet's default (40 s), so the API
/// server sees the lease writes a real cluster of this size makes.
const NODE_LEASE_SECONDS: u32 = 40;

/// The pods' addresses: room for far more than Kubernetes' 150,000 pods (kwok hands them out
/// from the first and never past the range's end).
const POD_CIDR: &str = "10.64.0.1/10";

/// The nodes' address (their hostIP): a documentation address, never dialled.
const NODE_IP: &str = "192.0.2.10";

/// The kwok binary: `--kwok-bin`, or the build's default place.
pub fn default_binary() -> PathBuf {
    super::super::workspace_path("target/kwok/kwok")
}

/// Starts kwok with `kubeconfig` (the admin's: kwok's own client has no rate limit, and the
/// API server exempts `system:masters` from its fairness queues, as it would a cluster's
/// kubelets' share), its configuration written into `dir`, its HTTP server on `port` of
/// loopback; waits for its `/healthz`.
pub async fn start(
    binary: &Path,
    kubeconfig: &Path,
    dir: &Path,
    logs: &Path,
    port: u16,
) -> anyhow::Result<Process> {
    anyhow::ensure!(
        binary.is_file(),
        "kwok is not built at {} (harness/real-node/kube/build.sh --kwok builds it)",
        binary.display()
    );
    let config = dir.join("kwok.yaml");
    std::fs::write(&config, CONFIG).with_context(|| format!("writing {}", config.display()))?;
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", config.display()),
        format!("--node-lease-duration-seconds={NODE_LEASE_SECONDS}"),
        format!("--cidr={POD_CIDR}"),
        format!("--node-ip={NODE_IP}"),
        format!("--server-address=127.0.0.1:{port}"),
        // at INFO kwok logs every lease renewal and pod patch: 186 MB in a 28-minute run to
        // 2,500 nodes, written by the process whose pace sets the pods'
        "-v=WARN".to_owned(),
    ];
    let mut process = Process::start(Command::new("kwok", binary, args), logs)?;
    process
        .wait_http_ok(&format!("http://127.0.0.1:{port}/healthz"))
        .await?;
    Ok(process)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The configuration manages exactly the annotated nodes and gives every stage kwok needs,
    /// so none of kwok's built-in ones applies.
    #[test]
    fn the_configuration_names_its_nodes_and_every_stage() {
        let (key, value) = FAKE_NODE_ANNOTATION;
        assert!(CONFIG.contains(&format!("manageNodesWithAnnotationSelector: {key}={value}")));
        let stages: Vec<&str> = CONFIG
            .split("\n---\n")
            .filter(|doc| doc.contains("kind: Stage"))
            .filter_map(|doc| doc.lines().find_map(|l| l.strip_prefix("  name: ")))
            .collect();
        assert_eq!(
            stages,
            ["node-ready", "pod-sandbox", "pod-running", "pod-delete"]
        );
        for doc in CONFIG
            .split("\n---\n")
            .filter(|d| d.contains("kind: Stage"))
        {
            for kind in ["kind: Node", "kind: Pod"] {
                if doc.contains(kind) {
                    assert!(doc.contains("apiGroup: v1"), "{doc}");
                }
            }
        }
    }
}
