//! The API traffic of one node agent per fake node, from this one process: each simulated agent
//! runs the agent's own early-issuance watch (`athenz_identity_agent::manager::early`, the
//! node's pending pods that carry the initializer's label) on a client of its own, so the API
//! server holds one connection and one field-selector watch per node, as with real agents. The
//! issuing side is left out (a watched pod is seen, never issued for): the API server's work is
//! the watch's.
//!
//! Each client authenticates as the agents' service account (a client certificate whose user is
//! `system:serviceaccount:<namespace>:athenz-agent`, group `system:serviceaccounts`), so RBAC
//! and the API server's fairness queues treat it as the agents' tokens; the token's own review
//! (a cache hit in the API server after the first) is the part not reproduced.

use anyhow::Context;
use athenz_identity_agent::manager::early::{self, BoundPod, EarlyIssues, PodNames, Started};
use std::future::Ready;
use std::path::Path;

/// The agents' service account, as deploy/ names it.
pub const AGENT_USER: &str = "system:serviceaccount:athenz-system:athenz-agent";

/// The agents' watches, running until dropped.
pub struct SimulatedAgents {
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl SimulatedAgents {
    /// One agent's watch for each node named by `nodes`, each on its own client made from
    /// `kubeconfig` (the agents' identity).
    pub async fn start(
        kubeconfig: &Path,
        nodes: impl IntoIterator<Item = String>,
    ) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(kubeconfig)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        let parsed = kube::config::Kubeconfig::from_yaml(&text)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        let config = kube::Config::from_custom_kubeconfig(
            parsed,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .context("the agents' client configuration")?;
        let mut watches = Vec::new();
        for node in nodes {
            // a client each: its own connection, as each node's agent has
            let client = kube::Client::try_from(config.clone()).context("an agent's client")?;
            let store = EarlyIssues::<()>::new(early::HOLD, Default::default());
            watches.push(early::spawn_watch(client, node, store, never_issue));
        }
        Ok(Self { watches })
    }

    /// How many agents watch.
    pub fn len(&self) -> usize {
        self.watches.len()
    }

    /// Whether none does.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }
}

impl Drop for SimulatedAgents {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

/// The simulated agents issue nothing: the watch's events are what the API server pays for.
fn never_issue(_: &BoundPod, _: Started) -> Option<(PodNames, Ready<Option<()>>)> {
    None
}
