//! A Kubernetes API stand-in: real Kubernetes JSON (k8s-openapi types) served over plain HTTP on
//! loopback from an in-memory store that tests mutate.
//!
//! Serves what this system's clients call: `GET /api/v1/namespaces/{ns}/pods/{name}`,
//! `GET /api/v1/namespaces/{ns}/services/{name}`, pod lists (`/api/v1/pods`, optionally with
//! `fieldSelector=spec.nodeName=<node>`, and `/api/v1/namespaces/{ns}/pods`), `GET /version` and
//! `GET /readyz`, and `GET /metrics` (`apiserver_request_total`, as the real server counts
//! requests). Writes, so that curl or a test can drive it as a client drives the API server
//! (see [`writes`]): pod and service create (`POST .../pods`, `POST .../services`), replace (`PUT`),
//! JSON merge patch (`PATCH`, on the object or its `/status`), and delete (`DELETE`: a pod is first
//! marked terminating, then removed by a delete with `gracePeriodSeconds=0`, as kubelet does once
//! its containers stopped). Service-account tokens ([`tokens`]): `TokenRequest` bound to a pod,
//! `TokenReview`, and `GET /api/v1/nodes/{name}`. Anything else is a 404 or 405 with a Kubernetes `Status` object, as the
//! real server answers.

mod faults;
mod objects;
mod pod_store;
mod requests;
pub mod tokens;
mod writes;

use athenz_core::http::{Body, ConnInfo, Handler, json_response};
use bytes::Bytes;
use faults::{ApiFaults, Serving, failure, serve_until_stopped};
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use objects::now_timestamp;
pub use objects::{
    cluster_ip_service, mark_terminating, node_agent_pod, report_sandbox, running_pod,
};
use pod_store::PodStore;
use requests::RequestCounts;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

#[derive(Default)]
struct Store {
    pods: PodStore,
    services: BTreeMap<(String, String), Service>,
    nodes: BTreeMap<String, Node>,
}

/// The store, shared by the server and the test that mutates it.
#[derive(Clone)]
pub struct Cluster {
    store: Arc<RwLock<Store>>,
    tokens: Arc<tokens::TokenKey>,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            store: Arc::default(),
            tokens: Arc::new(tokens::TokenKey::generate()),
        }
    }
}

fn key_of(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl Cluster {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Store> {
        self.store
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Store> {
        self.store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates or replaces a pod.
    pub fn put_pod(&self, pod: Pod) {
        self.write().pods.insert(key_of(&pod.metadata), pod);
    }

    /// Changes a pod in place; returns false if there is no such pod.
    pub fn update_pod(&self, namespace: &str, name: &str, change: impl FnOnce(&mut Pod)) -> bool {
        match self
            .write()
            .pods
            .get_mut(&(namespace.to_owned(), name.to_owned()))
        {
            Some(pod) => {
                change(pod);
                true
            }
            None => false,
        }
    }

    /// Deletes a pod.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.write()
            .pods
            .remove(&(namespace.to_owned(), name.to_owned()))
    }

    /// Creates a node (a new uid each time, as a re-created node gets); returns its uid.
    pub fn put_node(&self, name: &str) -> String {
        let uid = tokens::uuid_v4();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(uid.clone()),
                creation_timestamp: Some(Time(now_timestamp())),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        self.write().nodes.insert(name.to_owned(), node);
        uid
    }

    /// A node's uid, if the node exists.
    pub fn node_uid(&self, name: &str) -> Option<String> {
        self.read()
            .nodes
            .get(name)
            .and_then(|n| n.metadata.uid.clone())
    }

    /// Deletes a node.
    pub fn delete_node(&self, name: &str) -> Option<Node> {
        self.write().nodes.remove(name)
    }

    /// Creates or replaces a service.
    pub fn put_service(&self, service: Service) {
        self.write()
            .services
            .insert(key_of(&service.metadata), service);
    }

    /// Deletes a service.
    pub fn delete_service(&self, namespace: &str, name: &str) -> Option<Service> {
        self.write()
            .services
            .remove(&(namespace.to_owned(), name.to_owned()))
    }

    /// A pod by namespace and name.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.read()
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Calls `visit` with every pod on `node` and its revision (a number that changes whenever
    /// the pod may have changed), under the store's read lock (no copies).
    pub fn visit_pods_on(&self, node: &str, mut visit: impl FnMut(&Pod, u64)) {
        let store = self.read();
        for (pod, revision) in store.pods.pods.values() {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) {
                visit(pod, *revision);
            }
        }
    }

    /// Every pod, optionally only those on `node`.
    pub fn pods(&self, namespace: Option<&str>, node: Option<&str>) -> Vec<Pod> {
        self.read()
            .pods
            .values()
            .filter(|p| namespace.is_none_or(|ns| p.metadata.namespace.as_deref() == Some(ns)))
            .filter(|p| {
                node.is_none_or(|n| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n))
            })
            .cloned()
            .collect()
    }
}

impl Cluster {
    /// Adds node `node` and its agent pod, and mints that pod's projected token (audience
    /// `athenz-node`, an hour), as the kubelet does for the DaemonSet; returns the pod and token.
    pub fn start_node_agent(
        &self,
        node: &str,
    ) -> Result<(Pod, tokens::MintedToken), tokens::TokenRequestRefused> {
        use crate::fixtures::{AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, NODE_TOKEN_AUDIENCE};
        if self.node_uid(node).is_none() {
            self.put_node(node);
        }
        let pod = node_agent_pod(node);
        self.put_pod(pod.clone());
        let token = self.mint_token(&tokens::BoundTokenRequest {
            namespace: AGENT_NAMESPACE,
            account: AGENT_SERVICE_ACCOUNT,
            pod_name: pod.metadata.name.as_deref().unwrap_or_default(),
            pod_uid: pod.metadata.uid.as_deref(),
            audiences: &[NODE_TOKEN_AUDIENCE.to_owned()],
            expiration_secs: None,
        })?;
        Ok((pod, token))
    }
}

/// The Kubernetes `Status` object of an error.
fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    json_response(
        code,
        &serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code.as_u16(),
        }),
    )
}

