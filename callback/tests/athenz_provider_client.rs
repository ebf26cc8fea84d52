//! ZTS's own provider client against the callback: Athenz's `InstanceHttpProvider` (with its
//! `InstanceProviderClient` and `ProviderHostnameVerifier`, built as ZTSImpl builds it, from
//! Maven Central through tests/athenz-java) and the dev ZTS's port of it
//! (`athenz_testbed::zts::instance_provider_client`) are given the same case, each with a token
//! of its own (a JWT confirms once), and must conclude the same: the same confirmation, or the
//! same `ProviderResourceException` code and text. Each case prints
//! `athenz-client: java provider:<case> ok|FAILED` (tests/athenz/run counts them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::{KeyAlgorithm, pem_certificates};
use athenz_core::identity_jwt::IdentityClaims;
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use athenz_testbed::athenz_clients::{AthenzClient, ClientAnswer, Harness, request};
use athenz_testbed::fixtures::{NAMESPACE, POD_NAME, PROVIDER};
use athenz_testbed::kube_api::mark_terminating;
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::provider_stub::{Decision, ProviderStub};
use athenz_testbed::zts::instance_provider_client::{ProviderClients, ProviderRoute};
use athenz_testbed::zts::registry::ProviderEntry;
use common::*;
use serde_json::{Value, json};
use std::time::Duration;

/// The principal ZTS presents to providers (the callback's `--allowed-principals`).
const ZTS_PRINCIPAL: &str = "sys.auth.zts";

/// A provider name the callback's certificate does not carry: Athenz's hostname verifier and
/// ours must both refuse the handshake.
const OTHER_PROVIDER: &str = "k8s.admin.other";

/// What a client concluded: the confirmation (without the attestation data, which differs per
/// token), or the refusal's code and text.
#[derive(Debug, PartialEq)]
enum Concluded {
    Confirmed(Value),
    Refused(u16, String),
}

