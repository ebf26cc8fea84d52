//! The jwt-service over real mutual TLS: who may ask, what is refused, the JWT's exact shape,
//! verification by an independent implementation (PyJWT), and key rotation without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_core::daemon::Shutdown;
use athenz_core::tls::{self, ClientIdentity};
use athenz_jwt_service::Config;
use athenz_testbed::fixtures;
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use base64::Engine;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Fixture {
    _dir: tempfile::TempDir,
    keys: PathBuf,
    ca: CertAuthority,
    url: String,
    shutdown: Shutdown,
}

fn ec_key_pem() -> String {
    PrivateKey::generate(KeyAlgorithm::P256)
        .unwrap()
        .to_pkcs8_pem()
        .unwrap()
        .expose()
        .to_owned()
}

fn rsa_key_pem() -> String {
    PrivateKey::generate(KeyAlgorithm::Rsa2048)
        .unwrap()
        .to_pkcs8_pem()
        .unwrap()
        .expose()
        .to_owned()
}

fn config(dir: &Path, keys: &Path, files: &athenz_testbed::pki::CertFiles) -> Config {
    Config::try_parse_from([
        "athenz-jwt-service",
        "--listen=127.0.0.1:0",
        "--ops-listen=127.0.0.1:0",
        &format!("--tls-cert={}", files.cert.display()),
        &format!("--tls-key={}", files.key.display()),
        &format!("--client-ca={}", files.ca.display()),
        "--allowed-principals=k8s.admin.athenz-agent,k8s.nodes.*",
        &format!("--keys-dir={}", keys.display()),
        "--keys-reload-interval=1s",
        &format!("--provider={}", fixtures::PROVIDER),
    ])
    .map(|mut c| {
        let _ = dir;
        c.lifetime = Duration::from_secs(300);
        c
    })
    .unwrap()
}

