//! The whole system on one machine: the dev ZTS, the Kubernetes stand-ins, and the real
//! jwt-service, callback, initializer and node agent, each a process with the arguments it has in
//! a cluster, their certificates obtained from ZTS with `athenz-control-sia` (and kept fresh by its
//! refresh sidecars). [`StackInfo`] is the `stack.json` contract of docs/design.md §5.

use crate::procs::{Process, Usage};
use athenz_core::agent_api::KeySource;
use athenz_core::peer::PeerCheck;
use athenz_core::volume_mode::VolumeMode;
use athenz_testbed::fixtures::{
    ADMIN_DOMAIN, AGENT_NAMESPACE, AGENT_PRINCIPAL, AGENT_SERVICE_ACCOUNT, DNS_SUFFIX,
    NODE_TOKEN_AUDIENCE, PROVIDER,
};
use std::path::PathBuf;

mod control;
pub(crate) mod keys;
mod launch;
pub mod replicas;
mod runtime;
mod start;
pub use crate::stack_json::{
    AgentInfo, CallbackInfo, Credential, Credentials, NodeAgentInfo, NodeAttestation, NodeInfo,
    RuntimeInfo, StackInfo, Url, UrlCa,
};
use runtime::{choose_runtime, remove_containers};

/// The node the stack's agent serves.
pub const NODE_NAME: &str = "node-1";
/// Where the callback serves the provider routes (ZTS appends `/instance` or `/refresh`).
pub const CALLBACK_BASE_PATH: &str = "/athenz/provider";
/// The control-plane services, their Athenz service names under the admin domain.
const JWT_SERVICE: &str = "athenz-jwt-service";
const CALLBACK: &str = "athenz-callback";
const INITIALIZER: &str = "athenz-initializer";
/// A principal allowed nowhere, for tests of refusals.
const STRANGER: &str = "stranger";
/// The injection template the initializer serves: the one deploy/ ships.
const DEPLOY_TEMPLATE: &str = include_str!("../../../../deploy/base/initializer-template.yaml");

/// The roles the dev ZTS knows (docs/design.md §4.11): every service of `media.sports` reads it,
/// only `media.sports.api` writes it; what the demo and scripts use to show authorization.
pub fn demo_roles() -> Vec<athenz_testbed::zts::authz::RoleEntry> {
    let role = |domain: &str, role: &str, members: &[&str]| athenz_testbed::zts::authz::RoleEntry {
        domain: domain.into(),
        role: role.into(),
        members: members.iter().map(|m| (*m).to_owned()).collect(),
    };
    vec![
        role("media.sports", "readers", &["media.sports.*"]),
        role("media.sports", "writers", &["media.sports.api"]),
        // the real node's tenant that enforces Pod Security "restricted" (cluster::features)
        role("bank.vault", "auditors", &["bank.vault.*"]),
    ]
}

/// The tenant domains the stack's pods live in (the demo's, the bench's, the real node's
/// restricted tenant), and their services: what Athenz's own ZTS must be told of
/// ([`ZtsServer::Athenz`]); the dev ZTS lets its provider launch anything.
pub const TENANT_DOMAINS: [&str; 3] = ["media.sports", "finance.ledger", "bank.vault"];
/// The services of [`TENANT_DOMAINS`] the stack's pods run as.
pub const TENANT_SERVICES: [&str; 4] = [
    "media.sports.web",
    "media.sports.api",
    "finance.ledger.ledger",
    "finance.ledger.web",
];

/// The faults file under the state dir, when the stack runs with fault injection.
pub const FAULTS_FILE: &str = "faults.json";

/// Which ZTS a stack runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ZtsServer {
    /// The development ZTS (`athenz_testbed::zts`).
    #[default]
    Dev,
    /// Athenz's own ZTS, built from its source by harness/peers/athenz/zts/build
    /// (docs/real-zts.md), from the same settings.
    Athenz,
}

impl ZtsServer {
    /// What reports call it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Dev => "dev ZTS",
            Self::Athenz => "Athenz's ZTS",
        }
    }
}