/// One case: which route, which provider name the client expects, the token's claims, the
/// confirmation's edits, and the state of the Kubernetes API while the clients ask.
struct Case {
    name: &'static str,
    route: ProviderRoute,
    expect_provider: &'static str,
    claims: fn(&mut IdentityClaims),
    /// Which of the callback's keys signs the token, under which `kid`.
    signed_with: (Key, &'static str),
    edit: fn(&mut InstanceConfirmation),
    world: World,
    /// The status both must conclude.
    status: u16,
}

#[derive(Clone, Copy, PartialEq)]
enum Key {
    /// The EC key the callback knows as `v1`.
    Ec,
    /// The RSA key the callback knows as `v2`.
    Rsa,
}

#[derive(Clone, Copy, PartialEq)]
enum World {
    AsIs,
    PodDeleted,
    PodTerminating,
    ApiUnreachable,
    Api503,
    /// The token was already used once (by the other client's turn beforehand).
    Replayed,
}

fn keep_claims(_: &mut IdentityClaims) {}
fn keep(_: &mut InstanceConfirmation) {}

fn cases() -> Vec<Case> {
    let case = |name, route, status| Case {
        name,
        route,
        expect_provider: PROVIDER,
        claims: keep_claims,
        signed_with: (Key::Ec, "v1"),
        edit: keep,
        world: World::AsIs,
        status,
    };
    use ProviderRoute::{Instance, Refresh};
    vec![
        case("launch_genuine", Instance, 200),
        case("refresh_genuine", Refresh, 200),
        Case {
            claims: |c| c.node = "node-2".into(),
            ..case("wrong_node", Instance, 403)
        },
        Case {
            world: World::PodDeleted,
            ..case("deleted_pod", Instance, 403)
        },
        Case {
            world: World::PodTerminating,
            ..case("terminating_pod", Refresh, 403)
        },
        Case {
            edit: |c| {
                let dns = c.attributes.get("sanDNS").cloned().unwrap_or_default();
                c.attributes
                    .insert("sanDNS".into(), format!("{dns},web.evil.example"));
            },
            ..case("san_dns_not_the_pods", Instance, 403)
        },
        Case {
            edit: |c| {
                c.attributes.insert("sanIP".into(), "10.9.8.7".into());
            },
            ..case("san_ip_not_the_pods", Instance, 403)
        },
        Case {
            edit: |c| {
                c.attributes.insert(
                    "instanceId".into(),
                    "00000000-0000-4000-8000-000000000000".into(),
                );
            },
            ..case("instance_id_not_the_pods", Instance, 403)
        },
        Case {
            edit: |c| c.service = "db".into(),
            ..case("service_not_the_tokens", Instance, 403)
        },
        Case {
            edit: |c| c.provider = "k8s.admin.unknown".into(),
            ..case("provider_not_ours", Instance, 403)
        },
        Case {
            edit: |c| c.attestation_data = Secret::new(String::new()),
            ..case("missing_attestation_data", Instance, 403)
        },
        Case {
            edit: |c| c.attestation_data = Secret::new(String::new()),
            ..case("refresh_without_attestation_data", Refresh, 403)
        },
        Case {
            claims: |c| {
                c.iat -= 3600;
                c.nbf -= 3600;
                c.exp -= 3600;
            },
            ..case("expired_token", Instance, 403)
        },
        Case {
            world: World::Replayed,
            ..case("replayed_token", Instance, 403)
        },
        Case {
            claims: |c| {
                c.iat += 3600;
                c.nbf += 3600;
                c.exp += 3600;
            },
            ..case("token_from_the_future", Instance, 403)
        },
        Case {
            claims: |c| c.aud = "another-audience".into(),
            ..case("token_for_another_audience", Instance, 403)
        },
        Case {
            claims: |c| c.iss = "someone-else".into(),
            ..case("token_of_another_issuer", Refresh, 403)
        },
        Case {
            claims: |c| c.sub = c.sub.replace("?d=media.sports&", "?d=news&"),
            ..case("subject_domain_not_the_requests", Instance, 403)
        },
        Case {
            claims: |c| c.sub = c.sub.replace("&i=10.1.2.3&", "&i=10.9.8.7&"),
            ..case("subject_ip_not_the_pods", Instance, 403)
        },
        Case {
            signed_with: (Key::Ec, "v9"),
            ..case("unknown_key_version", Instance, 403)
        },
        Case {
            signed_with: (Key::Rsa, "v1"),
            ..case("signed_by_another_key", Instance, 403)
        },
        Case {
            signed_with: (Key::Rsa, "v2"),
            ..case("rs256_genuine", Refresh, 200)
        },
        Case {
            world: World::ApiUnreachable,
            ..case("kubernetes_api_unreachable", Instance, 504)
        },
        Case {
            world: World::Api503,
            ..case("kubernetes_api_503", Refresh, 504)
        },
        Case {
            expect_provider: OTHER_PROVIDER,
            ..case("provider_certificate_of_another_service", Instance, 504)
        },
    ]
}

/// The case's confirmation twice, one per client: the same claims, read from the clock once
/// (a denial can quote them), each with a token of its own `jti` (a token confirms once).
fn confirmations_for(f: &Fixture, case: &Case) -> (InstanceConfirmation, InstanceConfirmation) {
    let mut claims = claims();
    (case.claims)(&mut claims);
    let (key, kid) = case.signed_with;
    let signer = match key {
        Key::Ec => &f.ec,
        Key::Rsa => &f.rsa,
    };
    let confirm = |claims: &IdentityClaims| {
        let mut c = confirmation(signer.sign(kid, claims).unwrap());
        (case.edit)(&mut c);
        c
    };
    let first = confirm(&claims);
    claims.jti = athenz_core::random::hex_name::<16>();
    (first, confirm(&claims))
}

fn without_attestation(mut confirmed: Value) -> Value {
    if let Some(fields) = confirmed.as_object_mut() {
        fields.remove("attestationData");
    }
    confirmed
}

/// Where and whom a client asks: the provider's endpoint, the provider name its certificate
/// must carry, the route.
struct Ask<'a> {
    endpoint: &'a str,
    provider: &'a str,
    route: ProviderRoute,
}

impl<'a> Ask<'a> {
    fn case(f: &'a Fixture, case: &Case) -> Self {
        Self {
            endpoint: &f.endpoint,
            provider: case.expect_provider,
            route: case.route,
        }
    }
}

/// The two provider clients, each set up once, as ZTS sets up its own: ZTS's identity,
/// trusting ZTS's CA.
struct Clients {
    ours: ProviderClients,
    java: AthenzClient,
    /// The Java harness's `ca`, `cert` and `key` fields.
    java_tls: Value,
}

