//! The dev ZTS held to `tests/data/zts-contract.tsv`: for every row, the request the row describes
//! is sent over real mutual TLS and the answer must have Athenz's status and start with Athenz's
//! message. The table cites the Athenz source that decides each row; a row without a request
//! here, or a request here without a row, fails the test, so the two cannot drift apart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::ntoken::NTokenBuilder;
use athenz_testbed::athenz_clients::{AthenzClient, Harness};
use athenz_testbed::fixtures::{DNS_SUFFIX, DOMAIN, PROVIDER, SERVICE};
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::provider_stub::{Decision, ProviderStub};
use athenz_testbed::zts::authz::RoleEntry;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use rcgen::SanType;
use serde_json::{Value, json};
use std::collections::BTreeSet;

#[path = "zts_contract/authz_rows.rs"]
mod authz_rows;
#[path = "zts_contract/delivery.rs"]
mod delivery;

use delivery::{Identity, ZtsCall, client, deliver};

const TABLE: &str = include_str!("../data/zts-contract.tsv");
const BASE: &str = "/callback";
/// A provider whose endpoint presents a certificate of another service.
const WRONG_CN_PROVIDER: &str = "k8s.admin.wrong-cn";
/// A provider whose certificate names no host at all (only its CN).
const NO_HOST_PROVIDER: &str = "k8s.admin.no-host";
/// A provider whose port refuses connections.
const DOWN_PROVIDER: &str = "k8s.admin.down";
const KEY_SERVICE: (&str, &str) = ("k8s.admin", "athenz-jwt-service");
const PROXY: &str = "media.sports.proxy";

/// One row of the table.
#[derive(Debug)]
struct Row {
    case: String,
    status: u16,
    message_prefix: Option<String>,
    source: String,
    /// Which of Athenz's clients send this row (`java`, `go`).
    athenz_clients: Vec<String>,
}

fn rows() -> Vec<Row> {
    let mut lines = TABLE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let header = lines.next().unwrap();
    assert_eq!(
        header,
        "case\troute\trequest\tstatus\tmessage_prefix\tathenz_source\tathenz_client"
    );
    lines
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 7, "seven columns: {line}");
            Row {
                case: cols[0].to_owned(),
                status: cols[3].parse().unwrap(),
                message_prefix: (cols[4] != "-").then(|| cols[4].to_owned()),
                source: cols[5].to_owned(),
                athenz_clients: cols[6]
                    .split(' ')
                    .filter(|c| *c != "-")
                    .map(str::to_owned)
                    .collect(),
            }
        })
        .collect()
}

struct Bed {
    /// When set, each row's request goes through this Athenz client instead of reqwest.
    athenz: Option<tokio::sync::Mutex<AthenzClient>>,
    zts: DevZts,
    stub: ProviderStub,
    _others: Vec<ProviderStub>,
    service_key: PrivateKey,
}

async fn bed() -> Bed {
    bed_via(None).await
}

/// The bed, its rows sent through Athenz's own `harness` when given.
async fn bed_via(harness: Option<Harness>) -> Bed {
    let role = |r: &str, m: &[&str]| RoleEntry {
        domain: DOMAIN.into(),
        role: r.into(),
        members: m.iter().map(|s| (*s).to_owned()).collect(),
    };
    let zts = DevZts::start(DevZtsConfig {
        provider_timeout_ms: 2_000,
        roles: vec![
            role("readers", &["media.sports.web", PROXY, "finance.*"]),
            role("writers", &["media.sports.api"]),
        ],
        authorized_proxy_users: vec![PROXY.into()],
        ..DevZtsConfig::default()
    })
    .await
    .unwrap();
    let allow = Decision::Allow {
        cert_expiry_minutes: None,
    };
    let stub = ProviderStub::start(zts.ca(), PROVIDER, zts.root_pem(), BASE, allow.clone())
        .await
        .unwrap();
    let wrong_cn = ProviderStub::start(zts.ca(), PROVIDER, zts.root_pem(), BASE, allow.clone())
        .await
        .unwrap();
    let no_host = ProviderStub::start_with_leaf(
        zts.ca(),
        &LeafSpec::service(NO_HOST_PROVIDER, &[]),
        zts.root_pem(),
        BASE,
        allow,
    )
    .await
    .unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for (name, endpoint) in [
        (PROVIDER, stub.endpoint().to_owned()),
        (WRONG_CN_PROVIDER, wrong_cn.endpoint().to_owned()),
        (NO_HOST_PROVIDER, no_host.endpoint().to_owned()),
        (DOWN_PROVIDER, format!("https://127.0.0.1:{closed}{BASE}")),
    ] {
        zts.add_provider(ProviderEntry {
            name: name.into(),
            endpoint,
            dns_suffixes: vec![DNS_SUFFIX.into()],
            launch: vec!["media.sports.*".into()],
        })
        .unwrap();
    }
    let service_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    zts.add_service_key(
        &format!("{}.{}", KEY_SERVICE.0, KEY_SERVICE.1),
        "v1",
        &service_key.key_pair().public_key_pem(),
    )
    .unwrap();
    Bed {
        athenz: harness.map(|h| tokio::sync::Mutex::new(AthenzClient::start(h).unwrap())),
        zts,
        stub,
        _others: vec![wrong_cn, no_host],
        service_key,
    }
}