fn not_found(kind: &str, name: &str) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{kind} \"{name}\" not found"),
    )
}

fn list<T: serde::Serialize>(kind: &str, items: Vec<T>) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"},
            "items": items,
        }),
    )
}

struct ApiHandler {
    cluster: Cluster,
    faults: Arc<ApiFaults>,
    requests: Arc<RequestCounts>,
}

impl Handler for ApiHandler {
    async fn handle(&self, req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        if req.method() == Method::GET && req.uri().path() == "/metrics" {
            return Response::builder()
                .header(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")
                .body(Body::from(self.requests.exposition()))
                .unwrap_or_else(|_| failure(StatusCode::INTERNAL_SERVER_ERROR));
        }
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let response = self.answer(req);
        self.requests.record(&method, &path, response.status());
        response
    }
}

impl ApiHandler {
    fn answer(&self, req: Request<Bytes>) -> Response<Body> {
        let failing = self.faults.answer_status.load(Ordering::SeqCst);
        if let Some(code) = (failing != 0)
            .then(|| StatusCode::from_u16(failing).ok())
            .flatten()
        {
            return failure(code);
        }
        if req.method() != Method::GET {
            if let Some(response) = writes::handle(&self.cluster, &req) {
                return response;
            }
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{} is not served by this stand-in", req.method()),
            );
        }
        // no watch here: the callback's pod cache is proven against the real API server
        // (harness/e2e real_node), and its stand-in stacks run it off (`--pod-cache=false`)
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        if watch {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "watch is not served by this stand-in".into(),
            );
        }
        let node = req.uri().query().and_then(|q| {
            q.split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == "fieldSelector")
                .and_then(|(_, v)| {
                    let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
                    v.strip_prefix("spec.nodeName=").map(str::to_owned)
                })
        });
        let path = req.uri().path();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segments.as_slice() {
            ["version"] => json_response(
                StatusCode::OK,
                &serde_json::json!({
                    "major": "1", "minor": "33", "gitVersion": "v1.33.0-athenz-testbed",
                    "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"
                }),
            ),
            ["readyz"] | ["healthz"] | ["livez"] => json_response(StatusCode::OK, &"ok"),
            ["api", "v1", "pods"] => list("PodList", self.cluster.pods(None, node.as_deref())),
            ["api", "v1", "namespaces", ns, "pods"] => {
                list("PodList", self.cluster.pods(Some(ns), node.as_deref()))
            }
            ["api", "v1", "namespaces", _, "pods", name]
                if self.faults.pod_reads_missing.load(Ordering::SeqCst) =>
            {
                not_found("pods", name)
            }
            ["api", "v1", "namespaces", ns, "pods", name] => match self.cluster.pod(ns, name) {
                Some(pod) => json_response(StatusCode::OK, &with_kind(pod, "Pod")),
                None => not_found("pods", name),
            },
            ["api", "v1", "nodes", name] => {
                let node = self.cluster.read().nodes.get(*name).cloned();
                match node {
                    Some(n) => json_response(StatusCode::OK, &with_kind(n, "Node")),
                    None => not_found("nodes", name),
                }
            }
            ["api", "v1", "namespaces", ns, "services", name] => {
                let service = self
                    .cluster
                    .read()
                    .services
                    .get(&((*ns).to_owned(), (*name).to_owned()))
                    .cloned();
                match service {
                    Some(s) => json_response(StatusCode::OK, &with_kind(s, "Service")),
                    None => not_found("services", name),
                }
            }
            _ => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".into(),
            ),
        }
    }
}

