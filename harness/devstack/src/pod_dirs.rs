//! Where a pod's identity volume and its node's driver and agent live: plain data shared by the
//! kubelet player ([`crate::node`]) and the pod runtimes ([`crate::pods`]), which used to reach
//! each other for it.

use crate::kube::NewPod;
use std::path::PathBuf;

/// A pod's volume on a node.
#[derive(Debug, Clone)]
pub struct PodVolume {
    pub pod: NewPod,
    pub uid: String,
    /// The node's driver directories and agent socket.
    pub node: NodeDirs,
    /// Kubelet's mount dir for the volume.
    pub mount_dir: PathBuf,
    /// Where its SIA writes the credentials (the pod's memory-backed volume).
    pub credentials_dir: PathBuf,
}

/// Where a node's driver and agent live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDirs {
    /// The driver's ATHENZ_VOLUMES_DIR.
    pub volumes_dir: PathBuf,
    /// The driver's ATHENZ_AGENT_DIR.
    pub agent_dir: PathBuf,
    /// The agent's socket.
    pub socket: PathBuf,
}

impl NodeDirs {
    /// The first node's.
    pub fn first(stack: &crate::stack_json::StackInfo) -> Self {
        Self {
            volumes_dir: stack.volumes_dir.clone(),
            agent_dir: stack.agent_dir.clone(),
            socket: stack.agent.socket.clone(),
        }
    }

    /// Node `node`'s.
    pub fn of(node: &crate::stack_json::NodeInfo) -> Self {
        Self {
            volumes_dir: node.volumes_dir.clone(),
            agent_dir: node.agent_dir.clone(),
            socket: node.agent.socket.clone(),
        }
    }
}
