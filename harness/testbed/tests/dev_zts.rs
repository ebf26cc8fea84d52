//! The development ZTS through athenz-core's ZTS client over real TLS, with a real mutual-TLS
//! provider that records what ZTS sent it: register, refresh with the client certificate,
//! key-based refresh with an ntoken, and every rejection of docs/design.md §4.5.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{CertInfo, KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::ntoken::NTokenBuilder;
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::{
    InstanceIdentity, InstanceRef, InstanceRefreshInformation, InstanceRefreshRequest,
    InstanceRegisterInformation, PRINCIPAL_AUTH_HEADER, ZtsClient, ZtsClientConfig, ZtsError,
};
use athenz_testbed::fixtures::{self, DOMAIN, POD_UID, PROVIDER, SERVICE};
use athenz_testbed::openssl;
use athenz_testbed::provider_stub::{Decision, ProviderStub};
use athenz_testbed::zts::instances::InstanceKey;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use std::time::Duration;

const BASE: &str = "/callback";

struct Stack {
    zts: DevZts,
    provider: ProviderStub,
    client: ZtsClient,
}

async fn stack(decision: Decision) -> Stack {
    let zts = DevZts::start(DevZtsConfig {
        provider_timeout_ms: 2_000,
        ..DevZtsConfig::default()
    })
    .await
    .unwrap();
    let provider = ProviderStub::start(zts.ca(), PROVIDER, zts.root_pem(), BASE, decision)
        .await
        .unwrap();
    zts.add_provider(ProviderEntry {
        name: PROVIDER.into(),
        endpoint: provider.endpoint().into(),
        dns_suffixes: vec![fixtures::DNS_SUFFIX.into()],
        launch: vec!["media.sports.*".into()],
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
    Stack {
        zts,
        provider,
        client,
    }
}

fn allow() -> Decision {
    Decision::Allow {
        cert_expiry_minutes: None,
    }
}

fn register_info(csr: String) -> InstanceRegisterInformation {
    InstanceRegisterInformation {
        provider: PROVIDER.into(),
        domain: DOMAIN.into(),
        service: SERVICE.into(),
        attestation_data: Secret::new("the-identity-jwt"),
        csr,
        token: Some(true),
        ..Default::default()
    }
}

fn pod_csr(key: &PrivateKey) -> String {
    build_csr(&fixtures::pod_identity(), key).unwrap()
}

fn csr_with(key: &PrivateKey, edit: impl FnOnce(&mut CsrIdentity)) -> String {
    let mut identity = fixtures::pod_identity();
    edit(&mut identity);
    build_csr(&identity, key).unwrap()
}

fn rejected(err: ZtsError) -> (u16, String) {
    match err {
        ZtsError::Rejected {
            status,
            code,
            message,
        } => {
            assert_eq!(i32::from(status), code, "code must be the status");
            (status, message)
        }
        other => panic!("expected a ZTS rejection, got {other}"),
    }
}

fn instance_key(id: &str) -> InstanceKey {
    InstanceKey {
        provider: PROVIDER.into(),
        domain: DOMAIN.into(),
        service: SERVICE.into(),
        instance_id: id.into(),
    }
}

fn target() -> InstanceRef<'static> {
    InstanceRef {
        provider: PROVIDER,
        domain: DOMAIN,
        service: SERVICE,
        instance_id: POD_UID,
    }
}

/// The client identity of a pod holding `identity`'s certificate and `key`.
fn presenting(identity: &InstanceIdentity, key: &PrivateKey) -> ClientIdentity {
    let cert = identity.x509_certificate.as_deref().unwrap();
    ClientIdentity::Fixed(
        tls::certified_key_from_pem(cert, key.to_pkcs8_pem().unwrap().expose()).unwrap(),
    )
}

async fn register(s: &Stack, key: &PrivateKey) -> InstanceIdentity {
    s.client
        .register(&register_info(pod_csr(key)))
        .await
        .unwrap()
        .identity
}

fn refresh_info(csr: String) -> InstanceRefreshInformation {
    InstanceRefreshInformation {
        attestation_data: Some(Secret::new("a-fresh-jwt")),
        csr: Some(csr),
        token: Some(true),
        ..Default::default()
    }
}

#[tokio::test]
async fn register_issues_a_verified_certificate_with_the_csr_names() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let registered = s
        .client
        .register(&register_info(pod_csr(&key)))
        .await
        .unwrap();
    assert_eq!(
        registered.location.as_deref(),
        Some(format!("/zts/v1/instance/{PROVIDER}/{DOMAIN}/{SERVICE}/{POD_UID}").as_str())
    );
    let identity = registered.identity;
    assert_eq!(identity.name, "media.sports.web");
    assert_eq!(identity.instance_id, POD_UID);
    assert_eq!(identity.provider, PROVIDER);

    let cert_pem = identity.x509_certificate.as_deref().unwrap();
    let signer = identity.x509_certificate_signer.as_deref().unwrap();
    // the signer bundle is intermediate then root; openssl verifies the leaf against the root
    openssl::verify(s.zts.root_pem(), s.zts.ca().intermediates_pem(), cert_pem).unwrap();
    assert!(signer.ends_with(s.zts.root_pem()));

    let cert = CertInfo::from_pem(cert_pem).unwrap();
    let wanted = fixtures::pod_identity();
    assert_eq!(cert.common_name, wanted.common_name);
    assert_eq!(cert.organizational_units, [PROVIDER]);
    assert_eq!(cert.dns_names, wanted.dns_names);
    assert_eq!(cert.ip_addresses, wanted.ip_addresses);
    assert_eq!(cert.uris, wanted.uris);
    assert_eq!(cert.public_key_der, key.public_key_der());

    let token =
        athenz_core::ntoken::NToken::parse(identity.service_token.as_ref().unwrap().expose())
            .unwrap();
    assert_eq!(token.principal(), "media.sports.web");
    assert_eq!(token.key_service.as_deref(), Some("zts"));

    let record = s.zts.instance(&instance_key(POD_UID)).unwrap();
    assert_eq!(record.current_serial, cert.serial_hex);
}

