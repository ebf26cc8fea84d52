//! `cluster stop-node`: a further node lost, as a power cut loses it. Its kubelet, kube-proxy
//! and containerd stop and every process left in its namespaces (its pods' containers, the
//! agent among them) is killed; `cluster up` no longer restarts them. The node's object stays in
//! the API (it goes NotReady, as a lost node does) and its namespaces stay until `cluster down`.

use super::info::ClusterInfo;
use super::layout::Processes;
use super::nodes::{self, NodeNamespaces, NodeSpec};
use super::{Layout, components, teardown};
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;

/// How long a component may take to exit after SIGTERM.
const GRACE: Duration = Duration::from_secs(5);

/// The file whose presence tells `cluster up` not to restart node `number`'s components.
pub fn stopped_marker(layout: &Layout, number: usize) -> PathBuf {
    layout.node(number - 1).dir.join("stopped")
}

/// Whether the process named `process` belongs to a node that was stopped on purpose.
pub fn is_on_stopped_node(layout: &Layout, process: &str) -> bool {
    components::node_of(process).is_some_and(|n| stopped_marker(layout, n).exists())
}

/// What stopping a node did.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// Its components stopped (kubelet, kube-proxy, containerd).
    pub components: usize,
    /// Processes killed inside its namespaces afterwards (containers, shims).
    pub killed: usize,
}

/// Stops the further node `name` (see the module docs).
pub async fn stop_node(layout: &Layout, name: &str) -> anyhow::Result<Stopped> {
    let info = ClusterInfo::read(&layout.cluster_json)?;
    let index = info
        .nodes
        .iter()
        .position(|n| n.name == name)
        .with_context(|| {
            let names: Vec<&str> = info.nodes.iter().map(|n| n.name.as_str()).collect();
            format!(
                "the cluster has no node {name} (its nodes: {})",
                names.join(", ")
            )
        })?;
    if index == 0 {
        bail!(
            "{name} is the host's own node: only a further node (cluster up --nodes N) can be stopped"
        );
    }
    let node = NodeSpec {
        index,
        name: name.to_owned(),
        ip: std::net::Ipv4Addr::UNSPECIFIED,
    };
    let marker = stopped_marker(layout, node.number());
    std::fs::write(&marker, b"").with_context(|| format!("writing {}", marker.display()))?;
    let recorded = Processes::read(&layout.processes_json).unwrap_or_default();
    let mut stopped = 0;
    for component in [
        components::KUBELET,
        components::KUBE_PROXY,
        components::CONTAINERD,
    ] {
        if let Some(id) = recorded.components.get(&node.process_name(component))
            && id.is_running()
        {
            teardown::terminate(id.pid, GRACE).await;
            stopped += 1;
        }
    }
    let namespaces = NodeNamespaces::of(&layout.run_dir, &node);
    let killed = tokio::task::spawn_blocking(move || nodes::kill_inside(&namespaces))
        .await
        .context("killing the node's processes")?;
    Ok(Stopped {
        components: stopped,
        killed,
    })
}
