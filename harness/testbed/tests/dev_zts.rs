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
        ca_certs: pem_certificates(zts.root_pem()).unwrap(),
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

#[tokio::test]
async fn refresh_with_the_client_certificate() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let first = register(&s, &key).await;
    let next_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let refreshed = s
        .client
        .refresh_instance(
            &target(),
            &refresh_info(pod_csr(&next_key)),
            presenting(&first, &key),
        )
        .await
        .unwrap();
    let old = CertInfo::from_pem(first.x509_certificate.as_deref().unwrap()).unwrap();
    let new = CertInfo::from_pem(refreshed.x509_certificate.as_deref().unwrap()).unwrap();
    assert_eq!(new.public_key_der, next_key.public_key_der());
    assert_ne!(new.serial_hex, old.serial_hex);
    assert!(refreshed.service_token.is_some());
    let record = s.zts.instance(&instance_key(POD_UID)).unwrap();
    assert_eq!(record.current_serial, new.serial_hex);
    assert_eq!(
        record.previous_serial.as_deref(),
        Some(old.serial_hex.as_str())
    );

    let calls = s.provider.recorded();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].path, "/callback/refresh");
    let confirmation = calls[1].confirmation().unwrap();
    assert_eq!(confirmation.attestation_data.expose(), "a-fresh-jwt");
    assert_eq!(confirmation.attributes["instanceId"], POD_UID);
}

#[tokio::test]
async fn refresh_principal_and_instance_mismatches_are_refused() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let first = register(&s, &key).await;

    // another principal's certificate
    let stranger = s
        .zts
        .ca()
        .issue(
            &athenz_testbed::pki::LeafSpec::service("media.sports.db", &[]),
            KeyAlgorithm::P256,
        )
        .unwrap();
    let stranger_id = ClientIdentity::Fixed(
        tls::certified_key_from_pem(&stranger.chain_pem, stranger.key_pem.expose()).unwrap(),
    );
    let (status, message) = rejected(
        s.client
            .refresh_instance(&target(), &refresh_info(pod_csr(&key)), stranger_id)
            .await
            .unwrap_err(),
    );
    // ZTSImpl.postInstanceRefreshInformation: requestError, the path's principal first
    assert_eq!(
        (status, message.as_str()),
        (
            400,
            "Principal mismatch: media.sports.web vs. media.sports.db"
        )
    );

    // CSR for another instance id than the path
    let other_csr = csr_with(&key, |id| {
        *id = CsrIdentity::for_pod(&PodIdentityInput {
            instance_id: "11111111-2222-4333-8444-555555555555",
            ..pod_input()
        })
        .unwrap();
    });
    let (status, message) = rejected(
        s.client
            .refresh_instance(
                &target(),
                &refresh_info(other_csr),
                presenting(&first, &key),
            )
            .await
            .unwrap_err(),
    );
    // X509CertRequest.validateInstanceId, reported by processProviderX509RefreshRequest
    assert_eq!(
        (status, message.as_str()),
        (400, "CSR validation failed - instance id mismatch")
    );

    // the right CSR and path, but the certificate of another instance
    let other_uid = "11111111-2222-4333-8444-555555555555";
    let other_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let other_identity = CsrIdentity::for_pod(&PodIdentityInput {
        instance_id: other_uid,
        ..pod_input()
    })
    .unwrap();
    let mut info = register_info(build_csr(&other_identity, &other_key).unwrap());
    info.token = None;
    let other = s.client.register(&info).await.unwrap().identity;
    let (status, message) = rejected(
        s.client
            .refresh_instance(
                &target(),
                &refresh_info(pod_csr(&key)),
                presenting(&other, &other_key),
            )
            .await
            .unwrap_err(),
    );
    // X509CertRequest.validateInstanceId, reported by processProviderX509RefreshRequest
    assert_eq!(
        (status, message.as_str()),
        (400, "CSR validation failed - instance id mismatch")
    );
}