impl Clients {
    fn new(f: &Fixture) -> Self {
        let issued = f
            .zts
            .ca()
            .issue(&LeafSpec::service(ZTS_PRINCIPAL, &[]), KeyAlgorithm::P256)
            .unwrap();
        let ours = ProviderClients::new(
            pem_certificates(f.zts.root_pem()).unwrap(),
            ClientIdentity::Fixed(
                tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose()).unwrap(),
            ),
            Duration::from_secs(10),
        );
        let mut java = AthenzClient::start(Harness::Java).unwrap();
        let java_tls = json!({
            "ca": java.file(f.zts.root_pem()).unwrap(),
            "cert": java.file(&issued.chain_pem).unwrap(),
            "key": java.file(issued.key_pem.expose()).unwrap(),
        });
        Self {
            ours,
            java,
            java_tls,
        }
    }

    /// The dev ZTS's provider client.
    async fn ours(&self, ask: &Ask<'_>, confirmation: &InstanceConfirmation) -> Concluded {
        let provider = ProviderEntry {
            name: ask.provider.into(),
            endpoint: ask.endpoint.to_owned(),
            dns_suffixes: vec![],
            launch: vec![],
        };
        match self.ours.confirm(&provider, ask.route, confirmation).await {
            Ok(confirmed) => Concluded::Confirmed(without_attestation(
                serde_json::to_value(confirmed).unwrap(),
            )),
            Err(refusal) => Concluded::Refused(refusal.code, refusal.message),
        }
    }

    /// Athenz's `InstanceHttpProvider`, through the Java harness.
    async fn athenz(&mut self, ask: &Ask<'_>, confirmation: &InstanceConfirmation) -> Concluded {
        let op = match ask.route {
            ProviderRoute::Instance => "provider_instance",
            ProviderRoute::Refresh => "provider_refresh",
        };
        let mut fields = json!({
            "url": ask.endpoint,
            "provider": ask.provider,
            "confirmation": confirmation,
        });
        if let (Some(fields), Some(tls)) = (fields.as_object_mut(), self.java_tls.as_object()) {
            fields.extend(tls.clone());
        }
        match self.java.call(&request(op, fields)).await.unwrap() {
            ClientAnswer::Answered {
                status: 200,
                decoded: Some(confirmed),
                ..
            } => Concluded::Confirmed(without_attestation(confirmed)),
            ClientAnswer::Answered {
                status, message, ..
            } => Concluded::Refused(status, message),
            ClientAnswer::Unsendable(why) => panic!("{op}: unsendable: {why}"),
        }
    }
}

/// Puts the world in the state the case needs (`leave` undoes it).
fn enter(f: &Fixture, world: World) {
    match world {
        World::PodDeleted => {
            f.kube.cluster().delete_pod(NAMESPACE, POD_NAME).unwrap();
        }
        World::PodTerminating => {
            assert!(
                f.kube
                    .cluster()
                    .update_pod(NAMESPACE, POD_NAME, mark_terminating)
            );
        }
        World::ApiUnreachable => f.kube.set_unreachable(true),
        World::Api503 => f
            .kube
            .set_failing_status(Some(http::StatusCode::SERVICE_UNAVAILABLE)),
        World::AsIs | World::Replayed => {}
    }
}

fn leave(f: &Fixture, world: World, restore_pod: impl Fn()) {
    match world {
        World::PodDeleted | World::PodTerminating => restore_pod(),
        World::ApiUnreachable => f.kube.set_unreachable(false),
        World::Api503 => f.kube.set_failing_status(None),
        World::AsIs | World::Replayed => {}
    }
}

/// Whether the two conclusions agree: equal, except that a connection that failed (504 with no
/// provider answer) and a 200 that is no confirmation (code 200 here: ZTS makes it a 403) are
/// described in each client's own words, and a denial that names the callback's clock
/// (`(now <seconds>)`) was asked a second apart.
fn agree(ours: &Concluded, theirs: &Concluded) -> bool {
    const NO_ANSWER: &str = "ResourceException (504): ";
    match (ours, theirs) {
        (Concluded::Refused(504, a), Concluded::Refused(504, b))
            if !a.contains("\"code\":504") && !b.contains("\"code\":504") =>
        {
            a.starts_with(NO_ANSWER) && b.starts_with(NO_ANSWER)
        }
        (Concluded::Refused(200, _), Concluded::Refused(200, _)) => true,
        (Concluded::Refused(x, a), Concluded::Refused(y, b)) => {
            x == y && without_clock(a) == without_clock(b)
        }
        _ => ours == theirs,
    }
}

