//! The node authorizer over mutual TLS, as the API server calls it: its decisions, who may call,
//! the limits on what is sent, and the decision counter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, pem_certificates};
use athenz_core::daemon::Shutdown;
use athenz_core::tls::{self, ClientIdentity};
use athenz_initializer::node_authorizer::{Config, start};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use clap::Parser;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;

const AGENT: &str = "system:serviceaccount:athenz-system:athenz-agent";
const APISERVER: &str = "kubernetes.kube-apiserver";

struct Authorizer {
    url: String,
    ops: SocketAddr,
    ca: CertAuthority,
    shutdown: Shutdown,
    _dir: tempfile::TempDir,
}

impl Drop for Authorizer {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

fn config(dir: &std::path::Path, ca: &CertAuthority, agent: &str) -> Config {
    let files = ca
        .write_service_cert(
            dir,
            "authorizer",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service("athenz-node-authorizer", &[])
            },
        )
        .unwrap();
    Config::try_parse_from([
        "athenz-node-authorizer".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        "--ops-listen=127.0.0.1:0".to_owned(),
        format!("--tls-cert={}", files.cert.display()),
        format!("--tls-key={}", files.key.display()),
        format!("--client-ca={}", files.ca.display()),
        format!("--allowed-principals={APISERVER}"),
        format!("--agent-user={agent}"),
    ])
    .unwrap()
}

async fn start_authorizer() -> Authorizer {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new_root("Cluster CA").unwrap();
    let shutdown = Shutdown::new();
    let (bound, _) = start(config(dir.path(), &ca, AGENT), shutdown.clone())
        .await
        .unwrap();
    Authorizer {
        url: format!("https://127.0.0.1:{}/authorize", bound.api.port()),
        ops: bound.ops,
        ca,
        shutdown,
        _dir: dir,
    }
}

impl Authorizer {
    /// A client presenting a certificate for `cn` (none: no client certificate).
    fn client(&self, cn: Option<&str>) -> reqwest::Client {
        let roots = pem_certificates(self.ca.root_pem()).unwrap();
        let identity = cn.map(|cn| {
            let issued = self
                .ca
                .issue(&LeafSpec::service(cn, &[]), KeyAlgorithm::P256)
                .unwrap();
            ClientIdentity::Fixed(
                tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose()).unwrap(),
            )
        });
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls::client_config(&roots, identity).unwrap())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    }

    async fn post(&self, body: Vec<u8>) -> (u16, Value) {
        let resp = self
            .client(Some(APISERVER))
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.ops))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// A review as the API server sends it for a pod-bound token's `list pods` with `selector`.
fn review(user: &str, selector: Option<&str>) -> Vec<u8> {
    let mut attributes = json!({"verb": "list", "version": "v1", "resource": "pods"});
    if let Some(node) = selector {
        attributes["fieldSelector"] =
            json!({"requirements": [{"key": "spec.nodeName", "operator": "In", "values": [node]}]});
    }
    serde_json::to_vec(&json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {"creationTimestamp": null},
        "spec": {
            "resourceAttributes": attributes,
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/node-name": ["node-a"]},
            "uid": "0b4f8f5e"
        },
        "status": {"allowed": false}
    }))
    .unwrap()
}

#[tokio::test]
async fn it_denies_the_agent_beyond_its_node_and_has_no_opinion_otherwise() {
    let a = start_authorizer().await;
    let (status, body) = a.post(review(AGENT, Some("node-b"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(body["kind"], "SubjectAccessReview");
    assert_eq!(body["status"]["allowed"], false);
    assert_eq!(body["status"]["denied"], true);
    assert!(
        body["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("spec.nodeName=node-a"),
        "{body}"
    );
    let (_, body) = a.post(review(AGENT, None)).await;
    assert_eq!(body["status"]["denied"], true);
    for (user, selector) in [
        (AGENT, Some("node-a")),
        ("system:serviceaccount:default:default", None),
    ] {
        let (status, body) = a.post(review(user, selector)).await;
        assert_eq!(status, 200);
        assert_eq!(
            body["status"],
            json!({"allowed": false, "denied": false}),
            "{user}"
        );
    }
    let (status, _) = a.post(b"{\"apiVersion\": [".to_vec()).await;
    assert_eq!(status, 400);
    let metrics = a.metrics().await;
    for line in [
        "athenz_node_authorizer_decisions_total{outcome=\"denied\"} 2",
        "athenz_node_authorizer_decisions_total{outcome=\"own_node\"} 1",
        "athenz_node_authorizer_decisions_total{outcome=\"not_governed\"} 1",
        "athenz_node_authorizer_decisions_total{outcome=\"malformed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
}

#[tokio::test]
async fn only_the_allowed_principal_may_call() {
    let a = start_authorizer().await;
    let other = a
        .client(Some("k8s.admin.athenz-callback"))
        .post(&a.url)
        .body(review(AGENT, Some("node-b")))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status().as_u16(), 403);
    // no client certificate: the handshake itself fails
    assert!(
        a.client(None)
            .post(&a.url)
            .body(review(AGENT, Some("node-b")))
            .send()
            .await
            .is_err()
    );
}

#[tokio::test]
async fn routes_methods_and_sizes_are_bounded() {
    let a = start_authorizer().await;
    let client = a.client(Some(APISERVER));
    let get = client.get(&a.url).send().await.unwrap();
    assert_eq!(get.status().as_u16(), 405);
    let elsewhere = client
        .post(a.url.replace("/authorize", "/mutate"))
        .body(review(AGENT, None))
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status().as_u16(), 404);
    // past 64 KiB: refused before it is read as a review
    let mut big = review(AGENT, Some("node-a"));
    big.pop();
    big.extend_from_slice(b", \"padding\": \"");
    big.extend(std::iter::repeat_n(b'x', 70 * 1024));
    big.extend_from_slice(b"\"}");
    let (status, _) = a.post(big).await;
    assert_eq!(status, 413);
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let (status, body) = a.post(deep.into_bytes()).await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn an_agent_user_that_is_no_service_account_is_refused_at_start() {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new_root("Cluster CA").unwrap();
    for bad in [
        "athenz-agent",
        "system:serviceaccount:athenz-system",
        "system:serviceaccount:Bad:x",
    ] {
        let err = start(config(dir.path(), &ca, bad), Shutdown::new())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("--agent-user"), "{err}");
    }
}