#[tokio::test]
async fn provider_is_sent_exactly_the_confirmation_of_the_contract() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    register(&s, &key).await;
    let calls = s.provider.recorded();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.path, "/callback/instance");
    assert_eq!(call.principal.as_deref(), Some("sys.auth.zts"));
    let body: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "provider": PROVIDER,
            "domain": DOMAIN,
            "service": SERVICE,
            "attestationData": "the-identity-jwt",
            "attributes": {
                "instanceId": POD_UID,
                "clientIP": "127.0.0.1",
                "sanDNS": format!("web.media-sports.athenz.cloud,{POD_UID}.instanceid.athenz.athenz.cloud"),
                "sanIP": "10.1.2.3,fd00::10",
                "sanURI": format!("spiffe://media.sports/sa/web,athenz://instanceid/{PROVIDER}/{POD_UID}"),
            }
        })
    );
}

#[tokio::test]
async fn lifetime_honours_provider_and_request() {
    let s = stack(Decision::Allow {
        cert_expiry_minutes: Some(60),
    })
    .await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let lifetime = |identity: &InstanceIdentity| {
        let c = CertInfo::from_pem(identity.x509_certificate.as_deref().unwrap()).unwrap();
        // from the signing moment, as Athenz's signer does (no backdating)
        (c.not_after - c.not_before).whole_minutes()
    };
    let provider_limited = register(&s, &key).await;
    assert_eq!(lifetime(&provider_limited), 60);
    let mut info = register_info(pod_csr(&key));
    info.expiry_time = Some(30);
    let request_limited = s.client.register(&info).await.unwrap().identity;
    assert_eq!(lifetime(&request_limited), 30);
    // the provider's lower value wins over a longer request
    info.expiry_time = Some(600);
    let both = s.client.register(&info).await.unwrap().identity;
    assert_eq!(lifetime(&both), 60);
}