#[tokio::test]
async fn a_stale_serial_revokes_the_instance() {
    let s = stack(allow()).await;
    let k1 = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let c1 = register(&s, &k1).await;
    let k2 = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let c2 = s
        .client
        .refresh_instance(&target(), &refresh_info(pod_csr(&k2)), presenting(&c1, &k1))
        .await
        .unwrap();
    let k3 = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let c3 = s
        .client
        .refresh_instance(&target(), &refresh_info(pod_csr(&k3)), presenting(&c2, &k2))
        .await
        .unwrap();
    // c1 is two generations old: a copy of it is being used
    let (status, message) = rejected(
        s.client
            .refresh_instance(&target(), &refresh_info(pod_csr(&k1)), presenting(&c1, &k1))
            .await
            .unwrap_err(),
    );
    assert_eq!((status, message.as_str()), (403, "Certificate revoked"));
    // and now even the newest certificate is refused
    let (status, message) = rejected(
        s.client
            .refresh_instance(&target(), &refresh_info(pod_csr(&k3)), presenting(&c3, &k3))
            .await
            .unwrap_err(),
    );
    assert_eq!((status, message.as_str()), (403, "Certificate revoked"));
    assert!(s.zts.instance(&instance_key(POD_UID)).unwrap().revoked);
}

const CONTROL_SERVICE: &str = "k8s.admin.athenz-jwt-service";

fn service_csr(key: &PrivateKey) -> String {
    build_csr(
        &CsrIdentity::for_service("k8s.admin", "athenz-jwt-service", fixtures::DNS_SUFFIX).unwrap(),
        key,
    )
    .unwrap()
}

fn ntoken(
    key: &PrivateKey,
    version: &str,
    issued: time::OffsetDateTime,
    life: time::Duration,
) -> Secret {
    NTokenBuilder {
        domain: "k8s.admin".into(),
        service: "athenz-jwt-service".into(),
        host: None,
        key_version: version.into(),
        key_service: None,
        lifetime: life,
    }
    .sign(key, issued)
    .unwrap()
}

#[tokio::test]
async fn key_based_refresh_with_an_ntoken() {
    let s = stack(allow()).await;
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PrivateKey::generate(alg).unwrap();
        s.zts
            .add_service_key(CONTROL_SERVICE, "v1", &key.key_pair().public_key_pem())
            .unwrap();
        let request = InstanceRefreshRequest {
            csr: service_csr(&key),
            expiry_time: Some(120),
            key_id: Some("v1".into()),
        };
        let now = time::OffsetDateTime::now_utc();
        let identity = s
            .client
            .refresh_with_ntoken(
                "k8s.admin",
                "athenz-jwt-service",
                &request,
                &ntoken(&key, "v1", now, time::Duration::hours(1)),
                PRINCIPAL_AUTH_HEADER,
            )
            .await
            .unwrap();
        assert_eq!(identity.name, CONTROL_SERVICE);
        openssl::verify(
            s.zts.root_pem(),
            s.zts.ca().intermediates_pem(),
            &identity.certificate,
        )
        .unwrap();
        let cert = CertInfo::from_pem(&identity.certificate).unwrap();
        assert_eq!(
            cert.dns_names,
            ["athenz-jwt-service.k8s-admin.athenz.cloud"]
        );
        assert_eq!((cert.not_after - cert.not_before).whole_minutes(), 120);
        assert_eq!(identity.ca_cert_bundle.as_deref(), Some(s.zts.ca_bundle()));
    }
}

