//! Waiting for the components: every wait is bounded and, when it runs out, names what did not
//! come up and shows the tail of that component's log.

use crate::procs::Process;
use anyhow::{Context, bail};
use std::path::Path;
use std::time::{Duration, Instant};

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(250);

/// An HTTP client that trusts the cluster CA and presents the admin's certificate (the
/// components' /healthz and the API server's /readyz under `Node,RBAC` authorization).
#[derive(Debug, Clone)]
pub struct Checker {
    client: reqwest::Client,
    /// `https://<node ip>:<port>`.
    pub api_server: String,
}

impl Checker {
    /// A checker for the cluster whose CA and admin certificate are these.
    pub fn new(
        ca: &Path,
        admin_cert: &Path,
        admin_key: &Path,
        api_server: &str,
    ) -> anyhow::Result<Self> {
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let ca = reqwest::Certificate::from_pem(&read(ca)?).context("reading the cluster CA")?;
        let mut identity = read(admin_cert)?;
        identity.extend_from_slice(&read(admin_key)?);
        let identity =
            reqwest::Identity::from_pem(&identity).context("reading the admin certificate")?;
        let client = reqwest::Client::builder()
            .tls_certs_only([ca])
            .identity(identity)
            .timeout(Duration::from_secs(5))
            .build()
            .context("building the health-check client")?;
        Ok(Self {
            client,
            api_server: api_server.to_owned(),
        })
    }

    /// A checker for a running cluster: its CA, its admin's certificate
    /// (`pki/admin-client.{crt,key}`), its API server.
    pub fn for_cluster(layout: &super::Layout, info: &super::ClusterInfo) -> anyhow::Result<Self> {
        Self::new(
            &info.api_server.ca,
            &layout.pki.join("admin-client.crt"),
            &layout.pki.join("admin-client.key"),
            &info.api_server.url,
        )
    }

    /// `POST <api server><path>` with a JSON body; fails naming the status and the API's
    /// message unless it answers 2xx.
    pub async fn api_post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<()> {
        let response = self
            .client
            .post(format!("{}{path}", self.api_server))
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            bail!("POST {path}: {status}: {text}");
        }
        Ok(())
    }

    /// `DELETE <api server><path>`; an object already gone (404) counts as deleted.
    pub async fn api_delete(&self, path: &str) -> anyhow::Result<()> {
        let response = self
            .client
            .delete(format!("{}{path}", self.api_server))
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        let status = response.status();
        if !status.is_success() && status != reqwest::StatusCode::NOT_FOUND {
            let text = response.text().await.unwrap_or_default();
            bail!("DELETE {path}: {status}: {text}");
        }
        Ok(())
    }

    /// `GET <api server><path>` as text; `None` unless it answers 2xx.
    pub async fn api_text(&self, path: &str) -> Option<String> {
        let response = self
            .client
            .get(format!("{}{path}", self.api_server))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok()
    }

    /// Whether `GET url` answers 2xx.
    pub async fn ok(&self, url: &str) -> bool {
        self.client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// `GET <api server><path>` as JSON; `None` unless it answers 2xx with JSON.
    pub async fn api_json(&self, path: &str) -> Option<serde_json::Value> {
        let response = self
            .client
            .get(format!("{}{path}", self.api_server))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// The node's Ready condition (`None` before it registers) and its pod CIDR.
    pub async fn node(&self, name: &str) -> NodeState {
        let Some(node) = self.api_json(&format!("/api/v1/nodes/{name}")).await else {
            return NodeState::default();
        };
        let ready = node["status"]["conditions"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == "Ready")
                .map(|c| NodeCondition {
                    ready: c["status"] == "True",
                    reason: c["reason"].as_str().unwrap_or_default().to_owned(),
                    message: c["message"].as_str().unwrap_or_default().to_owned(),
                })
        });
        NodeState {
            registered: true,
            ready,
            pod_cidr: node["spec"]["podCIDR"].as_str().map(str::to_owned),
        }
    }
}

/// What the API says of the node.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    /// It exists.
    pub registered: bool,
    /// Its Ready condition.
    pub ready: Option<NodeCondition>,
    /// `spec.podCIDR` (set by the controller-manager).
    pub pod_cidr: Option<String>,
}

/// A node condition.
#[derive(Debug, Clone, Default)]
pub struct NodeCondition {
    /// `status: "True"`.
    pub ready: bool,
    /// Why not.
    pub reason: String,
    /// In words.
    pub message: String,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.registered {
            return f.write_str("not registered");
        }
        match &self.ready {
            None => f.write_str("registered, no Ready condition yet")?,
            Some(c) if c.ready => f.write_str("Ready")?,
            Some(c) => write!(f, "NotReady ({}: {})", c.reason, c.message)?,
        }
        match &self.pod_cidr {
            Some(cidr) => write!(f, ", podCIDR {cidr}"),
            None => f.write_str(", no podCIDR yet"),
        }
    }
}

/// Waits until `check` holds, up to `limit`; fails at once if `process` exits, and names
/// `what` with the process's log tail (and `state()`'s last word) when the time runs out.
pub async fn wait_for<F, Fut>(
    process: &mut Process,
    what: &str,
    limit: Duration,
    mut check: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        let last = match check().await {
            Ok(()) => return Ok(started.elapsed()),
            Err(last) => last,
        };
        process
            .check_alive()
            .with_context(|| format!("waiting for {what}"))?;
        if started.elapsed() > limit {
            bail!(
                "{what} did not come up within {limit:?} (last seen: {last}); the log of {} ({}):\n{}",
                process.command.name,
                process.log_path().display(),
                process.log_tail()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
