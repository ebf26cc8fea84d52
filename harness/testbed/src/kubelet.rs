//! A kubelet stand-in: `GET /pods` returns a real PodList JSON of one node's pods, read from the
//! same in-memory store as the API stand-in. Tests can make it slow, make it fail, or hide a pod for
//! a while (as a kubelet that has not synced it yet).

use crate::kube_api::Cluster;
use athenz_core::http::{Body, ConnInfo, Handler, Listener, Server, error_response};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Behaviour switches tests flip.
#[derive(Default)]
pub struct KubeletControls {
    delay_ms: AtomicU64,
    failing: AtomicBool,
    omit_all: AtomicBool,
    hidden: Mutex<BTreeSet<(String, String)>>,
    requests: AtomicUsize,
    required_token: Mutex<Option<String>>,
}

impl KubeletControls {
    /// Answers after `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
    /// Answers 500 while set.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
    /// Lists no pods at all while set (a kubelet that has not synced its pods).
    pub fn set_omit_all(&self, omit: bool) {
        self.omit_all.store(omit, Ordering::SeqCst);
    }
    /// Leaves a pod out of the list until [`Self::show`].
    pub fn hide(&self, namespace: &str, name: &str) {
        self.hidden
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((namespace.to_owned(), name.to_owned()));
    }
    /// Lists a hidden pod again.
    pub fn show(&self, namespace: &str, name: &str) {
        self.hidden
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
    /// Answers 401 unless the request carries `Authorization: Bearer <token>` (as the
    /// authenticated port does); `None` accepts any request.
    pub fn require_token(&self, token: Option<&str>) {
        *self
            .required_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = token.map(str::to_owned);
    }
    /// `GET /pods` calls served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

struct KubeletHandler {
    cluster: Cluster,
    node: String,
    controls: Arc<KubeletControls>,
    /// Each pod's JSON as last served, with the store revision it was made from. A real kubelet answers
    /// from its own pod cache; the stand-in must not spend a core re-serialising unchanged pods
    /// on the same two-core machine as the system being measured.
    encoded: Mutex<HashMap<(String, String), (u64, Bytes)>>,
}

impl KubeletHandler {
    /// `GET /pods`'s body: this node's pods without the hidden ones, as a `PodList`.
    fn pod_list(&self, hidden: &BTreeSet<(String, String)>) -> Bytes {
        let mut encoded = self
            .encoded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut items: Vec<Bytes> = Vec::new();
        let mut listed = HashSet::new();
        self.cluster.visit_pods_on(&self.node, |pod, revision| {
            let key = (
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            if hidden.contains(&key) {
                return;
            }
            let json = match encoded.get(&key) {
                Some((seen, json)) if *seen == revision => json.clone(),
                _ => {
                    let json = Bytes::from(serde_json::to_vec(pod).unwrap_or_default());
                    encoded.insert(key.clone(), (revision, json.clone()));
                    json
                }
            };
            listed.insert(key);
            items.push(json);
        });
        encoded.retain(|key, _| listed.contains(key) || hidden.contains(key));
        let mut body = Vec::with_capacity(items.iter().map(|i| i.len() + 1).sum::<usize>() + 64);
        body.extend_from_slice(br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#);
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        body.extend_from_slice(b"]}");
        Bytes::from(body)
    }
}

impl Handler for KubeletHandler {
    async fn handle(&self, req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        if req.uri().path() != "/pods" {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        }
        self.controls.requests.fetch_add(1, Ordering::SeqCst);
        let delay = self.controls.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let required = self
            .controls
            .required_token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(token) = required {
            let presented = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if presented != Some(format!("Bearer {token}").as_str()) {
                return error_response(StatusCode::UNAUTHORIZED, "Unauthorized");
            }
        }
        if self.controls.failing.load(Ordering::SeqCst) {
            return error_response(StatusCode::INTERNAL_SERVER_ERROR, "kubelet is unwell");
        }
        let hidden = self
            .controls
            .hidden
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let list = if self.controls.omit_all.load(Ordering::SeqCst) {
            Bytes::from_static(br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}"#)
        } else {
            self.pod_list(&hidden)
        };
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::new(list))
            .unwrap_or_else(|e| error_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
    }
}

/// A running kubelet stand-in.
pub struct Kubelet {
    addr: SocketAddr,
    controls: Arc<KubeletControls>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Kubelet {
    /// Serves the pods of `node` from `cluster` on an ephemeral loopback port (plain HTTP, like
    /// the read-only port).
    pub async fn start(cluster: Cluster, node: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let controls = Arc::new(KubeletControls::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            Server::new(
                Listener::Tcp(listener),
                Arc::new(KubeletHandler {
                    cluster,
                    node: node.to_owned(),
                    controls: controls.clone(),
                    encoded: Mutex::new(HashMap::new()),
                }),
            )
            .serve(async {
                let _ = rx.await;
            }),
        );
        Ok(Self {
            addr,
            controls,
            shutdown: Some(tx),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The switches.
    pub fn controls(&self) -> &KubeletControls {
        &self.controls
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