#[tokio::test]
async fn key_based_refresh_rejections() {
    let s = stack(allow()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    s.zts
        .add_service_key(CONTROL_SERVICE, "v1", &key.key_pair().public_key_pem())
        .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let good_request = InstanceRefreshRequest {
        csr: service_csr(&key),
        expiry_time: None,
        key_id: Some("v1".into()),
    };
    let call = |request: InstanceRefreshRequest, token: Secret| {
        let client = s.client.clone();
        async move {
            client
                .refresh_with_ntoken(
                    "k8s.admin",
                    "athenz-jwt-service",
                    &request,
                    &token,
                    PRINCIPAL_AUTH_HEADER,
                )
                .await
        }
    };
    let hour = time::Duration::hours(1);

    // unknown key version
    let (status, message) = rejected(
        call(good_request.clone(), ntoken(&key, "v9", now, hour))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("no public key v9"), "{message}");

    // expired token
    let (status, message) = rejected(
        call(
            good_request.clone(),
            ntoken(&key, "v1", now - time::Duration::hours(3), hour),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("expired"), "{message}");

    // tampered token: expiry extended by a second after signing
    let token = ntoken(&key, "v1", now, hour);
    let expires = athenz_core::ntoken::NToken::parse(token.expose())
        .unwrap()
        .expires;
    let tampered = token
        .expose()
        .replace(&format!(";e={expires}"), &format!(";e={}", expires + 1));
    let (status, message) = rejected(
        call(good_request.clone(), Secret::new(tampered))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("signature"), "{message}");

    // a token signed by another key under the registered version
    let other = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let (status, message) = rejected(
        call(good_request.clone(), ntoken(&other, "v1", now, hour))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    assert!(message.contains("signature"), "{message}");

    // the CSR's key is not the registered one
    let (status, message) = rejected(
        call(
            InstanceRefreshRequest {
                csr: service_csr(&other),
                ..good_request.clone()
            },
            ntoken(&key, "v1", now, hour),
        )
        .await
        .unwrap_err(),
    );
    // ZTSImpl.postInstanceRefreshRequest
    assert_eq!(
        (status, message.as_str()),
        (400, "Invalid CSR - public key mismatch")
    );

    // no token at all
    let err = s
        .client
        .refresh_with_ntoken(
            "k8s.admin",
            "athenz-jwt-service",
            &good_request,
            &ntoken(&key, "v1", now, hour),
            "X-Not-The-Header",
        )
        .await
        .unwrap_err();
    assert_eq!(rejected(err).0, 401);
}

/// A plain HTTPS client (no client certificate) trusting only `ca_pem`.
fn https_client(ca_pem: &[u8]) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca_pem).unwrap();
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .build()
        .unwrap()
}

#[tokio::test]
async fn status_and_unknown_routes() {
    let s = stack(allow()).await;
    let http = https_client(s.zts.root_pem().as_bytes());
    // an authenticated resource, as in Athenz's ZTS: no credentials, no status
    let status = http
        .get(format!("{}/status", s.zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 401);
    let missing = http
        .get(format!("{}/nope", s.zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["code"], 404);
    assert!(body["message"].is_string());
    let wrong_method = http
        .get(format!("{}/instance", s.zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    // a malformed body is a 400 in the same shape
    let malformed = http
        .post(format!("{}/instance", s.zts.url()))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let body: serde_json::Value = malformed.json().await.unwrap();
    assert_eq!(body["code"], 400);
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let s = stack(allow()).await;
    let http = https_client(s.zts.root_pem().as_bytes());
    let resp = http
        .post(format!("{}/instance", s.zts.url()))
        .body(vec![b'{'; 70 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert!(s.provider.recorded().is_empty());
}

#[tokio::test]
async fn standalone_server_writes_its_address_and_stops() {
    use athenz_testbed::zts::{StandaloneInfo, run_standalone};
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("zts-config.json");
    std::fs::write(
        &config_path,
        r#"{"maxCertLifetimeMinutes": 60, "serviceDnsSuffixes": ["example.test"]}"#,
    )
    .unwrap();
    let config = DevZtsConfig::from_file(&config_path).unwrap();
    assert_eq!(config.max_cert_lifetime_minutes, 60);
    let state = dir.path().join("state");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let state = state.clone();
        async move {
            run_standalone(config, &state, None, async {
                let _ = rx.await;
            })
            .await
        }
    });
    // bounded wait for zts.json
    let info_path = state.join("zts.json");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !info_path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "zts.json never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info: StandaloneInfo = serde_json::from_slice(&std::fs::read(&info_path).unwrap()).unwrap();
    assert!(info.url.ends_with("/zts/v1"), "{}", info.url);
    let http = https_client(&std::fs::read(&info.ca).unwrap());
    // it serves: its keys to anyone (its status only to an authenticated caller)
    let keys = http
        .get(format!("{}/oauth2/keys?rfc=true", info.url))
        .send()
        .await
        .unwrap();
    assert_eq!(keys.status(), 200);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        http.get(format!("{}/status", info.url))
            .send()
            .await
            .is_err()
    );
}

#[test]
fn config_files_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, r#"{"maxCertLifetime": 60}"#).unwrap();
    let err = DevZtsConfig::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("bad.json") && err.contains("unknown field"),
        "{err}"
    );
    std::fs::write(&path, "{").unwrap();
    assert!(DevZtsConfig::from_file(&path).is_err());
    assert!(DevZtsConfig::from_file(&dir.path().join("missing.json")).is_err());
}

#[tokio::test]
async fn invalid_registry_entries_stop_the_start() {
    let config = DevZtsConfig {
        providers: vec![ProviderEntry {
            name: "nodot".into(),
            endpoint: "https://127.0.0.1:1".into(),
            dns_suffixes: vec!["athenz.cloud".into()],
            launch: vec![],
        }],
        ..DevZtsConfig::default()
    };
    let err = DevZts::start(config).await.err().unwrap().to_string();
    assert!(err.contains("provider"), "{err}");
}