/// A service certificate of `principal` from the ZTS CA: its chain and key PEM, and its key.
fn service_identity(bed: &Bed, principal: &str) -> (Identity, PrivateKey) {
    let issued = bed
        .zts
        .ca()
        .issue(&LeafSpec::service(principal, &[]), KeyAlgorithm::P256)
        .unwrap();
    let key = PrivateKey::from_pem(issued.key_pem.expose()).unwrap();
    ((issued.chain_pem, issued.key_pem.expose().to_owned()), key)
}

fn pod_input(uid: &str) -> PodIdentityInput<'_> {
    PodIdentityInput {
        domain: DOMAIN,
        service: SERVICE,
        provider: PROVIDER,
        dns_suffix: DNS_SUFFIX,
        instance_id: uid,
        pod_ip: Some(athenz_testbed::fixtures::POD_IP),
        service_ip: None,
    }
}

/// A pod CSR for instance `uid`, edited.
fn pod_csr(key: &PrivateKey, uid: &str, edit: impl FnOnce(&mut CsrIdentity)) -> String {
    let mut identity = CsrIdentity::for_pod(&pod_input(uid)).unwrap();
    edit(&mut identity);
    build_csr(&identity, key).unwrap()
}

/// A CSR with exactly `cn` (none when empty) and `sans`, as any client may make one.
fn raw_csr(key: &PrivateKey, cn: &str, sans: Vec<SanType>) -> String {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if !cn.is_empty() {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
    }
    params.subject_alt_names = sans;
    params
        .serialize_request(key.key_pair())
        .unwrap()
        .pem()
        .unwrap()
}

fn uri(u: &str) -> SanType {
    SanType::URI(u.try_into().unwrap())
}

