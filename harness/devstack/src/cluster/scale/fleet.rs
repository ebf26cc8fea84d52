//! The scaled cluster's objects, made through the real API server as a cluster's own clients
//! make them: kwok's fake nodes, tenant namespaces with their service account, and pods bound to
//! the nodes (no scheduler involved: `spec.nodeName` set, as a DaemonSet's are).

use crate::cluster::pki::ClusterPki;
use anyhow::Context;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest one API call may take before the run fails naming it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read (a metadata-only page of pods is far smaller).
const MAX_ANSWER: usize = 64 << 20;
/// Pods in each tenant namespace: Kubernetes' threshold is 3,000 a namespace.
pub const PODS_PER_NAMESPACE: usize = 1_000;
/// The pods' service account in every tenant namespace.
pub const SERVICE_ACCOUNT: &str = "web";
/// The label every pod of the run carries (what the measurements select on).
pub const POD_LABEL: (&str, &str) = ("athenz.io/scale", "tenant");

/// The admin's client of the API server (`system:masters`).
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    base: Arc<str>,
}

impl Api {
    /// A client of `base` (`https://host:port`) with the cluster's admin certificate.
    pub fn new(pki: &ClusterPki, base: &str) -> anyhow::Result<Self> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).with_context(|| format!("reading {}", p.display()))
        };
        let ca = reqwest::Certificate::from_pem(&read(&pki.ca)?).context("the cluster CA")?;
        let mut identity = read(&pki.admin.cert)?;
        identity.extend_from_slice(&read(&pki.admin.key)?);
        let client = reqwest::Client::builder()
            .tls_certs_only([ca])
            .identity(reqwest::Identity::from_pem(&identity).context("the admin's certificate")?)
            .timeout(CALL_TIMEOUT)
            // a connection per call in flight: one HTTP/2 connection carrying the whole fill
            // ends in h2's "too_many_internal_resets" (its streams outlive their timeouts)
            .http1_only()
            .pool_max_idle_per_host(64)
            .build()
            .context("building the API client")?;
        Ok(Self {
            client,
            base: base.into(),
        })
    }

    /// `POST path` with `body`; how long the API server took to answer 201.
    pub async fn create(&self, path: &str, body: &Value) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let response = self.send_post(path, body).await?;
        let took = started.elapsed();
        Self::answer(path, response).await?;
        Ok(took)
    }

    /// `POST path` with `body`; the object the API server answered with.
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let response = self.send_post(path, body).await?;
        let text = Self::answer(path, response).await?;
        serde_json::from_str(&text).with_context(|| format!("POST {path}: not JSON"))
    }

    async fn send_post(&self, path: &str, body: &Value) -> anyhow::Result<reqwest::Response> {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {path}"))
    }

    /// A POST's answer as text, which must be a success (else its first 400 characters).
    async fn answer(path: &str, response: reqwest::Response) -> anyhow::Result<String> {
        let status = response.status();
        let text = String::from_utf8(
            athenz_core::client::read_limited(response, MAX_ANSWER)
                .await
                .with_context(|| format!("POST {path}"))?,
        )
        .with_context(|| format!("POST {path}: not UTF-8"))?;
        anyhow::ensure!(
            status.is_success(),
            "POST {path}: {status}: {}",
            text.chars().take(400).collect::<String>()
        );
        Ok(text)
    }

    /// `GET path` as text (a success status required).
    pub async fn text(&self, path: &str, accept: &str) -> anyhow::Result<String> {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("GET {path}"))?;
        let body = athenz_core::client::read_limited(response, MAX_ANSWER)
            .await
            .with_context(|| format!("GET {path}"))?;
        String::from_utf8(body).with_context(|| format!("GET {path}: not UTF-8"))
    }

    /// `GET path` held open for `limit` (a watch): the response, its body still to be read.
    pub async fn watch(&self, path: &str, limit: Duration) -> anyhow::Result<reqwest::Response> {
        self.client
            .get(format!("{}{path}", self.base))
            .timeout(limit)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("GET {path}"))
    }

    /// How many pods with label [`POD_LABEL`] match `field_selector`, counted over
    /// metadata-only pages (what a count costs the API server, not a full list).
    pub async fn count_pods(&self, field_selector: &str) -> anyhow::Result<usize> {
        let (key, value) = POD_LABEL;
        let mut count = 0;
        let mut next = String::new();
        loop {
            let mut path = format!(
                "/api/v1/pods?limit=5000&labelSelector={key}%3D{value}&fieldSelector={}",
                field_selector.replace('=', "%3D").replace(',', "%2C")
            );
            if !next.is_empty() {
                path.push_str(&format!("&continue={next}"));
            }
            let page: Value = serde_json::from_str(
                &self
                    .text(
                        &path,
                        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                    )
                    .await?,
            )
            .context("a page of pods")?;
            count += page["items"].as_array().map_or(0, Vec::len);
            match page["metadata"]["continue"].as_str() {
                Some(token) if !token.is_empty() => next = token.to_owned(),
                _ => return Ok(count),
            }
        }
    }
}

/// Fake node `n`: kwok's (annotated), with a kubelet's labels and Kubernetes' 110 pods.
pub fn node(n: usize) -> (String, Value) {
    let name = node_name(n);
    let (key, value) = super::kwok::FAKE_NODE_ANNOTATION;
    let body = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    });
    ("/api/v1/nodes".to_owned(), body)
}