/// Adds `kind` and `apiVersion`, as the API server does on every object.
fn with_kind<T: serde::Serialize>(object: T, kind: &str) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("kind".into(), kind.into());
        map.insert("apiVersion".into(), "v1".into());
    }
    value
}

/// How long [`KubeApi::set_unreachable`]'s future waits for the port to be closed or bound.
pub const IN_FORCE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A running stand-in.
pub struct KubeApi {
    cluster: Cluster,
    faults: Arc<ApiFaults>,
    addr: SocketAddr,
    serving: tokio::sync::watch::Sender<Serving>,
    /// The state the serving task has put in force (bound or closed the port).
    in_force: tokio::sync::watch::Receiver<Serving>,
}

impl KubeApi {
    /// Starts on an ephemeral loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts on `addr`.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let cluster = Cluster::default();
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(ApiFaults::default());
        let handler = Arc::new(ApiHandler {
            cluster: cluster.clone(),
            faults: faults.clone(),
            requests: Arc::default(),
        });
        let (serving, watch) = tokio::sync::watch::channel(Serving::Up);
        let (reached, in_force) = tokio::sync::watch::channel(Serving::Up);
        tokio::spawn(serve_until_stopped(listener, addr, handler, watch, reached));
        Ok(Self {
            cluster,
            faults,
            addr,
            serving,
            in_force,
        })
    }

    /// While set, every single-pod read answers 404 (as for a deleted pod), whatever the store
    /// holds: the callback then denies every launch.
    pub fn set_pod_reads_missing(&self, missing: bool) {
        self.faults
            .pod_reads_missing
            .store(missing, Ordering::SeqCst);
    }

    /// While set, every request is answered with `status` (429, 500, 503, 504, ...) and a
    /// Kubernetes `Status` object; `None` clears it.
    pub fn set_failing_status(&self, status: Option<StatusCode>) {
        self.faults
            .answer_status
            .store(status.map_or(0, |s| s.as_u16()), Ordering::SeqCst);
    }

    /// While set, the port is closed: open connections are drained and new ones refused, as
    /// with an API server that is down; cleared, it listens again on the same address.
    ///
    /// The change is asked for at once; the port is closed or bound again by the serving task a
    /// moment later. The returned future ends when that has happened (or after
    /// [`IN_FORCE_WAIT`]), so a test that awaits it asks nothing of the old state. A chaos run
    /// that takes the fault whenever the stand-in gets to it may drop the future.
    pub fn set_unreachable(&self, unreachable: bool) -> impl Future<Output = ()> + use<> {
        self.serving.send_if_modified(|now| {
            let next = match (*now, unreachable) {
                (Serving::Stopped, _) => return false,
                (_, true) => Serving::Unreachable,
                (_, false) => Serving::Up,
            };
            let changed = *now != next;
            *now = next;
            changed
        });
        let wanted = *self.serving.borrow();
        let mut in_force = self.in_force.clone();
        async move {
            let reached = in_force.wait_for(|s| *s == wanted || wanted == Serving::Stopped);
            if tokio::time::timeout(IN_FORCE_WAIT, reached).await.is_err() {
                tracing::warn!(?wanted, "the API stand-in did not reach its state in time");
            }
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The store.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Stops serving (the port then refuses connections).
    pub fn stop(&mut self) {
        self.serving.send_replace(Serving::Stopped);
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop();
    }
}