#[tokio::test]
async fn csr_rule_violations_are_400() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let spiffe = format!("spiffe://{DOMAIN}/sa/{SERVICE}");
    let cases: Vec<(String, &str)> = vec![
        (
            csr_with(&key, |id| id.common_name = "media.sports.db".into()),
            "CSR validation failed - Unable to validate CSR common name",
        ),
        (
            csr_with(&key, |id| id.dns_names.push("web.evil.example".into())),
            "CSR validation failed - web.evil.example does not end with provider/service \
             configured suffix",
        ),
        (
            csr_with(&key, |id| id.uris.push(spiffe.clone())),
            "unable to parse PKCS10 CSR: Invalid SPIFFE URI present in CSR",
        ),
        (
            csr_with(&key, |id| {
                id.uris.retain(|u| !u.starts_with("athenz://"));
                id.dns_names.retain(|d| !d.contains(".instanceid."));
            }),
            "CSR validation failed - InstanceId cannot be empty",
        ),
        ("garbage".into(), "unable to parse PKCS10 CSR"),
    ];
    for (csr, why) in cases {
        let (status, message) = rejected(s.client.register(&register_info(csr)).await.unwrap_err());
        assert_eq!(status, 400, "{message}");
        assert!(message.starts_with(why), "{why}: {message}");
    }
    assert!(
        s.provider.recorded().is_empty(),
        "the provider was asked about a bad CSR"
    );
}

/// As Athenz makes a new provider client for every request (`ZTSImpl` closes each
/// `InstanceHttpProvider` after use), every confirmation comes on its own connection.
#[tokio::test]
async fn every_confirmation_comes_on_a_new_connection() {
    let s = stack(allow()).await;
    for _ in 0..3 {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        register(&s, &key).await;
    }
    let peers: std::collections::BTreeSet<_> = s
        .provider
        .recorded()
        .iter()
        .map(|r| r.peer.unwrap())
        .collect();
    assert_eq!(peers.len(), 3, "{peers:?}");
}

#[tokio::test]
async fn unauthorised_launch_denial_and_provider_down() {
    let mut s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();

    // provider may not launch this domain
    let news = PodIdentityInput {
        domain: "news",
        ..pod_input()
    };
    let mut info = register_info(build_csr(&CsrIdentity::for_pod(&news).unwrap(), &key).unwrap());
    info.domain = "news".into();
    let (status, message) = rejected(s.client.register(&info).await.unwrap_err());
    assert_eq!(status, 403);
    assert!(
        message.contains("not authorized to launch news.web"),
        "{message}"
    );

    // provider denies: 403 carrying its message
    s.provider.set_decision(Decision::Deny {
        status: 403,
        message: "pod web-7d9f is not running".into(),
    });
    let (status, message) = rejected(
        s.client
            .register(&register_info(pod_csr(&key)))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 403);
    assert!(message.contains("pod web-7d9f is not running"), "{message}");

    // provider down: 504
    s.provider.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, message) = rejected(
        s.client
            .register(&register_info(pod_csr(&key)))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 504, "{message}");
    assert!(
        s.zts.instance(&instance_key(POD_UID)).is_none(),
        "an instance was recorded without a confirmation"
    );
}

fn pod_input() -> PodIdentityInput<'static> {
    PodIdentityInput {
        domain: DOMAIN,
        service: SERVICE,
        provider: PROVIDER,
        dns_suffix: fixtures::DNS_SUFFIX,
        instance_id: POD_UID,
        pod_ip: Some(fixtures::POD_IP),
        service_ip: None,
    }
}

#[tokio::test]
async fn provider_with_the_wrong_certificate_is_not_called() {
    let s = stack(allow()).await;
    // a provider whose server certificate CN is not its name
    let impostor = ProviderStub::start(
        s.zts.ca(),
        "k8s.admin.someone-else",
        s.zts.root_pem(),
        BASE,
        allow(),
    )
    .await
    .unwrap();
    s.zts
        .add_provider(ProviderEntry {
            name: PROVIDER.into(),
            endpoint: impostor.endpoint().into(),
            dns_suffixes: vec![fixtures::DNS_SUFFIX.into()],
            launch: vec!["*".into()],
        })
        .unwrap();
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let (status, message) = rejected(
        s.client
            .register(&register_info(pod_csr(&key)))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 504, "{message}");
    assert!(message.contains("not the expected"), "{message}");
    assert!(
        impostor.recorded().is_empty(),
        "the attestation data reached the impostor"
    );
}

