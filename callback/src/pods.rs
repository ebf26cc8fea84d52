//! Reading pods and services from the Kubernetes API (kube-rs), with a timeout on every call and
//! the call's latency recorded.

use athenz_core::pod_fields::PodFields;
use http_body_util::BodyExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Most bytes of a pod object read from the API. etcd refuses objects over 1.5 MiB, so a larger
/// answer is not a pod.
pub const MAX_POD_JSON: usize = 2 * 1024 * 1024;

/// Most bytes of an API error answer kept for the message.
const MAX_ERROR_BODY: usize = 4 * 1024;

/// Longest wait for bytes on a watch or list: past kube-runtime's own limit for a silent watch
/// (its 290 s server-side timeout plus 5 s), as kube's default is.
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(300);

/// The fields of a pod the checks read (`athenz_core::pod_fields`), owned.
pub type PodFacts = PodFields<'static>;

/// Parses a pod as the API returns it (`GET /api/v1/namespaces/{ns}/pods/{name}`).
pub fn pod_facts(json: &[u8]) -> Result<PodFacts, String> {
    if json.len() > MAX_POD_JSON {
        return Err(format!(
            "the pod's JSON is {} bytes, more than {MAX_POD_JSON}",
            json.len()
        ));
    }
    serde_json::from_slice::<PodFields<'_>>(json)
        .map(PodFields::into_owned)
        .map_err(|e| format!("the pod's JSON: {e}"))
}

/// What the checks need from the cluster.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    /// The same API for long-running watches: no per-call read timeout of a confirmation's
    /// length (the watcher detects a silent watch itself).
    watch_client: kube::Client,
    timeout: Duration,
    latency: Histogram,
    /// When a call last got its answer: readiness needs no request of its own while the
    /// confirmations show the API answering (one fewer API request every probe period).
    last_answer: Arc<Mutex<Option<Instant>>>,
}

/// The API could not answer.
#[derive(Debug, thiserror::Error)]
#[error("Kubernetes API: {0}")]
pub struct ApiError(pub String);

impl Cluster {
    /// A client for `api_url` (plain URL, e.g. the stand-in) or, without one, the in-cluster
    /// configuration or kubeconfig (`KUBECONFIG`, `~/.kube/config`).
    pub async fn connect(
        api_url: Option<&str>,
        timeout: Duration,
        latency: Histogram,
    ) -> Result<Self, ApiError> {
        let mut config = match api_url {
            Some(url) => kube::Config::new(
                url.parse::<http::Uri>()
                    .map_err(|e| ApiError(format!("URL {url:?}: {e}")))?,
            ),
            None => kube::Config::infer()
                .await
                .map_err(|e| ApiError(format!("no in-cluster config or kubeconfig: {e}")))?,
        };
        // No retries inside a confirmation: an API server answering 429 or 503 is shedding load,
        // and ZTS waits on this call. The callback answers 504 at once and the pod's side (agent,
        // SIA) retries with its own back-off, bounded by its init timeout.
        config.default_retry = false;
        config.connect_timeout = Some(timeout);
        // Every call on this client is bounded as a whole by `timed_raw`. A read timeout on the
        // connection would also end every pooled connection idle for that long (the connector's
        // timer runs while the pool waits on it), so a callback whose cache answers every
        // confirmation opened a new TLS connection to the API server for each `/version` its
        // readiness asks: most of what an idle replica cost on the real node (docs/benchmarks.md).
        config.read_timeout = None;
        config.write_timeout = None;
        let mut watch_config = config.clone();
        watch_config.read_timeout = Some(WATCH_READ_TIMEOUT);
        watch_config.write_timeout = Some(timeout);
        let client = kube::Client::try_from(config).map_err(|e| ApiError(e.to_string()))?;
        let watch_client =
            kube::Client::try_from(watch_config).map_err(|e| ApiError(e.to_string()))?;
        Ok(Self {
            client,
            watch_client,
            timeout,
            latency,
            last_answer: Arc::default(),
        })
    }

    /// The client for single requests (bounded by the caller).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The client for watches (the pod cache's).
    pub fn watch_client(&self) -> kube::Client {
        self.watch_client.clone()
    }

    /// Records that the API just answered (a watch event counts): readiness needs no request.
    pub fn note_answer(&self) {
        *self
            .last_answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        self.timed_raw(async { call.await.map_err(|e| ApiError(e.to_string())) })
            .await
    }