/// Choices for a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where everything lives (created if missing).
    pub state_dir: PathBuf,
    /// The agent's `--key-algorithm`: p256 or rsa2048.
    pub key_algorithm: String,
    /// The agents' and SIAs' `--key-source`.
    pub key_source: KeySource,
    /// Run the components from their own binaries in this directory instead of this one.
    pub components: Option<PathBuf>,
    /// How pods' processes are started; default: runc where it is installed and this is
    /// root, else plain processes.
    pub runtime: Option<athenz_testbed::runtime::RuntimeKind>,
    /// How many nodes (each its own kubelet, agent and node identity); at least 1.
    pub nodes: usize,
    /// The agents' `--peer-check`; default `enforce` where pod cgroups can be made, else `off`.
    pub peer_check: Option<PeerCheck>,
    /// Which volume pods get; with either CSI kind every agent also serves CSI.
    pub volume: VolumeMode,
    /// The agents' `--csi-refresh-interval` (files-mode rotation); their default when none.
    pub csi_refresh_interval: Option<std::time::Duration>,
    /// The callback's `--cert-expiry-minutes`: the lifetime ZTS gives pod and node certificates
    /// (its default, a day, when none; `soak` and `chaos` shorten it to see many refreshes).
    pub cert_expiry_minutes: Option<u32>,
    /// ZTS and the Kubernetes stand-ins follow `<state>/faults.json` (`chaos` injects its faults
    /// through it, [`athenz_testbed::faults`]).
    pub fault_injection: bool,
    /// Replicas of the jwt-service and of the callback, each Deployment behind one Service
    /// address when more than one ([`replicas`]).
    pub control_plane_replicas: usize,
    /// Which ZTS.
    pub zts: ZtsServer,
}

impl StackOptions {
    /// One node, the peer check as the host allows.
    pub fn new(state_dir: PathBuf, key_algorithm: &str) -> Self {
        Self {
            state_dir,
            key_algorithm: key_algorithm.to_owned(),
            key_source: KeySource::Pod,
            components: None,
            runtime: None,
            nodes: 1,
            peer_check: None,
            volume: VolumeMode::Flex,
            csi_refresh_interval: None,
            cert_expiry_minutes: None,
            fault_injection: false,
            control_plane_replicas: 1,
            zts: ZtsServer::Dev,
        }
    }
}

/// The name of node `i` (0-based): `node-1`, `node-2`, …
pub fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

/// A running stack.
pub struct Stack {
    /// What stack.json says.
    pub info: StackInfo,
    pub state_dir: PathBuf,
    processes: Vec<Process>,
    /// Deployments of more than one replica, behind their Services.
    deployments: Vec<replicas::Deployment>,
}

impl Stack {
    /// Writes stack.json with the current process ids.
    pub fn write_stack_json(&mut self) -> anyhow::Result<()> {
        self.info.processes = self
            .processes
            .iter()
            .map(|p| (p.command.name.clone(), p.pid()))
            .collect();
        crate::json_file::write_atomically(&self.state_dir.join("stack.json"), &self.info)
    }

    /// Fails, naming it with its log's tail, if any component has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.processes.iter_mut().try_for_each(Process::check_alive)
    }

    /// Restarts any component that has exited (as kubelet restarts a crashed container); returns
    /// the names restarted.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<String>> {
        let restarted = crate::procs::restart_exited(&mut self.processes)?;
        if !restarted.is_empty() {
            self.write_stack_json()?;
        }
        Ok(restarted)
    }

    /// Each long-running process's CPU and memory now.
    pub fn usage(&self) -> Vec<(String, Usage)> {
        self.processes
            .iter()
            .map(|p| (p.command.name.clone(), p.usage()))
            .collect()
    }

    /// Stops every process, the last started first, and removes the pod cgroups.
    pub async fn stop(mut self) {
        let _ = std::fs::remove_file(self.state_dir.join("stack.json"));
        while let Some(mut p) = self.processes.pop() {
            p.stop().await;
        }
        remove_containers(&self.info.runtime).await;
        crate::pods::PodRuntime::forget(&self.info);
        if let Some(root) = &self.info.pod_cgroup_root {
            athenz_testbed::cgroups::remove_tree(root);
        }
    }
}
