//! The callback under test, started in-process over real mutual TLS against the Kubernetes API
//! and dev ZTS stand-ins, and the confirmations and tokens the tests send it: shared by
//! callback.rs and athenz_provider_client.rs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use athenz_callback::Config;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, pem_certificates};
use athenz_core::daemon::Shutdown;
use athenz_core::identity_jwt::IdentityClaims;
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use athenz_jwt_service::signer::JwtSigner;
use athenz_testbed::fixtures::{self, DOMAIN, NAMESPACE, POD_NAME, POD_UID, PROVIDER, SERVICE};
use athenz_testbed::kube_api::{KubeApi, running_pod};
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use clap::Parser;
use std::collections::BTreeMap;
use std::time::Duration;

pub struct Fixture {
    pub zts: DevZts,
    pub kube: KubeApi,
    pub ec: JwtSigner,
    pub rsa: JwtSigner,
    pub endpoint: String,
    /// The operations endpoint (`/metrics`).
    pub ops: std::net::SocketAddr,
    pub shutdown: Shutdown,
    pub _dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

pub fn key_pem(alg: KeyAlgorithm) -> String {
    PrivateKey::generate(alg)
        .unwrap()
        .to_pkcs8_pem()
        .unwrap()
        .expose()
        .to_owned()
}

pub async fn start() -> Fixture {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let zts = DevZts::start(DevZtsConfig::default()).await.unwrap();
    let kube = KubeApi::start().await.unwrap();
    kube.cluster().put_pod(running_pod(
        NAMESPACE,
        POD_NAME,
        POD_UID,
        SERVICE,
        &fixtures::POD_IP.to_string(),
        "node-1",
    ));
    let ec = JwtSigner::from_pem(key_pem(KeyAlgorithm::P256).as_bytes()).unwrap();
    let rsa = JwtSigner::from_pem(key_pem(KeyAlgorithm::Rsa2048).as_bytes()).unwrap();
    let keys = dir.path().join("public");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("v1.pem"), ec.public_key_pem().unwrap()).unwrap();
    std::fs::write(keys.join("v2.pem"), rsa.public_key_pem().unwrap()).unwrap();
    // the callback's server certificate: CN = the provider, from the PKI ZTS trusts
    let files = zts
        .ca()
        .write_service_cert(
            dir.path(),
            "callback",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service(PROVIDER, &["localhost"])
            },
        )
        .unwrap();
    let config = Config::try_parse_from([
        "athenz-callback",
        "--listen=127.0.0.1:0",
        "--ops-listen=127.0.0.1:0",
        &format!("--tls-cert={}", files.cert.display()),
        &format!("--tls-key={}", files.key.display()),
        &format!("--client-ca={}", zts.ca_path().display()),
        "--allowed-principals=sys.auth.zts",
        "--base-path=/callback",
        &format!("--provider={PROVIDER}"),
        &format!("--public-keys-dir={}", keys.display()),
        "--keys-reload-interval=1s",
        &format!("--dns-suffix={}", fixtures::DNS_SUFFIX),
        &format!("--admin-domain={}", fixtures::ADMIN_DOMAIN),
        &format!("--kube-api-url={}", kube.url()),
        // the API stand-in serves no watch
        "--pod-cache=false",
        "--cert-expiry-minutes=90",
    ])
    .unwrap();
    let shutdown = Shutdown::new();
    let (bound, _task) = athenz_callback::start(config, shutdown.clone())
        .await
        .unwrap();
    let endpoint = format!("https://127.0.0.1:{}/callback", bound.api.port());
    zts.add_provider(ProviderEntry {
        name: PROVIDER.into(),
        endpoint: endpoint.clone(),
        dns_suffixes: vec![fixtures::DNS_SUFFIX.into()],
        launch: vec!["*".into()],
    })
    .unwrap();
    Fixture {
        zts,
        kube,
        ec,
        rsa,
        endpoint,
        ops: bound.ops,
        shutdown,
        _dir: dir,
    }
}

impl Fixture {
    /// `GET /metrics` of the callback's operations endpoint.
    pub async fn metrics_text(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.ops))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A client with a certificate for `cn` from the ZTS PKI.
    pub fn client(&self, cn: Option<&str>) -> reqwest::Client {
        self.client_with(cn.map(|cn| LeafSpec::service(cn, &[])))
    }

    /// A client with node `node`'s agent identity.
    pub fn node_client(&self, node: &str) -> reqwest::Client {
        self.client_with(Some(LeafSpec {
            uris: vec![athenz_core::names::instance_id_uri(PROVIDER, node)],
            ..LeafSpec::service(fixtures::AGENT_PRINCIPAL, &[])
        }))
    }

    pub fn client_with(&self, spec: Option<LeafSpec>) -> reqwest::Client {
        let roots = pem_certificates(self.zts.root_pem()).unwrap();
        let identity = spec.map(|spec| {
            let issued = self.zts.ca().issue(&spec, KeyAlgorithm::P256).unwrap();
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

    pub async fn post(&self, route: &str, body: &str) -> (u16, serde_json::Value) {
        let resp = self
            .client(Some("sys.auth.zts"))
            .post(format!("{}/{route}", self.endpoint))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn confirm(&self, c: &InstanceConfirmation) -> (u16, serde_json::Value) {
        self.post("instance", &serde_json::to_string(c).unwrap())
            .await
    }
}

pub fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

pub fn claims() -> IdentityClaims {
    let t = now();
    IdentityClaims {
        iss: "athenz-k8s-identity/jwt-service".into(),
        aud: "k8s-athenz-identity".into(),
        sub: format!(
            "pod:{NAMESPACE}/{POD_NAME}?d={DOMAIN}&n={SERVICE}&i={}&u={POD_UID}",
            fixtures::POD_IP
        ),
        iat: t,
        nbf: t,
        exp: t + 300,
        jti: athenz_core::random::hex_name::<16>(),
        node: "node-1".into(),
    }
}

pub fn confirmation(jwt: String) -> InstanceConfirmation {
    let identity =
        athenz_core::names::CsrIdentity::for_pod(&athenz_core::names::PodIdentityInput {
            domain: DOMAIN,
            service: SERVICE,
            provider: PROVIDER,
            dns_suffix: fixtures::DNS_SUFFIX,
            instance_id: POD_UID,
            pod_ip: Some(fixtures::POD_IP),
            service_ip: None,
        })
        .unwrap();
    let mut attributes = BTreeMap::new();
    attributes.insert("instanceId".to_owned(), POD_UID.to_owned());
    attributes.insert("clientIP".to_owned(), "10.9.9.9".to_owned());
    attributes.insert("sanDNS".to_owned(), identity.dns_names.join(","));
    attributes.insert("sanIP".to_owned(), fixtures::POD_IP.to_string());
    attributes.insert("sanURI".to_owned(), identity.uris.join(","));
    InstanceConfirmation {
        provider: PROVIDER.into(),
        domain: DOMAIN.into(),
        service: SERVICE.into(),
        attestation_data: Secret::new(jwt),
        attributes,
    }
}

pub fn es256(f: &Fixture, c: &IdentityClaims) -> String {
    f.ec.sign("v1", c).unwrap()
}

/// A JWT with any JSON claims (for missing-claim cases).
pub fn es256_raw(f: &Fixture, c: &serde_json::Value) -> String {
    f.ec.sign("v1", c).unwrap()
}

pub fn assert_denied(result: (u16, serde_json::Value), check: &str) {
    let (status, body) = result;
    assert_eq!(status, 403, "{check}: {body}");
    assert_eq!(body["code"], 403);
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{check}: ")),
        "{check}: {message}"
    );
}