async fn start() -> Fixture {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("v1.pem"), ec_key_pem()).unwrap();
    // names that are not v<N>.pem are ignored quietly
    std::fs::write(keys.join("README"), "not a key").unwrap();
    std::fs::write(keys.join("v1.pem.bak"), "not a key").unwrap();
    std::os::unix::fs::symlink(".", keys.join("..data")).unwrap();
    let ca = CertAuthority::new_root("Test Root").unwrap();
    let files = ca
        .write_service_cert(
            dir.path(),
            "jwt",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service("k8s.admin.athenz-jwt-service", &["localhost"])
            },
        )
        .unwrap();
    let shutdown = Shutdown::new();
    let (bound, _task) =
        athenz_jwt_service::start(config(dir.path(), &keys, &files), shutdown.clone())
            .await
            .unwrap();
    Fixture {
        url: format!("https://127.0.0.1:{}/v1/jwt", bound.api.port()),
        _dir: dir,
        keys,
        ca,
        shutdown,
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

/// A client whose certificate is `cn` on node `node-1` (the node agent's instance-id URI).
fn client(ca: &CertAuthority, cn: Option<&str>) -> reqwest::Client {
    client_on(ca, cn, "node-1")
}

/// A client whose certificate is `cn` on `node`.
fn client_on(ca: &CertAuthority, cn: Option<&str>, node: &str) -> reqwest::Client {
    client_with(
        ca,
        cn.map(|cn| LeafSpec {
            uris: vec![athenz_core::names::instance_id_uri(
                fixtures::PROVIDER,
                node,
            )],
            ..LeafSpec::service(cn, &[])
        }),
    )
}

/// A client presenting a certificate made from `spec`.
fn client_with(ca: &CertAuthority, spec: Option<LeafSpec>) -> reqwest::Client {
    let roots = athenz_core::crypto::pem_certificates(ca.root_pem()).unwrap();
    let identity = spec.map(|spec| {
        let issued = ca.issue(&spec, KeyAlgorithm::P256).unwrap();
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

fn subject_json() -> serde_json::Value {
    serde_json::json!({"subject": {
        "namespace": fixtures::NAMESPACE,
        "name": fixtures::POD_NAME,
        "uid": fixtures::POD_UID,
        "domain": fixtures::DOMAIN,
        "service": fixtures::SERVICE,
        "ip": fixtures::POD_IP.to_string(),
    }})
}

async fn get_jwt(c: &reqwest::Client, url: &str) -> String {
    let resp = c.post(url).json(&subject_json()).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    body["jwt"].as_str().unwrap().to_owned()
}

fn decode_part(jwt: &str, i: usize) -> serde_json::Value {
    let part = jwt.split('.').nth(i).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .unwrap(),
    )
    .unwrap()
}

/// Verifies with PyJWT, an implementation that shares no code with ours.
fn pyjwt_verify(jwt: &str, public_pem: &str, alg: &str) -> serde_json::Value {
    let script = r#"
import json, sys, jwt
token, key, alg = sys.stdin.read().split("\n---\n")
print(json.dumps(jwt.decode(token, key, algorithms=[alg.strip()], audience="k8s-athenz-identity")))
"#;
    athenz_testbed::pyjwt::run(script, &[jwt, public_pem, alg]).unwrap()
}

fn public_of(private_pem: &str) -> String {
    athenz_jwt_service::signer::JwtSigner::from_pem(private_pem.as_bytes())
        .unwrap()
        .public_key_pem()
        .unwrap()
}

#[tokio::test]
async fn allowed_agents_get_a_jwt_of_the_contract_shape() {
    let f = start().await;
    let key_pem = std::fs::read_to_string(f.keys.join("v1.pem")).unwrap();
    for cn in ["k8s.admin.athenz-agent", "k8s.nodes.node-1"] {
        let jwt = get_jwt(&client(&f.ca, Some(cn)), &f.url).await;
        let header = decode_part(&jwt, 0);
        assert_eq!(
            header,
            serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": "v1"})
        );
        let claims = pyjwt_verify(&jwt, &public_of(&key_pem), "ES256");
        assert_eq!(claims["iss"], "athenz-k8s-identity/jwt-service");
        assert_eq!(claims["aud"], "k8s-athenz-identity");
        assert_eq!(
            claims["sub"],
            format!(
                "pod:{}/{}?d={}&n={}&i={}&u={}",
                fixtures::NAMESPACE,
                fixtures::POD_NAME,
                fixtures::DOMAIN,
                fixtures::SERVICE,
                fixtures::POD_IP,
                fixtures::POD_UID
            )
        );
        let iat = claims["iat"].as_i64().unwrap();
        assert_eq!(claims["nbf"].as_i64().unwrap(), iat);
        assert_eq!(claims["exp"].as_i64().unwrap() - iat, 300);
        assert_eq!(claims["jti"].as_str().unwrap().len(), 32);
        assert_eq!(claims["node"], "node-1");
    }
    // the node is the caller's, from its certificate
    let jwt = get_jwt(
        &client_on(
            &f.ca,
            Some("k8s.admin.athenz-agent"),
            "ip-10-0-0-2.ec2.internal",
        ),
        &f.url,
    )
    .await;
    assert_eq!(decode_part(&jwt, 1)["node"], "ip-10-0-0-2.ec2.internal");
    // every token has its own jti
    let c = client(&f.ca, Some("k8s.nodes.node-1"));
    let a = decode_part(&get_jwt(&c, &f.url).await, 1)["jti"].clone();
    let b = decode_part(&get_jwt(&c, &f.url).await, 1)["jti"].clone();
    assert_ne!(a, b);
}

#[tokio::test]
async fn callers_that_are_not_allowed_are_refused() {
    let f = start().await;
    // an allowed CA, a principal not on the list
    let resp = client(&f.ca, Some("k8s.admin.stranger"))
        .post(&f.url)
        .json(&subject_json())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("k8s.admin.stranger")
    );
    // no client certificate, and one from another CA: no TLS session at all
    assert!(
        client(&f.ca, None)
            .post(&f.url)
            .json(&subject_json())
            .send()
            .await
            .is_err()
    );
    let other = CertAuthority::new_root("Other").unwrap();
    let roots = athenz_core::crypto::pem_certificates(f.ca.root_pem()).unwrap();
    let foreign = other
        .issue(
            &LeafSpec::service("k8s.admin.athenz-agent", &[]),
            KeyAlgorithm::P256,
        )
        .unwrap();
    let c = reqwest::Client::builder()
        .tls_backend_preconfigured(
            tls::client_config(
                &roots,
                Some(ClientIdentity::Fixed(
                    tls::certified_key_from_pem(&foreign.chain_pem, foreign.key_pem.expose())
                        .unwrap(),
                )),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    assert!(c.post(&f.url).json(&subject_json()).send().await.is_err());
}

#[tokio::test]
async fn callers_whose_certificate_names_no_node_are_refused() {
    let f = start().await;
    let agent = "k8s.admin.athenz-agent";
    let uri = |provider: &str, node: &str| athenz_core::names::instance_id_uri(provider, node);
    for (what, uris) in [
        ("no instance id", vec![]),
        ("another provider's", vec![uri("other.provider", "node-1")]),
        (
            "two nodes",
            vec![
                uri(fixtures::PROVIDER, "node-1"),
                uri(fixtures::PROVIDER, "node-2"),
            ],
        ),
        ("not a node name", vec![uri(fixtures::PROVIDER, "Node_1")]),
    ] {
        let c = client_with(
            &f.ca,
            Some(LeafSpec {
                uris,
                ..LeafSpec::service(agent, &[])
            }),
        );
        let resp = c.post(&f.url).json(&subject_json()).send().await.unwrap();
        assert_eq!(resp.status(), 403, "{what}");
        let body: serde_json::Value = resp.json().await.unwrap();
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("caller's certificate"),
            "{what}: {message}"
        );
    }
    // the request cannot name the node, at the top or in the subject
    let c = client(&f.ca, Some(agent));
    let mut top = subject_json();
    top["node"] = "node-2".into();
    let mut inner = subject_json();
    inner["subject"]["node"] = "node-2".into();
    for body in [top, inner] {
        let resp = c.post(&f.url).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 400, "{body}");
    }
}

#[tokio::test]
async fn malformed_oversized_and_invalid_requests() {
    let f = start().await;
    let c = client(&f.ca, Some("k8s.admin.athenz-agent"));
    let post = |body: Vec<u8>| c.post(&f.url).body(body).send();
    let message = |v: serde_json::Value| v["message"].as_str().unwrap().to_owned();

    let resp = post(b"{".to_vec()).await.unwrap();
    assert_eq!(resp.status(), 400);
    let resp = post(vec![b' '; 70 * 1024]).await.unwrap();
    assert_eq!(resp.status(), 413);
    let mut bad = subject_json();
    bad["subject"]["service"] = "../admin".into();
    let resp = post(serde_json::to_vec(&bad).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 400);
    assert!(message(resp.json().await.unwrap()).contains("invalid service"));
    let mut bad = subject_json();
    bad["subject"]["uid"] = "not-a-uid".into();
    let resp = post(serde_json::to_vec(&bad).unwrap()).await.unwrap();
    assert!(message(resp.json().await.unwrap()).contains("invalid uid"));
    let mut bad = subject_json();
    bad["extra"] = 1.into();
    assert_eq!(
        post(serde_json::to_vec(&bad).unwrap())
            .await
            .unwrap()
            .status(),
        400
    );
    let resp = c.get(&f.url).send().await.unwrap();
    assert_eq!(resp.status(), 405);
}

#[tokio::test]
async fn a_new_key_version_signs_without_a_restart() {
    let f = start().await;
    let c = client(&f.ca, Some("k8s.admin.athenz-agent"));
    assert_eq!(decode_part(&get_jwt(&c, &f.url).await, 0)["kid"], "v1");
    let v2 = rsa_key_pem();
    std::fs::write(f.keys.join("v2.pem"), &v2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let jwt = loop {
        let jwt = get_jwt(&c, &f.url).await;
        if decode_part(&jwt, 0)["kid"] == "v2" {
            break jwt;
        }
        assert!(Instant::now() < deadline, "v2 never started signing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(decode_part(&jwt, 0)["alg"], "RS256");
    pyjwt_verify(&jwt, &public_of(&v2), "RS256");
    // a broken higher version is skipped, v2 keeps signing
    std::fs::write(f.keys.join("v3.pem"), "garbage").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(decode_part(&get_jwt(&c, &f.url).await, 0)["kid"], "v2");
}

#[tokio::test]
async fn refuses_to_start_without_a_usable_key() {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("v1.pem"), "garbage").unwrap();
    let ca = CertAuthority::new_root("Root").unwrap();
    let files = ca
        .write_service_cert(dir.path(), "jwt", &LeafSpec::service("k8s.admin.jwt", &[]))
        .unwrap();
    let err = athenz_jwt_service::start(config(dir.path(), &keys, &files), Shutdown::new())
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("--keys-dir (SIGNING_KEYS_DIR)") && text.contains("v1.pem"),
        "{text}"
    );
}

#[tokio::test]
async fn ops_endpoints_report_health_and_metrics() {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("v1.pem"), ec_key_pem()).unwrap();
    let ca = CertAuthority::new_root("Root").unwrap();
    let files = ca
        .write_service_cert(
            dir.path(),
            "jwt",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service("k8s.admin.jwt", &[])
            },
        )
        .unwrap();
    let shutdown = Shutdown::new();
    let (bound, task) =
        athenz_jwt_service::start(config(dir.path(), &keys, &files), shutdown.clone())
            .await
            .unwrap();
    let url = format!("https://127.0.0.1:{}/v1/jwt", bound.api.port());
    get_jwt(&client(&ca, Some("k8s.nodes.n1")), &url).await;
    let ops = format!("http://{}", bound.ops);
    let plain = reqwest::Client::new();
    assert_eq!(
        plain
            .get(format!("{ops}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        plain
            .get(format!("{ops}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = plain
        .get(format!("{ops}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"athenz_jwt_service_jwts_issued_total{alg="ES256"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"athenz_jwt_service_http_requests_total{route="jwt",status="200"} 1"#),
        "{metrics}"
    );
    // SIGTERM-style shutdown drains and stops both listeners
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    assert!(plain.get(format!("{ops}/healthz")).send().await.is_err());
}