/// Node `n`'s name.
pub fn node_name(n: usize) -> String {
    format!("kwok-node-{n:05}")
}

/// Tenant namespace `n`'s name.
pub fn namespace_name(n: usize) -> String {
    format!("scale-tenant-{n:03}")
}

/// Tenant namespace `n`, opted in to identities, and its pods' service account.
pub fn namespace(n: usize) -> [(String, Value); 2] {
    namespace_with_account(&namespace_name(n), true)
}

/// The control namespace: not opted in, so its pods never meet our webhook, our agents or our
/// callback (the cluster's same pods without us).
pub const CONTROL_NAMESPACE: &str = "scale-control";

/// `name` (opted in or not, by the initializer's label) and its pods' service account.
pub fn namespace_with_account(name: &str, opted_in: bool) -> [(String, Value); 2] {
    let mut labels = serde_json::Map::new();
    if opted_in {
        let (key, value) = crate::cluster::tenant_domains::OPT_IN
            .split_once('=')
            .unwrap_or_default();
        labels.insert(key.to_owned(), Value::from(value));
    }
    [
        (
            "/api/v1/namespaces".to_owned(),
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "labels": labels}}),
        ),
        (
            format!("/api/v1/namespaces/{name}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": SERVICE_ACCOUNT}}),
        ),
    ]
}

/// The label naming the batch a pod was made in (a point's fill or its measured window).
pub const BATCH_LABEL: &str = "athenz.io/scale-batch";

/// Pod `n` of the run, in its tenant namespace, bound to node `n % nodes` (so that every node
/// holds its share, as a spread Deployment's would), in `batch`. It asks for a files-mode volume
/// (the initializer injects it and labels the pod, so the callback's cache and the agents'
/// watches select it, as in a cluster).
pub fn pod(n: usize, nodes: usize, batch: &str) -> (String, Value) {
    pod_in(&namespace_name(n / PODS_PER_NAMESPACE), n, nodes, batch)
}

/// The same pod in the control namespace (no webhook, so nothing of ours selects it).
pub fn control_pod(n: usize, nodes: usize, batch: &str) -> (String, Value) {
    pod_in(CONTROL_NAMESPACE, n, nodes, batch)
}

fn pod_in(namespace: &str, n: usize, nodes: usize, batch: &str) -> (String, Value) {
    let (key, value) = POD_LABEL;
    let body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("web-{n:06}"),
            "labels": {key: value, "app": "web", BATCH_LABEL: batch},
            "annotations": {
                athenz_initializer::mutate::VOLUME_ANNOTATION:
                    athenz_core::volume_mode::VolumeMode::CsiFiles.name(),
            },
        },
        "spec": {
            "nodeName": node_name(n % nodes.max(1)),
            "serviceAccountName": SERVICE_ACCOUNT,
            "containers": [{"name": "app", "image": "registry.example/web:1"}],
        },
    });
    (format!("/api/v1/namespaces/{namespace}/pods"), body)
}

/// Creates every object of `objects` with at most `parallel` calls in flight; each call's time.
pub async fn create_all(
    api: &Api,
    objects: impl IntoIterator<Item = (String, Value)>,
    parallel: usize,
) -> anyhow::Result<Vec<Duration>> {
    super::calls::bounded(objects, parallel, |(path, body)| {
        let api = api.clone();
        async move { api.create(&path, &body).await }
    })
    .await
}

/// Creates `objects` at `per_second`, each on time whatever the earlier ones take (an open
/// arrival process, as a cluster's controllers create pods); each call's time.
pub async fn create_at_rate(
    api: &Api,
    objects: Vec<(String, Value)>,
    per_second: f64,
) -> anyhow::Result<Vec<Duration>> {
    super::calls::at_rate(objects, per_second, |(path, body)| {
        let api = api.clone();
        async move { api.create(&path, &body).await }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pods_spread_over_nodes_and_fill_namespaces_in_turn() {
        let (path, body) = pod(1_234, 100, "1-fill");
        assert_eq!(path, "/api/v1/namespaces/scale-tenant-001/pods");
        assert_eq!(body["spec"]["nodeName"], "kwok-node-00034");
        assert_eq!(body["metadata"]["name"], "web-001234");
        assert_eq!(body["metadata"]["labels"][POD_LABEL.0], POD_LABEL.1);
        assert_eq!(body["metadata"]["labels"][BATCH_LABEL], "1-fill");
        assert_eq!(
            body["metadata"]["annotations"]["athenz.io/volume"],
            "csi-files"
        );
        let (control, _) = control_pod(1_234, 100, "1-control");
        assert_eq!(control, "/api/v1/namespaces/scale-control/pods");
        let [(_, tenant), _] = namespace(3);
        assert_eq!(
            tenant["metadata"]["labels"]["athenz.io/identity"],
            "enabled"
        );
        let [(_, plain), _] = namespace_with_account(CONTROL_NAMESPACE, false);
        assert!(plain["metadata"]["labels"].as_object().unwrap().is_empty());
        let (_, first) = pod(0, 100, "1-fill");
        assert_eq!(first["spec"]["nodeName"], "kwok-node-00000");
        let (_, node) = node(7);
        let (key, value) = super::super::kwok::FAKE_NODE_ANNOTATION;
        assert_eq!(node["metadata"]["annotations"][key], value);
        assert_eq!(node["status"]["capacity"]["pods"], "110");
    }
}
