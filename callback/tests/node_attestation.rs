//! Node agents' registrations (docs/design.md §4.9) through the dev ZTS and the real callback over
//! mutual TLS, against the Kubernetes API stand-in's TokenRequest and TokenReview: a genuine agent
//! gets its node certificate and refreshes it; every kind of wrong token, pod, node or name is
//! refused with its own named reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_callback::Config;
use athenz_core::crypto::{CertInfo, KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_core::daemon::Shutdown;
use athenz_core::names::CsrIdentity;
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::{
    InstanceRef, InstanceRefreshInformation, InstanceRegisterInformation, ZtsClient,
    ZtsClientConfig,
};
use athenz_testbed::fixtures::{
    self, AGENT_NAMESPACE, AGENT_PRINCIPAL, AGENT_SERVICE_ACCOUNT, NODE_TOKEN_AUDIENCE, PROVIDER,
};
use athenz_testbed::kube_api::tokens::BoundTokenRequest;
use athenz_testbed::kube_api::{KubeApi, mark_terminating, running_pod};
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use clap::Parser;
use std::time::Duration;

struct Fixture {
    _zts: DevZts,
    kube: KubeApi,
    client: ZtsClient,
    shutdown: Shutdown,
    _dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

async fn start() -> Fixture {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let zts = DevZts::start(DevZtsConfig::default()).await.unwrap();
    let kube = KubeApi::start().await.unwrap();
    let keys = dir.path().join("public");
    std::fs::create_dir(&keys).unwrap();
    let signing = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    std::fs::write(keys.join("v1.pem"), signing.key_pair().public_key_pem()).unwrap();
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
        &format!("--provider={PROVIDER}"),
        &format!("--public-keys-dir={}", keys.display()),
        &format!("--dns-suffix={}", fixtures::DNS_SUFFIX),
        &format!("--admin-domain={}", fixtures::ADMIN_DOMAIN),
        &format!("--kube-api-url={}", kube.url()),
        // the API stand-in serves no watch
        "--pod-cache=false",
        "--cert-expiry-minutes=60",
    ])
    .unwrap();
    let shutdown = Shutdown::new();
    let (bound, _) = athenz_callback::start(config, shutdown.clone())
        .await
        .unwrap();
    zts.add_provider(ProviderEntry {
        name: PROVIDER.into(),
        endpoint: format!("https://127.0.0.1:{}", bound.api.port()),
        dns_suffixes: vec![fixtures::DNS_SUFFIX.into()],
        launch: vec!["*".into()],
    })
    .unwrap();
    let client = ZtsClient::new(ZtsClientConfig {
        url: zts.url().into(),
        ca: athenz_core::tls::ServerCaBundle::fixed(pem_certificates(zts.root_pem()).unwrap())
            .unwrap(),
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    Fixture {
        _zts: zts,
        kube,
        client,
        shutdown,
        _dir: dir,
    }
}

fn node_csr(node: &str, key: &PrivateKey) -> String {
    build_csr(
        &CsrIdentity::for_node(AGENT_PRINCIPAL, PROVIDER, fixtures::DNS_SUFFIX, node).unwrap(),
        key,
    )
    .unwrap()
}

fn register_info(token: &str, csr: String) -> InstanceRegisterInformation {
    InstanceRegisterInformation {
        provider: PROVIDER.into(),
        domain: fixtures::ADMIN_DOMAIN.into(),
        service: "athenz-agent".into(),
        attestation_data: Secret::new(token.to_owned()),
        csr,
        ..Default::default()
    }
}

impl Fixture {
    /// Registers node `node` with `token`; the ZTS error text on refusal.
    async fn register(&self, token: &str, node: &str) -> Result<CertInfo, String> {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        self.register_csr(token, node_csr(node, &key)).await
    }

    async fn register_csr(&self, token: &str, csr: String) -> Result<CertInfo, String> {
        self.client
            .register(&register_info(token, csr))
            .await
            .map(|r| CertInfo::from_pem(r.identity.x509_certificate.as_deref().unwrap()).unwrap())
            .map_err(|e| {
                assert_eq!(e.status(), Some(403), "{e}");
                e.to_string()
            })
    }

    fn mint(&self, pod: &str, account: &str, audience: &str) -> String {
        self.kube
            .cluster()
            .mint_token(&BoundTokenRequest {
                namespace: AGENT_NAMESPACE,
                account,
                pod_name: pod,
                pod_uid: None,
                audiences: &[audience.to_owned()],
                expiration_secs: None,
            })
            .unwrap()
            .token
    }
}

fn assert_refused(result: Result<CertInfo, String>, check: &str) {
    let message = result.expect_err(check);
    assert!(
        message.contains(&format!("{check}: ")),
        "{check}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_genuine_agent_registers_and_refreshes_as_its_node() {
    let f = start().await;
    let (_, token) = f.kube.cluster().start_node_agent("node-1").unwrap();
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let registered = f
        .client
        .register(&register_info(&token.token, node_csr("node-1", &key)))
        .await
        .unwrap();
    let leaf = registered.identity.x509_certificate.unwrap();
    let cert = CertInfo::from_pem(&leaf).unwrap();
    assert_eq!(cert.common_name, AGENT_PRINCIPAL);
    assert!(
        cert.uris
            .contains(&athenz_core::names::instance_id_uri(PROVIDER, "node-1"))
    );
    assert!(cert.ip_addresses.is_empty());
    assert_eq!((cert.not_after - cert.not_before).whole_minutes(), 60);

    // refresh with the certificate and a fresh token (the kubelet rotated the file)
    let presented = tls::certified_key_from_pem(
        &format!(
            "{leaf}\n{}",
            registered.identity.x509_certificate_signer.unwrap()
        ),
        key.to_pkcs8_pem().unwrap().expose(),
    )
    .unwrap();
    let fresh = f.mint(
        "athenz-agent-node-1",
        AGENT_SERVICE_ACCOUNT,
        NODE_TOKEN_AUDIENCE,
    );
    let new_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let refreshed = f
        .client
        .refresh_instance(
            &InstanceRef {
                provider: PROVIDER,
                domain: fixtures::ADMIN_DOMAIN,
                service: "athenz-agent",
                instance_id: "node-1",
            },
            &InstanceRefreshInformation {
                attestation_data: Some(Secret::new(fresh)),
                csr: Some(node_csr("node-1", &new_key)),
                ..Default::default()
            },
            ClientIdentity::Fixed(presented),
        )
        .await
        .unwrap();
    let new = CertInfo::from_pem(refreshed.x509_certificate.as_deref().unwrap()).unwrap();
    assert_ne!(new.serial_hex, cert.serial_hex);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wrong_attestation_is_refused_with_its_reason() {
    let f = start().await;
    let cluster = f.kube.cluster().clone();
    let (agent_pod, token) = cluster.start_node_agent("node-1").unwrap();
    let agent_name = agent_pod.metadata.name.clone().unwrap();
    cluster.start_node_agent("node-2").unwrap();

    // a token of another service account (a pod in the agents' namespace running as another)
    cluster.put_pod(running_pod(
        AGENT_NAMESPACE,
        "intruder",
        "11111111-2222-4333-8444-555555555555",
        "default",
        "",
        "node-1",
    ));
    let other_account = f.mint("intruder", "default", NODE_TOKEN_AUDIENCE);
    assert_refused(f.register(&other_account, "node-1").await, "node_account");

    // another audience (the API server's own)
    let other_audience = f.mint(
        &agent_name,
        AGENT_SERVICE_ACCOUNT,
        "https://kubernetes.default.svc",
    );
    assert_refused(f.register(&other_audience, "node-1").await, "node_token");

    // an expired token: signed by the API server, issued two hours ago for an hour
    let expired = cluster
        .mint_token_at(
            time::OffsetDateTime::now_utc().unix_timestamp() - 7200,
            &BoundTokenRequest {
                namespace: AGENT_NAMESPACE,
                account: AGENT_SERVICE_ACCOUNT,
                pod_name: &agent_name,
                pod_uid: None,
                audiences: &[NODE_TOKEN_AUDIENCE.to_owned()],
                expiration_secs: Some(3600),
            },
        )
        .unwrap()
        .token;
    let message = f.register(&expired, "node-1").await.unwrap_err();
    assert!(
        message.contains("node_token: ") && message.contains("xpired"),
        "{message}"
    );

    // the agent pod on node-1 claims node-2
    assert_refused(f.register(&token.token, "node-2").await, "node_instance_id");

    // SANs beyond the node identity: an IP, another DNS name
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let mut wide =
        CsrIdentity::for_node(AGENT_PRINCIPAL, PROVIDER, fixtures::DNS_SUFFIX, "node-1").unwrap();
    wide.dns_names
        .push(format!("extra.k8s-admin.{}", fixtures::DNS_SUFFIX));
    assert_refused(
        f.register_csr(&token.token, build_csr(&wide, &key).unwrap())
            .await,
        "node_sans",
    );

    // not a token at all
    assert_refused(f.register("not-a-jwt", "node-1").await, "node_token");

    // the pod was moved after the token was minted (its token names node-1, the pod is on node-2)
    cluster.update_pod(AGENT_NAMESPACE, &agent_name, |p| {
        p.spec.as_mut().unwrap().node_name = Some("node-2".into())
    });
    assert_refused(f.register(&token.token, "node-1").await, "node_instance_id");
    assert_refused(f.register(&token.token, "node-2").await, "node_name");
    cluster.update_pod(AGENT_NAMESPACE, &agent_name, |p| {
        p.spec.as_mut().unwrap().node_name = Some("node-1".into())
    });

    // the node was deleted and re-created: another uid than the token names
    cluster.delete_node("node-1");
    cluster.put_node("node-1");
    assert_refused(f.register(&token.token, "node-1").await, "node_uid");

    // a terminating agent pod: the API server no longer authenticates its token
    let (pod, token) = cluster.start_node_agent("node-3").unwrap();
    f.register(&token.token, "node-3").await.unwrap();
    cluster.update_pod(
        AGENT_NAMESPACE,
        pod.metadata.name.as_deref().unwrap(),
        mark_terminating,
    );
    assert_refused(f.register(&token.token, "node-3").await, "node_token");

    // a token of a deleted pod
    let (pod, token) = cluster.start_node_agent("node-4").unwrap();
    cluster.delete_pod(AGENT_NAMESPACE, pod.metadata.name.as_deref().unwrap());
    let message = f.register(&token.token, "node-4").await.unwrap_err();
    assert!(
        message.contains("node_token: ") && message.contains("not found"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_identity_jwt_cannot_register_a_node_nor_a_token_a_pod() {
    let f = start().await;
    // a pod-shaped registration whose attestation is the agent's service-account token: the
    // callback treats it as a pod JWT, whose key id it does not know
    let (_, token) = f.kube.cluster().start_node_agent("node-1").unwrap();
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    f.kube.cluster().put_pod(running_pod(
        fixtures::NAMESPACE,
        fixtures::POD_NAME,
        fixtures::POD_UID,
        fixtures::SERVICE,
        &fixtures::POD_IP.to_string(),
        "node-1",
    ));
    let err = f
        .client
        .register(&InstanceRegisterInformation {
            provider: PROVIDER.into(),
            domain: fixtures::DOMAIN.into(),
            service: fixtures::SERVICE.into(),
            attestation_data: Secret::new(token.token.clone()),
            csr: build_csr(&fixtures::pod_identity_without_service_ip(), &key).unwrap(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    assert!(err.to_string().contains("kid"), "{err}");
}