    async fn timed_raw<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, call).await;
        self.latency.observe(started.elapsed().as_secs_f64());
        let result = result
            .unwrap_or_else(|_| Err(ApiError(format!("no answer within {:?}", self.timeout))));
        if result.is_ok() {
            self.note_answer();
        }
        result
    }

    /// A pod's [`PodFacts`], or `None` if it does not exist. `namespace` and `name` must be
    /// valid Kubernetes names (they become the request path).
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, ApiError> {
        athenz_core::names::validate_dns_label("namespace", namespace)
            .and_then(|()| athenz_core::names::validate_dns_subdomain("pod name", name))
            .map_err(|e| ApiError(format!("not asking for pod {namespace:?}/{name:?}: {e}")))?;
        let what = format!("pod {namespace}/{name}");
        let request = http::Request::get(format!("/api/v1/namespaces/{namespace}/pods/{name}"))
            .body(Vec::new())
            .map_err(|e| ApiError(format!("{what}: {e}")))?;
        self.timed_raw(async {
            match self.get_limited(request, MAX_POD_JSON, &what).await? {
                Some(body) => pod_facts(&body)
                    .map(Some)
                    .map_err(|e| ApiError(format!("{what}: {e}"))),
                None => Ok(None),
            }
        })
        .await
    }

    /// `GET` with the body read up to `limit` bytes; `None` on 404.
    async fn get_limited(
        &self,
        request: http::Request<Vec<u8>>,
        limit: usize,
        what: &str,
    ) -> Result<Option<bytes::Bytes>, ApiError> {
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|e| ApiError(format!("{what}: {e}")))?;
        let status = response.status();
        if status == http::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let read_limit = if status.is_success() {
            limit
        } else {
            MAX_ERROR_BODY
        };
        let body = http_body_util::Limited::new(response.into_body(), read_limit)
            .collect()
            .await
            .map(|collected| collected.to_bytes());
        if !status.is_success() {
            let why = body
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            return Err(ApiError(format!("{what}: answered {status}: {why}")));
        }
        body.map(Some).map_err(|e| {
            ApiError(format!(
                "{what}: reading the answer (at most {limit} bytes): {e}"
            ))
        })
    }

    /// A service, or `None` if it does not exist.
    pub async fn service(&self, namespace: &str, name: &str) -> Result<Option<Service>, ApiError> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        self.timed(api.get_opt(name)).await
    }

    /// A node, or `None` if it does not exist.
    pub async fn node(&self, name: &str) -> Result<Option<Node>, ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.timed(api.get_opt(name)).await
    }

    /// The API server's review of a service-account token for `audience` (`POST
    /// /apis/authentication.k8s.io/v1/tokenreviews`; a bad token is a review that says so, not an
    /// error).
    pub async fn review_token(&self, token: &str, audience: &str) -> Result<TokenReview, ApiError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![audience.to_owned()]),
            },
            ..TokenReview::default()
        };
        self.timed(api.create(&kube::api::PostParams::default(), &review))
            .await
    }

    /// Whether the API answers (readiness).
    pub async fn reachable(&self) -> bool {
        self.timed(self.client.apiserver_version()).await.is_ok()
    }

    /// Whether the API answers, asked only when no call got an answer within `recent`: a
    /// callback confirming launches shows the API answering without a request of its own. A
    /// failed call proves nothing either way (a 403 or 404 is the answer to that call), so
    /// only an answer counts, and without one the API is asked (`/version`).
    pub async fn reachable_within(&self, recent: Duration) -> bool {
        let answered = *self
            .last_answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if answered.is_some_and(|at| at.elapsed() < recent) {
            return true;
        }
        self.reachable().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_testbed::real_pods::{RealPod, real_pod, real_status};
    use k8s_openapi::api::core::v1::Pod;

    fn real_json(deleting: bool) -> Vec<u8> {
        let mut pod: Pod = real_pod(&RealPod {
            namespace: "payments",
            name: "web-7d9f8b6c5-x2x4q",
            service_account: "web",
            node: "node-a",
        })
        .expect("real pod");
        pod.metadata.uid = Some("0e5a7c1d-3a4b-4c5d-8e9f-0123456789ab".into());
        pod.status =
            Some(serde_json::from_value(real_status("10.1.2.3", "192.0.2.10")).expect("status"));
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        serde_json::to_vec(&pod).expect("json")
    }

    #[test]
    fn a_real_size_pod_yields_exactly_the_fields_the_checks_read() {
        let json = real_json(false);
        assert!(
            json.len() > 8 * 1024,
            "a real-size pod: {} bytes",
            json.len()
        );
        let full: Pod = serde_json::from_slice(&json).expect("k8s-openapi parses it");
        let facts = pod_facts(&json).expect("facts");
        let status = full.status.expect("status");
        let spec = full.spec.expect("spec");
        assert_eq!(facts.metadata.uid.as_deref(), full.metadata.uid.as_deref());
        assert!(!facts.metadata.deletion_timestamp);
        let fspec = facts.spec.expect("spec facts");
        assert_eq!(fspec.node_name.as_deref(), spec.node_name.as_deref());
        assert_eq!(
            fspec.service_account_name.as_deref(),
            spec.service_account_name.as_deref()
        );
        let fstatus = facts.status.expect("status facts");
        assert_eq!(fstatus.phase.as_deref(), status.phase.as_deref());
        assert_eq!(fstatus.pod_ip.as_deref(), Some("10.1.2.3"));
        let ips: Vec<String> = fstatus
            .pod_ips
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.ip.into_owned())
            .collect();
        let want: Vec<String> = status
            .pod_ips
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.ip)
            .collect();
        assert_eq!(ips, want);
        assert!(!ips.is_empty());

        assert!(
            pod_facts(&real_json(true))
                .expect("deleting")
                .metadata
                .deletion_timestamp
        );
    }

    #[test]
    fn nulls_and_missing_sections_are_absent_fields() {
        let facts = pod_facts(
            br#"{"metadata":{"uid":null,"deletionTimestamp":null},"spec":null,"status":{"podIPs":null}}"#,
        )
        .expect("nulls");
        assert_eq!(
            facts.metadata,
            athenz_core::pod_fields::MetaFields::default()
        );
        assert_eq!(facts.spec, None);
        assert_eq!(facts.status.expect("status").pod_ips, None);
        assert_eq!(pod_facts(b"{}").expect("empty"), PodFacts::default());
    }

    #[test]
    fn malformed_hostile_and_oversized_pods_are_errors_that_say_so() {
        for (json, says) in [
            (&b"not json"[..], "the pod's JSON"),
            (br#"{"metadata":{"uid":7}}"#, "invalid type"),
            (
                br#"{"status":{"podIPs":[{"ip":["10.0.0.1"]}]}}"#,
                "invalid type",
            ),
            (br#"{"spec":{"nodeName":"a"}"#, "EOF"),
            (br#""a pod""#, "invalid type"),
        ] {
            let err = pod_facts(json).expect_err("refused");
            assert!(err.contains(says), "{err}");
        }
        // deep nesting: skipped without recursing (no stack overflow), refused where parsed
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            pod_facts(deep.as_bytes()).expect("skipped"),
            PodFacts::default()
        );
        let deep = format!(
            "{{\"spec\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(pod_facts(deep.as_bytes()).is_err());
        let big = vec![b' '; MAX_POD_JSON + 1];
        assert!(pod_facts(&big).expect_err("big").contains("more than"));
    }

    /// A Kubernetes API that answers every request with `status` and `body`, on loopback.
    async fn api_answering(status: u16, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(answer.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                });
            }
        });
        url
    }

    async fn ask(status: u16, body: Vec<u8>) -> Result<Option<PodFacts>, ApiError> {
        athenz_core::install_crypto_provider();
        let url = api_answering(status, body).await;
        let cluster = Cluster::connect(Some(&url), Duration::from_secs(5), Histogram::new([0.1]))
            .await
            .unwrap();
        cluster.pod("payments", "web-0").await
    }

    #[tokio::test]
    async fn the_api_answers_are_read_within_bounds_and_named_in_errors() {
        let facts = ask(200, real_json(false)).await.unwrap().unwrap();
        assert_eq!(facts.spec.unwrap().node_name.as_deref(), Some("node-a"));
        assert_eq!(
            ask(404, br#"{"kind":"Status","code":404}"#.to_vec())
                .await
                .unwrap(),
            None
        );

        let err = ask(500, b"etcd is down".to_vec())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pod payments/web-0")
                && err.contains("500")
                && err.contains("etcd is down"),
            "{err}"
        );
        let err = ask(200, vec![b' '; MAX_POD_JSON + 1])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most"), "{err}");
        let err = ask(200, b"{\"metadata\":".to_vec())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("the pod's JSON"), "{err}");
    }

    /// A client of a port where nothing listens.
    async fn unreachable_cluster() -> Cluster {
        athenz_core::install_crypto_provider();
        Cluster::connect(
            Some("http://127.0.0.1:9"),
            Duration::from_secs(1),
            Histogram::new([0.1]),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn names_that_are_not_kubernetes_names_never_reach_the_request_path() {
        // nothing listens here: a request would fail differently
        let cluster = unreachable_cluster().await;
        for (ns, name) in [
            ("payments", "../../nodes/a"),
            ("a/b", "web"),
            ("payments", "web?watch=1"),
            ("", "web"),
        ] {
            let err = cluster.pod(ns, name).await.unwrap_err().to_string();
            assert!(err.contains("not asking for pod"), "{ns}/{name}: {err}");
        }
    }

    /// Readiness asks the API only when no call got an answer within the period: nothing
    /// listens at the URL, so `true` means no request was made.
    #[tokio::test]
    async fn a_recent_answer_is_readiness_without_a_request() {
        let cluster = unreachable_cluster().await;
        let period = Duration::from_secs(5);
        assert!(!cluster.reachable_within(period).await, "no answer yet");
        *cluster.last_answer.lock().unwrap() = Some(Instant::now());
        assert!(cluster.reachable_within(period).await);
        *cluster.last_answer.lock().unwrap() = Instant::now().checked_sub(period * 2);
        assert!(
            !cluster.reachable_within(period).await,
            "an old answer counts for nothing"
        );
        // a failed call is not an answer
        *cluster.last_answer.lock().unwrap() = None;
        assert!(cluster.pod("payments", "web").await.is_err());
        assert!(cluster.last_answer.lock().unwrap().is_none());
    }

    /// An API on loopback that answers `/version` on every request of a kept-alive connection,
    /// `answer_after` each request (or, with `None`, reads requests and never answers); returns
    /// its URL and the number of connections it accepted.
    async fn api_keeping_connections(
        answer_after: Option<Duration>,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let body = br#"{"major":"1","minor":"37","gitVersion":"v1.37.2","gitCommit":"x","gitTreeState":"clean","buildDate":"2026-11-01T00:00:00Z","goVersion":"go1.26","compiler":"gc","platform":"linux/amd64"}"#;
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    loop {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                            head.drain(..end + 4);
                            let Some(delay) = answer_after else {
                                continue;
                            };
                            tokio::time::sleep(delay).await;
                            let reply = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                                body.len()
                            );
                            if conn.write_all(reply.as_bytes()).await.is_err()
                                || conn.write_all(body).await.is_err()
                            {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// The call timeout of the clusters [`cluster_keeping_connections`] makes: long enough that
    /// a loopback answer comes within it on a loaded CI machine (300 ms was not, with a real API
    /// server busy beside it), short enough to keep the tests quick.
    const KEPT_CALL_TIMEOUT: Duration = Duration::from_millis(1500);

    /// A cluster client of [`KEPT_CALL_TIMEOUT`] for an [`api_keeping_connections`] API, and the
    /// count of connections that API accepted.
    async fn cluster_keeping_connections(
        answer_after: Option<Duration>,
    ) -> (Cluster, Arc<std::sync::atomic::AtomicUsize>) {
        athenz_core::install_crypto_provider();
        let (url, accepted) = api_keeping_connections(answer_after).await;
        let cluster = Cluster::connect(Some(&url), KEPT_CALL_TIMEOUT, Histogram::new([0.1]))
            .await
            .unwrap();
        (cluster, accepted)
    }

    /// Readiness asked twice, further apart than the call timeout, reuses the connection: an
    /// idle pooled connection is not ended by the timeout (it was, by a read timeout on the
    /// connector, and each `/version` then cost a new TLS connection to the API server).
    #[tokio::test]
    async fn an_idle_connection_outlives_the_call_timeout() {
        let (cluster, accepted) = cluster_keeping_connections(Some(Duration::ZERO)).await;
        assert!(cluster.reachable().await, "the API answers");
        tokio::time::sleep(KEPT_CALL_TIMEOUT * 3).await;
        assert!(cluster.reachable().await, "the API answers again");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "both answers came over one connection"
        );
    }

    /// A call sent on a connection that has waited idle almost the call timeout is answered,
    /// however long the answer takes within that timeout. With a read timeout of the call
    /// timeout on the connector (0.2.0's client), the timer started when the connection went
    /// idle ends it under the call: `client error (SendRequest)`, which the callback answers as
    /// 504 "cannot tell now".
    #[tokio::test]
    async fn a_call_on_a_connection_idle_almost_the_call_timeout_is_answered() {
        let answer_after = KEPT_CALL_TIMEOUT / 3;
        let (cluster, accepted) = cluster_keeping_connections(Some(answer_after)).await;
        assert!(cluster.reachable().await, "the API answers");
        tokio::time::sleep(KEPT_CALL_TIMEOUT - answer_after / 2).await;
        let version = cluster.timed(cluster.client.apiserver_version()).await;
        assert!(
            version.is_ok(),
            "the call on the idle connection: {version:?}"
        );
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "both answers came over one connection"
        );
    }

    /// Without a read timeout on the connection, a call to an API that never answers still
    /// ends at the call timeout, as unreachable.
    #[tokio::test]
    async fn an_api_that_never_answers_is_unreachable_at_the_call_timeout() {
        let (cluster, _) = cluster_keeping_connections(None).await;
        assert!(!cluster.reachable().await, "no answer is not reachable");
        let err = cluster
            .pod("payments", "web-0")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("no answer within {KEPT_CALL_TIMEOUT:?}")),
            "{err}"
        );
    }
}