fn fresh_uid() -> String {
    let hex = athenz_core::random::hex_name::<16>();
    format!(
        "{}-{}-4{}-8{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

fn register_body(provider: &str, domain: &str, csr: &str, attestation: Option<&str>) -> Value {
    let mut body = json!({"provider": provider, "domain": domain, "service": SERVICE, "csr": csr});
    if let Some(a) = attestation {
        body["attestationData"] = a.into();
    }
    body
}

async fn register(bed: &Bed, body: Value) -> (u16, String) {
    deliver(bed, ZtsCall::Register(body)).await
}

/// A registered instance: its uid, certificate chain and key.
async fn registered(bed: &Bed) -> (String, String, PrivateKey) {
    let uid = fresh_uid();
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let body = register_body(PROVIDER, DOMAIN, &pod_csr(&key, &uid, |_| {}), Some("jwt"));
    let response = client(bed, None)
        .post(format!("{}/instance", bed.zts.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let identity: Value = response.json().await.unwrap();
    let cert = identity["x509Certificate"].as_str().unwrap().to_owned();
    (uid, cert, key)
}

async fn refresh(
    bed: &Bed,
    presenting: Option<(&str, &PrivateKey)>,
    path_uid: &str,
    body: Value,
) -> (u16, String) {
    let identity = presenting.map(|(cert, key)| {
        (
            cert.to_owned(),
            key.to_pkcs8_pem().unwrap().expose().to_owned(),
        )
    });
    deliver(
        bed,
        ZtsCall::Refresh {
            identity,
            domain: DOMAIN.into(),
            uid: path_uid.into(),
            body,
        },
    )
    .await
}

/// `call` answered while the provider decides as `decision`; the provider allows again after.
async fn with_decision(
    bed: &Bed,
    decision: Decision,
    call: impl std::future::Future<Output = (u16, String)>,
) -> (u16, String) {
    bed.stub.set_decision(decision);
    let answer = call.await;
    bed.stub.set_decision(Decision::Allow {
        cert_expiry_minutes: None,
    });
    answer
}

fn deny(status: u16) -> Decision {
    Decision::Deny {
        status,
        message: format!("the provider says {status}"),
    }
}

async fn key_refresh(bed: &Bed, token_service: &str, csr: String) -> (u16, String) {
    let token = NTokenBuilder {
        domain: KEY_SERVICE.0.into(),
        service: token_service.into(),
        host: None,
        key_version: "v1".into(),
        key_service: None,
        lifetime: time::Duration::hours(1),
    }
    .sign(&bed.service_key, time::OffsetDateTime::now_utc())
    .unwrap();
    if token_service != KEY_SERVICE.1 {
        // the token must verify for the path's mismatch to be the answer: register its key too
        bed.zts
            .add_service_key(
                &format!("{}.{token_service}", KEY_SERVICE.0),
                "v1",
                &bed.service_key.key_pair().public_key_pem(),
            )
            .unwrap();
    }
    deliver(
        bed,
        ZtsCall::KeyRefresh {
            ntoken: token.expose().to_owned(),
            body: json!({"csr": csr, "keyId": "v1"}),
        },
    )
    .await
}

fn service_csr(key: &PrivateKey, edit: impl FnOnce(&mut CsrIdentity)) -> String {
    let mut identity = CsrIdentity::for_service(KEY_SERVICE.0, KEY_SERVICE.1, DNS_SUFFIX).unwrap();
    edit(&mut identity);
    build_csr(&identity, key).unwrap()
}

/// Sends the request row `case` describes.
async fn run(bed: &Bed, case: &str) -> (u16, String) {
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let uid = fresh_uid();
    let ok_csr = pod_csr(&key, &uid, |_| {});
    let jwt = Some("jwt");
    match case {
        "register_ok" => register(bed, register_body(PROVIDER, DOMAIN, &ok_csr, jwt)).await,
        "register_unknown_provider" => {
            register(
                bed,
                register_body("k8s.admin.unknown", DOMAIN, &ok_csr, jwt),
            )
            .await
        }
        "register_launch_not_granted" => {
            register(bed, register_body(PROVIDER, "news", &ok_csr, jwt)).await
        }
        "register_no_csr" => register(bed, register_body(PROVIDER, DOMAIN, "", jwt)).await,
        "register_no_attestation" => {
            register(bed, register_body(PROVIDER, DOMAIN, &ok_csr, None)).await
        }
        "register_unparsable_csr" => {
            register(bed, register_body(PROVIDER, DOMAIN, "not a csr", jwt)).await
        }
        "register_two_spiffe_uris" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.push(format!("spiffe://{DOMAIN}/sa/{SERVICE}"));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_cn_mismatch" => {
            let csr = pod_csr(&key, &uid, |id| id.common_name = "media.sports.db".into());
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_no_cn_with_spiffe" => {
            let csr = raw_csr(
                &key,
                "",
                vec![
                    uri(&format!("spiffe://{DOMAIN}/sa/{SERVICE}")),
                    uri(&format!("athenz://instanceid/{PROVIDER}/{uid}")),
                ],
            );
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_dns_outside_suffix" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.dns_names.push("web.evil.example".into())
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_no_instance_id" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.retain(|u| !u.starts_with("athenz://"));
                id.dns_names.retain(|d| !d.contains(".instanceid."));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_spiffe_of_another" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.retain(|u| !u.starts_with("spiffe://"));
                id.uris.push(format!("spiffe://{DOMAIN}/sa/db"));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_uri_wins_over_dns" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.dns_names.retain(|d| !d.contains(".instanceid."));
                id.dns_names
                    .push(format!("{}.instanceid.athenz.{DNS_SUFFIX}", fresh_uid()));
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_instance_uri_other_provider" => {
            let csr = raw_csr(
                &key,
                "media.sports.web",
                vec![uri(&format!("athenz://instanceid/other.provider/{uid}"))],
            );
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_unknown_uri_scheme" => {
            let csr = pod_csr(&key, &uid, |id| {
                id.uris.push("https://example.test/x".into())
            });
            register(bed, register_body(PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_provider_403"
        | "register_provider_400"
        | "register_provider_500"
        | "register_provider_503"
        | "register_provider_504" => {
            let status: u16 = case.rsplit('_').next().unwrap().parse().unwrap();
            let body = register_body(PROVIDER, DOMAIN, &ok_csr, jwt);
            with_decision(bed, deny(status), register(bed, body)).await
        }
        "register_provider_unreachable" => {
            register(bed, register_body(DOWN_PROVIDER, DOMAIN, &ok_csr, jwt)).await
        }
        "register_provider_wrong_cn" => {
            register(bed, register_body(WRONG_CN_PROVIDER, DOMAIN, &ok_csr, jwt)).await
        }
        "register_provider_cert_without_host_name" => {
            let csr = raw_csr(
                &key,
                "media.sports.web",
                vec![uri(&format!(
                    "athenz://instanceid/{NO_HOST_PROVIDER}/{uid}"
                ))],
            );
            register(bed, register_body(NO_HOST_PROVIDER, DOMAIN, &csr, jwt)).await
        }
        "register_provider_unreadable_200" => {
            let raw = Decision::Raw {
                status: 200,
                body: "<html>ok</html>".into(),
            };
            let body = register_body(PROVIDER, DOMAIN, &ok_csr, jwt);
            with_decision(bed, raw, register(bed, body)).await
        }
        case if case.starts_with("refresh_") => run_refresh(bed, case).await,
        case if case.starts_with("key_refresh_") => run_key_refresh(bed, case).await,
        case if case.starts_with("access_token_")
            || case.starts_with("role_token_")
            || case.starts_with("jwks_") =>
        {
            authz_rows::run_token(bed, case).await
        }
        case if case.starts_with("role_cert_") => authz_rows::run_role_cert(bed, case).await,
        other => panic!("the table has a case with no request here: {other}"),
    }
}

async fn run_refresh(bed: &Bed, case: &str) -> (u16, String) {
    let (uid, cert, key) = registered(bed).await;
    let new_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let csr = pod_csr(&new_key, &uid, |_| {});
    let body = json!({"csr": csr, "attestationData": "jwt"});
    let me = Some((cert.as_str(), &key));
    match case {
        "refresh_ok" => refresh(bed, me, &uid, body).await,
        "refresh_no_client_certificate" => refresh(bed, None, &uid, body).await,
        "refresh_no_csr" => refresh(bed, me, &uid, json!({"attestationData": "jwt"})).await,
        "refresh_principal_mismatch" => {
            let db = bed
                .zts
                .ca()
                .issue(
                    &LeafSpec::service("media.sports.db", &[]),
                    KeyAlgorithm::P256,
                )
                .unwrap();
            let db_key = PrivateKey::from_pem(db.key_pem.expose()).unwrap();
            refresh(bed, Some((&db.chain_pem, &db_key)), &uid, body).await
        }
        "refresh_launch_not_granted" => {
            let news = bed
                .zts
                .ca()
                .issue(&LeafSpec::service("news.web", &[]), KeyAlgorithm::P256)
                .unwrap();
            let news_key = PrivateKey::from_pem(news.key_pem.expose()).unwrap();
            let csr = build_csr(
                &CsrIdentity::for_pod(&PodIdentityInput {
                    domain: "news",
                    ..pod_input(&uid)
                })
                .unwrap(),
                &news_key,
            )
            .unwrap();
            let call = ZtsCall::Refresh {
                identity: Some((news.chain_pem.clone(), news.key_pem.expose().to_owned())),
                domain: "news".into(),
                uid: uid.clone(),
                body: json!({"csr": csr, "attestationData": "jwt"}),
            };
            deliver(bed, call).await
        }
        "refresh_csr_invalid" => {
            let csr = pod_csr(&new_key, &uid, |id| {
                id.dns_names.push("web.evil.example".into())
            });
            refresh(bed, me, &uid, json!({"csr": csr, "attestationData": "jwt"})).await
        }
        "refresh_csr_other_instance" => {
            let csr = pod_csr(&new_key, &fresh_uid(), |_| {});
            refresh(bed, me, &uid, json!({"csr": csr, "attestationData": "jwt"})).await
        }
        "refresh_cert_other_instance" => {
            let (_, other_cert, other_key) = registered(bed).await;
            refresh(bed, Some((&other_cert, &other_key)), &uid, body).await
        }
        "refresh_provider_403" | "refresh_provider_504" => {
            let status: u16 = case.rsplit('_').next().unwrap().parse().unwrap();
            with_decision(bed, deny(status), refresh(bed, me, &uid, body)).await
        }
        "refresh_without_attestation" => {
            let answer = refresh(bed, me, &uid, json!({"csr": csr})).await;
            let sent = bed.stub.recorded().last().unwrap().confirmation().unwrap();
            assert!(
                sent.attestation_data.is_empty(),
                "ZTS forwards the absent attestation as absent"
            );
            answer
        }
        "refresh_no_record" => {
            // a certificate from the ZTS CA naming the instance, which ZTS never issued
            let unrecorded_uid = fresh_uid();
            let identity = CsrIdentity::for_pod(&pod_input(&unrecorded_uid)).unwrap();
            let issued = bed
                .zts
                .ca()
                .issue(
                    &LeafSpec {
                        dns_names: identity.dns_names.clone(),
                        uris: identity.uris.clone(),
                        ..LeafSpec::service("media.sports.web", &[])
                    },
                    KeyAlgorithm::P256,
                )
                .unwrap();
            let issued_key = PrivateKey::from_pem(issued.key_pem.expose()).unwrap();
            let csr = pod_csr(&new_key, &unrecorded_uid, |_| {});
            refresh(
                bed,
                Some((&issued.chain_pem, &issued_key)),
                &unrecorded_uid,
                json!({"csr": csr, "attestationData": "jwt"}),
            )
            .await
        }
        "refresh_stale_certificate" => {
            // two refreshes: the first certificate is then neither current nor previous
            let mut held = (
                cert.clone(),
                PrivateKey::from_pem(key.to_pkcs8_pem().unwrap().expose()).unwrap(),
            );
            for _ in 0..2 {
                let next_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
                let csr = pod_csr(&next_key, &uid, |_| {});
                let pem = held.1.to_pkcs8_pem().unwrap();
                let response = client(bed, Some((&held.0, pem.expose())))
                    .post(format!(
                        "{}/instance/{PROVIDER}/{DOMAIN}/{SERVICE}/{uid}",
                        bed.zts.url()
                    ))
                    .json(&json!({"csr": csr, "attestationData": "jwt"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status().as_u16(), 200);
                let identity: Value = response.json().await.unwrap();
                held = (
                    identity["x509Certificate"].as_str().unwrap().to_owned(),
                    next_key,
                );
            }
            refresh(bed, me, &uid, body).await
        }
        other => panic!("the table has a case with no request here: {other}"),
    }
}

async fn run_key_refresh(bed: &Bed, case: &str) -> (u16, String) {
    let key = &bed.service_key;
    match case {
        "key_refresh_ok" => key_refresh(bed, KEY_SERVICE.1, service_csr(key, |_| {})).await,
        "key_refresh_principal_mismatch" => {
            key_refresh(bed, "athenz-callback", service_csr(key, |_| {})).await
        }
        "key_refresh_unparsable_csr" => key_refresh(bed, KEY_SERVICE.1, "garbage".into()).await,
        "key_refresh_data_mismatch" => {
            let csr = service_csr(key, |id| id.common_name = "k8s.admin.other".into());
            key_refresh(bed, KEY_SERVICE.1, csr).await
        }
        "key_refresh_dns_not_service_form" => {
            let csr = service_csr(key, |id| {
                id.dns_names
                    .push(format!("{}.athenz-system.{DNS_SUFFIX}", KEY_SERVICE.1));
            });
            key_refresh(bed, KEY_SERVICE.1, csr).await
        }
        "key_refresh_public_key_mismatch" => {
            let other = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
            key_refresh(bed, KEY_SERVICE.1, service_csr(&other, |_| {})).await
        }
        "key_refresh_ip_mismatch" => {
            let csr = service_csr(key, |id| id.ip_addresses.push([10, 9, 9, 9].into()));
            key_refresh(bed, KEY_SERVICE.1, csr).await
        }
        other => panic!("the table has a case with no request here: {other}"),
    }
}

/// Every case of the table: the cases here are exactly the table's, each cites its Athenz
/// source, and the dev ZTS answers each as Athenz does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_zts_answers_every_row_as_athenz_does() {
    let rows = rows();
    assert!(rows.len() >= 40, "the contract has {} rows", rows.len());
    let unique: BTreeSet<&str> = rows.iter().map(|r| r.case.as_str()).collect();
    assert_eq!(unique.len(), rows.len(), "a case is listed twice");
    let bed = bed().await;
    let mut failures = Vec::new();
    for row in &rows {
        assert!(!row.source.is_empty(), "{}: no Athenz source", row.case);
        let (status, message) = run(&bed, &row.case).await;
        let prefix_ok = row
            .message_prefix
            .as_ref()
            .is_none_or(|prefix| message.starts_with(prefix.as_str()));
        if status != row.status || !prefix_ok {
            failures.push(format!(
                "{}: want {} {:?}, got {status} {message:?}",
                row.case, row.status, row.message_prefix
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "rows the dev ZTS breaks:\n{}",
        failures.join("\n")
    );
}

/// A case the code knows but the table does not list fails here, so the table stays complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_case_is_refused() {
    let bed = bed().await;
    let unlisted = tokio::spawn(async move { run(&bed, "no_such_case").await });
    assert!(unlisted.await.is_err(), "an unknown case must panic");
}

/// With `oauth_openid_scope` on (Athenz `athenz.zts.oauth_openid_scope`), k8s-athenz-sia's
/// request also gets an ID token for its service, and the scope answer ends with `openid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openid_scope_gives_an_id_token_when_configured() {
    let zts = DevZts::start(DevZtsConfig {
        roles: vec![RoleEntry {
            domain: DOMAIN.into(),
            role: "readers".into(),
            members: vec!["media.sports.web".into()],
        }],
        openid_scope: true,
        ..DevZtsConfig::default()
    })
    .await
    .unwrap();
    let issued = zts
        .ca()
        .issue(
            &LeafSpec::service("media.sports.web", &[]),
            KeyAlgorithm::P256,
        )
        .unwrap();
    let ca = reqwest::Certificate::from_pem(zts.root_pem().as_bytes()).unwrap();
    let pem = format!("{}{}", issued.chain_pem, issued.key_pem.expose());
    let http = reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let answer: Value = http
        .post(format!("{}/oauth2/token", zts.url()))
        .header("content-type", authz_rows::FORM)
        .body("grant_type=client_credentials&scope=media.sports%3Adomain+openid+media.sports%3Aservice.web")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["scope"], "media.sports:role.readers openid",
        "{answer}"
    );
    let jwks = zts.fetch_jwks().await.unwrap();
    let claims = athenz_testbed::pyjwt::verify_es256(
        answer["id_token"].as_str().unwrap(),
        &jwks,
        "media.sports.web",
    )
    .unwrap();
    assert_eq!(claims["sub"], "media.sports.web");
}

/// Athenz's own clients send every row they can express, through their models, and get the
/// table's answer; the table's `athenz_client` column says which did, and a client it leaves out
/// must really be unable to send the row (so the column cannot go stale). Each checked row prints
/// `athenz-client: <client> <case> ok|FAILED` (tests/athenz/run counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn athenz_clients_get_every_row_the_table_gives() {
    let rows = rows();
    let mut failures = Vec::new();
    for harness in [Harness::Java, Harness::Go] {
        let bed = bed_via(Some(harness)).await;
        for row in &rows {
            let (status, message) = run(&bed, &row.case).await;
            let listed = row.athenz_clients.iter().any(|c| c == harness.name());
            let verdict = if listed {
                let prefix_ok = row
                    .message_prefix
                    .as_ref()
                    .is_none_or(|prefix| message.starts_with(prefix.as_str()));
                (status == row.status && prefix_ok)
                    .then_some(())
                    .ok_or_else(|| {
                        format!(
                            "{} {}: want {} {:?}, got {status} {message:?}",
                            harness.name(),
                            row.case,
                            row.status,
                            row.message_prefix
                        )
                    })
            } else {
                (status == 0).then_some(()).ok_or_else(|| {
                    format!(
                        "{} {}: the table says it cannot send this row, but it got {status} {message:?}",
                        harness.name(),
                        row.case
                    )
                })
            };
            let outcome = if verdict.is_ok() { "ok" } else { "FAILED" };
            println!("athenz-client: {} {} {outcome}", harness.name(), row.case);
            if let Err(failure) = verdict {
                failures.push(failure);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "rows where Athenz's clients disagree with the table:\n{}",
        failures.join("\n")
    );
}