/// The text without the clock reading a time-check denial carries.
fn without_clock(message: &str) -> String {
    match message.find("(now ") {
        Some(at) => match message[at..].find(')') {
            Some(end) => format!("{}{}", &message[..at], &message[at + end + 1..]),
            None => message.to_owned(),
        },
        None => message.to_owned(),
    }
}

fn status(c: &Concluded) -> u16 {
    match c {
        Concluded::Confirmed(_) => 200,
        Concluded::Refused(code, _) => *code,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zts_own_provider_client_concludes_as_the_dev_zts_does() {
    let f = start().await;
    let mut clients = Clients::new(&f);
    let pod = f.kube.cluster().pod(NAMESPACE, POD_NAME).unwrap();
    let cases = cases();
    assert!(cases.len() >= 12, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let (for_ours, for_java) = confirmations_for(&f, case);
        let ask = Ask::case(&f, case);
        if case.world == World::Replayed {
            // each token is used once first, by the other client
            assert_eq!(status(&clients.athenz(&ask, &for_ours).await), 200);
            assert_eq!(status(&clients.ours(&ask, &for_java).await), 200);
        }
        enter(&f, case.world);
        let ours = clients.ours(&ask, &for_ours).await;
        let theirs = clients.athenz(&ask, &for_java).await;
        leave(&f, case.world, || f.kube.cluster().put_pod(pod.clone()));
        let ok = agree(&ours, &theirs) && status(&ours) == case.status;
        println!(
            "athenz-client: java provider:{} {}",
            case.name,
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failures.push(format!(
                "{} (want {}):\n  dev ZTS's client: {ours:?}\n  Athenz's client:  {theirs:?}",
                case.name, case.status
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the two provider clients disagree:\n{}",
        failures.join("\n")
    );
}

/// Answers no callback of ours gives, from a scripted provider: how each client reads them is
/// what ZTS then tells its caller, so the dev ZTS's reading must be Athenz's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_provider_answers_are_read_as_zts_reads_them() {
    let f = start().await;
    let mut clients = Clients::new(&f);
    let stub = ProviderStub::start(
        f.zts.ca(),
        PROVIDER,
        f.zts.root_pem(),
        "/callback",
        Decision::Allow {
            cert_expiry_minutes: None,
        },
    )
    .await
    .unwrap();
    let raw = |status: u16, body: &str| Decision::Raw {
        status,
        body: body.to_owned(),
    };
    let json = |status: u16, body: &str| Decision::RawJson {
        status,
        body: body.to_owned(),
    };
    let confirmed = r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attributes":{"certExpiryTime":"90"}}"#;
    let answers = [
        ("200_confirmation", json(200, confirmed)),
        ("200_confirmation_without_content_type", raw(200, confirmed)),
        ("403_empty_body", raw(403, "")),
        ("500_two_lines", raw(500, "first line\nsecond line")),
        (
            "504_from_the_provider",
            raw(504, r#"{"code":504,"message":"later"}"#),
        ),
        ("429_text", raw(429, "slow down")),
        ("200_not_json", json(200, "not json")),
        ("200_not_an_object", json(200, "[]")),
        (
            "200_number_attribute",
            json(
                200,
                r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attributes":{"certExpiryTime":90}}"#,
            ),
        ),
        (
            "200_unknown_field",
            json(
                200,
                r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attributes":{},"extra":true}"#,
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, decision) in answers {
        stub.set_decision(decision);
        let ask = Ask {
            endpoint: stub.endpoint(),
            provider: PROVIDER,
            route: ProviderRoute::Instance,
        };
        let c = confirmation(f.ec.sign("v1", &claims()).unwrap());
        let ours = clients.ours(&ask, &c).await;
        let theirs = clients.athenz(&ask, &c).await;
        let ok = agree(&ours, &theirs);
        println!(
            "athenz-client: java provider-answer:{name} {}",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failures.push(format!(
                "{name}:\n  dev ZTS's client: {ours:?}\n  Athenz's client:  {theirs:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the two provider clients read a provider's answer differently:\n{}",
        failures.join("\n")
    );
}