#[path = "dev_zts/refresh.rs"]
mod refresh;
#[path = "dev_zts/server.rs"]
mod server;

/// A rotation of ZTS's CA as an operator does it (docs/design.md §6): the next root added to the
/// clients' bundle, ZTS moved to it (its certificate and its signer), the old root removed. A
/// client whose bundle follows its file (`ServerCaBundle::from_file`) keeps refreshing through
/// all of it with no restart; one that read the old bundle once can no longer reach ZTS.
#[tokio::test]
async fn a_ca_rotation_reaches_a_client_that_follows_its_bundle_file() {
    let zts = DevZts::start(DevZtsConfig {
        provider_timeout_ms: 2_000,
        ..DevZtsConfig::default()
    })
    .await
    .unwrap();
    let next_root = std::fs::read_to_string(zts.ca_path().with_file_name("next-ca.pem")).unwrap();
    // the provider, as the callback with the install's bundle: both roots while ZTS moves
    let provider = ProviderStub::start(
        zts.ca(),
        PROVIDER,
        &format!("{}{next_root}", zts.root_pem()),
        BASE,
        allow(),
    )
    .await
    .unwrap();
    zts.add_provider(ProviderEntry {
        name: PROVIDER.into(),
        endpoint: provider.endpoint().into(),
        dns_suffixes: vec![fixtures::DNS_SUFFIX.into()],
        launch: vec!["media.sports.*".into()],
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bundle_file = dir.path().join("zts-ca.pem");
    // rewritten as the agent publishes it: a new file renamed over the old
    let publish = |pem: &str| {
        let tmp = dir.path().join("zts-ca.pem.tmp");
        std::fs::write(&tmp, pem).unwrap();
        std::fs::rename(&tmp, &bundle_file).unwrap();
    };
    publish(zts.root_pem());
    let client_with = |ca| {
        ZtsClient::new(ZtsClientConfig {
            url: zts.url().into(),
            ca,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        })
        .unwrap()
    };
    let following = client_with(tls::ServerCaBundle::from_file(&bundle_file).unwrap());
    let read_once =
        client_with(tls::ServerCaBundle::fixed(pem_certificates(zts.root_pem()).unwrap()).unwrap());
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let mut identity = following
        .register(&register_info(pod_csr(&key)))
        .await
        .unwrap()
        .identity;
    let mut key = key;
    // (the bundle's file is looked at no more than every 2 s)
    let past_the_check = || tokio::time::sleep(Duration::from_millis(2_100));

    // 1. both roots; 2. ZTS moved; 3. the old root removed
    publish(&format!("{}{next_root}", zts.root_pem()));
    past_the_check().await;
    assert!(zts.rotate_ca().unwrap(), "moved now");
    assert!(!zts.rotate_ca().unwrap(), "and only once");
    for (step, bundle) in [
        ("both roots", None),
        ("the next root alone", Some(&next_root)),
    ] {
        if let Some(bundle) = bundle {
            publish(bundle);
            past_the_check().await;
        }
        let next_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        identity = following
            .refresh_instance(
                &target(),
                &refresh_info(pod_csr(&next_key)),
                presenting(&identity, &key),
            )
            .await
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        key = next_key;
        // issued under the next CA, with its bundle
        let cert = identity.x509_certificate.as_deref().unwrap();
        let signer = identity.x509_certificate_signer.as_deref().unwrap();
        assert!(signer.ends_with(&next_root), "{step}: {signer}");
        let intermediate = signer.strip_suffix(next_root.as_str()).unwrap();
        openssl::verify(&next_root, intermediate, cert).unwrap();
        assert!(
            openssl::verify(zts.root_pem(), intermediate, cert).is_err(),
            "{step}: the old root verifies the new certificate"
        );
    }
    // the client that read the old root once no longer reaches ZTS
    let refused = read_once
        .register(&register_info(pod_csr(&key)))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ZtsError::Unreachable(ref e) if e.contains("certificate")),
        "{refused}"
    );
}
