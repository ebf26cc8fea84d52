//! The API traffic of one node agent per fake node, from this one process: each node has an
//! agent pod (kwok's, in the agents' namespace, as the agents' service account, bound to the
//! node as the DaemonSet's are) and each simulated agent runs the agent's own early-issuance
//! watch (`athenz_identity_agent::manager::early`, the node's pending pods that carry the
//! initializer's label) on a client of its own, authenticated by a token bound to its pod (what
//! the kubelet projects into a real agent), so the API server holds one connection and one
//! field-selector watch per node and authenticates each agent's token, as with real agents.
//! The issuing side is left out (a watched pod is seen, never issued for): the API server's
//! work is the watch's. A real agent makes no other API call (its pods are attested by the
//! kubelet's socket, its node identity through ZTS and the callback: [`super::callback`]).

use super::fleet::Api;
use anyhow::Context;
use athenz_core::secret::Secret;
use athenz_identity_agent::manager::early::{self, BoundPod, EarlyIssues, PodNames, Started};
use serde_json::json;
use std::future::Ready;
use std::path::Path;

/// The agents' service account, as deploy/ names it.
pub const AGENT_USER: &str = "system:serviceaccount:athenz-system:athenz-agent";
/// The agents' namespace and service account, as deploy/ names them.
const AGENT_NAMESPACE: &str = "athenz-system";
const AGENT_ACCOUNT: &str = "athenz-agent";
/// The audience of the agents' node-identity tokens (the callback's default, deploy/'s).
pub const NODE_AUDIENCE: &str = "athenz-node";
/// The tokens' lifetime: longer than any run, so none expires in one (a kubelet would
/// rotate them).
const TOKEN_SECONDS: u64 = 24 * 3600;

/// A node's agent pod, as the API server made it.
#[derive(Debug, Clone)]
pub struct AgentPod {
    pub node: String,
    name: String,
    uid: String,
    /// Its token for the API server's own audience (the agent's client's).
    api_token: Secret,
}

impl AgentPod {
    /// Makes `node`'s agent pod and its API token.
    pub async fn create(api: &Api, node: String) -> anyhow::Result<Self> {
        let name = format!("athenz-agent-{node}");
        let pod = api
            .post(
                &format!("/api/v1/namespaces/{AGENT_NAMESPACE}/pods"),
                &json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name,
                                 "labels": {"app.kubernetes.io/name": "athenz-agent"}},
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": AGENT_ACCOUNT,
                        "containers": [{"name": "agent", "image": "registry.example/athenz:1"}],
                    },
                }),
            )
            .await?;
        let uid = pod["metadata"]["uid"]
            .as_str()
            .with_context(|| format!("{name}: the API server's answer has no uid"))?
            .to_owned();
        let mut agent = Self {
            node,
            name,
            uid,
            api_token: Secret::new(String::new()),
        };
        agent.api_token = agent.token(api, None).await?;
        Ok(agent)
    }

    /// Makes the agent pods of `nodes`, at most `parallel` at a time.
    pub async fn create_all(
        api: &Api,
        nodes: impl IntoIterator<Item = String>,
        parallel: usize,
    ) -> anyhow::Result<Vec<Self>> {
        let mut made = super::calls::bounded(nodes, parallel, |node| {
            let api = api.clone();
            async move { Self::create(&api, node).await }
        })
        .await?;
        made.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(made)
    }

    /// A token bound to this pod for `audience` (the API server's own when `None`), as the
    /// kubelet asks for a projected token.
    pub async fn token(&self, api: &Api, audience: Option<&str>) -> anyhow::Result<Secret> {
        let mut spec = json!({
            "expirationSeconds": TOKEN_SECONDS,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
        });
        if let Some(audience) = audience {
            spec["audiences"] = json!([audience]);
        }
        let answer = api
            .post(
                &format!(
                    "/api/v1/namespaces/{AGENT_NAMESPACE}/serviceaccounts/{AGENT_ACCOUNT}/token"
                ),
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
            )
            .await
            .with_context(|| format!("{}'s token", self.name))?;
        let token = answer["status"]["token"]
            .as_str()
            .with_context(|| format!("{}: the TokenRequest's answer has no token", self.name))?;
        Ok(Secret::new(token.to_owned()))
    }
}

/// The agents' watches, running until dropped.
pub struct SimulatedAgents {
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl SimulatedAgents {
    /// One agent's watch for each of `agents`, each on its own client of the API server named
    /// by `kubeconfig`, authenticated by its pod's token.
    pub async fn start(kubeconfig: &Path, agents: &[AgentPod]) -> anyhow::Result<Self> {
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
        for agent in agents {
            // a client each: its own connection and token, as each node's agent has
            let mut config = config.clone();
            config.auth_info = kube::config::AuthInfo {
                token: Some(agent.api_token.expose().to_owned().into()),
                ..Default::default()
            };
            let client = kube::Client::try_from(config).context("an agent's client")?;
            let store = EarlyIssues::<()>::new(early::HOLD, Default::default());
            watches.push(early::spawn_watch(
                client,
                agent.node.clone(),
                store,
                never_issue,
            ));
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
