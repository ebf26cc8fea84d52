//! The dev ZTS held to `harness/testbed/data/zts-contract.tsv`: for every row, the request the row describes
//! is sent over real mutual TLS and the answer must have Athenz's status and start with Athenz's
//! message. Sent through Athenz's own Java and Go clients, a success must also decode, in their
//! models, to the row's written answer, field by field. The table cites the Athenz source that
//! decides each row; a row without a request here, or a request here without a row, fails the
//! test, so the two cannot drift apart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::ntoken::NTokenBuilder;
use athenz_testbed::athenz_clients::{AthenzClient, Harness};
use athenz_testbed::fixtures::{DNS_SUFFIX, DOMAIN, PROVIDER, SERVICE};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use athenz_testbed::provider_stub::{Decision, ProviderStub};
use athenz_testbed::zts::authz::RoleEntry;
use athenz_testbed::zts::registry::{ProviderEntry, ServiceEntry};
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use rcgen::SanType;
use serde_json::{Value, json};
use std::collections::BTreeSet;

#[path = "zts_contract/authz_rows.rs"]
mod authz_rows;
#[path = "zts_contract/bed.rs"]
mod bed;
#[path = "zts_contract/delivery.rs"]
mod delivery;
#[path = "zts_contract/instance_rows.rs"]
mod instance_rows;
#[path = "zts_contract/recorded.rs"]
mod recorded;
#[path = "zts_contract/under_test.rs"]
mod under_test;

use bed::{Bed, bed, bed_on, bed_via};
use delivery::{Identity, Reply, ZtsCall, client, deliver};
use instance_rows::{Sent, run};
use under_test::ZtsUnderTest;

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
    /// A success's fields as Athenz's clients decode it (`name=value`; `{instance}` stands for
    /// the instance the request was about).
    answer: Vec<(String, String)>,
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
        "case\troute\trequest\tstatus\tmessage_prefix\tanswer\tathenz_source\tathenz_client"
    );
    lines
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 8, "eight columns: {line}");
            Row {
                case: cols[0].to_owned(),
                status: cols[3].parse().unwrap(),
                message_prefix: (cols[4] != "-").then(|| cols[4].to_owned()),
                answer: parse_answer(cols[0], cols[5]),
                source: cols[6].to_owned(),
                athenz_clients: cols[7]
                    .split(' ')
                    .filter(|c| *c != "-")
                    .map(str::to_owned)
                    .collect(),
            }
        })
        .collect()
}

/// The answer column: `-`, or `name=value` fields separated by `; `.
fn parse_answer(case: &str, column: &str) -> Vec<(String, String)> {
    if column == "-" {
        return Vec::new();
    }
    column
        .split("; ")
        .map(|field| {
            let (name, value) = field
                .split_once('=')
                .unwrap_or_else(|| panic!("{case}: answer field {field:?} is not name=value"));
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

/// A decoded field as the table writes it: text as is, numbers and booleans as written, a list
/// joined with commas; `None` when the client did not decode it.
fn field_text(decoded: &Value, name: &str) -> Option<String> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    decoded.get(name).map(|value| match value {
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => text(other),
    })
}

/// Where a success's decoding misses the row's answer, field by field (empty: it meets it).
fn answer_misses(row: &Row, sent: &Sent) -> Vec<String> {
    let Some(decoded) = &sent.reply.decoded else {
        return vec!["no decoded answer".to_owned()];
    };
    row.answer
        .iter()
        .filter_map(|(name, want)| {
            let want = want.replace("{instance}", &sent.instance);
            match field_text(decoded, name) {
                Some(got) if got == want => None,
                Some(got) => Some(format!("{name} is {got:?}, want {want:?}")),
                None => Some(format!("{name} not decoded (decoded: {decoded})")),
            }
        })
        .collect()
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

async fn register(bed: &Bed, body: Value) -> Reply {
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
) -> Reply {
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
    call: impl std::future::Future<Output = Reply>,
) -> Reply {
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

async fn key_refresh(bed: &Bed, token_service: &str, csr: String) -> Reply {
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
        let Reply {
            status, message, ..
        } = run(&bed, &row.case).await.reply;
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
/// table's answer: its status; a refusal's message starting with the row's reason; a success
/// decoded, field by field, to the row's answer (a row that does not state one fails). The table's
/// `athenz_client` column says which sent the row, and a client it leaves out must really be
/// unable to send it (so the column cannot go stale). Each checked row prints
/// `athenz-contract: <client> <case> ok|FAILED` (harness/peers/athenz/run counts them).
///
/// Each verdict was seen to fail by breaking the dev ZTS on purpose (then restored):
/// - a refusal's reason: answer a refresh without a client certificate "a client certificate is
///   required" (the dev ZTS's old words; ZTS's authentication says "Invalid credentials") →
///   refresh_no_client_certificate fails in both clients;
/// - a success's answer: take a registered instance's id from its DNS name instead of its URI →
///   register_uri_wins_over_dns fails on instanceId; grant an access token's roles as "writers"
///   → access_token_ok fails on roles; ignore a role certificate request's expiryTime →
///   role_cert_every_optional_field fails on expiresInMinutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn athenz_clients_get_every_row_the_table_gives() {
    let rows = rows();
    for row in rows.iter().filter(|r| !r.athenz_clients.is_empty()) {
        if row.status >= 300 {
            assert!(
                row.message_prefix.is_some(),
                "{}: a refusal Athenz's clients send states its reason",
                row.case
            );
        } else {
            assert!(
                !row.answer.is_empty(),
                "{}: a success Athenz's clients send states its answer",
                row.case
            );
        }
    }
    let mut failures = Vec::new();
    for harness in [Harness::Java, Harness::Go] {
        let bed = bed_via(Some(harness)).await;
        for row in &rows {
            let sent = run(&bed, &row.case).await;
            let Reply {
                status, message, ..
            } = &sent.reply;
            let listed = row.athenz_clients.iter().any(|c| c == harness.name());
            let verdict = if !listed {
                (*status == 0).then_some(()).ok_or_else(|| {
                    format!(
                        "the table says it cannot send this row, but it got {status} {message:?}"
                    )
                })
            } else if *status != row.status {
                Err(format!(
                    "want {} {:?}, got {status} {message:?}",
                    row.status, row.message_prefix
                ))
            } else if let Some(prefix) = row
                .message_prefix
                .as_ref()
                .filter(|p| !message.starts_with(p.as_str()))
            {
                Err(format!("want the reason {prefix:?}, got {message:?}"))
            } else {
                let misses = if row.status < 300 {
                    answer_misses(row, &sent)
                } else {
                    Vec::new()
                };
                misses
                    .is_empty()
                    .then_some(())
                    .ok_or_else(|| format!("the answer is not the row's: {}", misses.join("; ")))
            };
            let outcome = if verdict.is_ok() { "ok" } else { "FAILED" };
            println!("athenz-contract: {} {} {outcome}", harness.name(), row.case);
            if let Err(failure) = verdict {
                failures.push(format!("{} {}: {failure}", harness.name(), row.case));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "rows where Athenz's clients disagree with the table:\n{}",
        failures.join("\n")
    );
}
