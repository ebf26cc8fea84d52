//! ZTS's own provider client against the callback: Athenz's `InstanceHttpProvider` (with its
//! `InstanceProviderClient` and `ProviderHostnameVerifier`, built as ZTSImpl builds it, from
//! Maven Central through harness/peers/athenz/java) and the dev ZTS's port of it
//! (`athenz_testbed::zts::instance_provider_client`) are given the same case, each with a token
//! of its own (a JWT confirms once). Each must reach the case's written outcome ([`Want`]): the
//! confirmation, decoded by both and compared field by field with what the case expects; the
//! callback's refusal, its status and reason; or no answer at all, in each client's own words.
//! Beyond that the two must agree with each other. Each case prints
//! `athenz-callback: java <case> ok|FAILED`, each scripted provider answer
//! `athenz-provider-answer: java <answer> ok|FAILED` (harness/peers/athenz/run counts them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "athenz_provider_client/cases.rs"]
mod cases;
mod common;
#[path = "athenz_provider_client/verdict.rs"]
mod verdict;

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
use cases::*;
use common::*;
use serde_json::{Value, json};
use std::time::Duration;
use verdict::{Concluded, Want, verdict};

/// The principal ZTS presents to providers (the callback's `--allowed-principals`).
const ZTS_PRINCIPAL: &str = "sys.auth.zts";

/// A provider name the callback's certificate does not carry: Athenz's hostname verifier and
/// ours must both refuse the handshake.
const OTHER_PROVIDER: &str = "k8s.admin.other";

/// How long either client waits for a provider's answer: ZTS's
/// `athenz.instance.provider.client.read_timeout`, given to both, so a provider that never
/// answers costs seconds and each client's own report of it can be seen.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The Java harness's `ca`, `cert`, `key` and `read_timeout_ms` fields.
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
            READ_TIMEOUT,
        );
        let mut java = AthenzClient::start(Harness::Java).unwrap();
        let java_tls = json!({
            "ca": java.file(f.zts.root_pem()).unwrap(),
            "cert": java.file(&issued.chain_pem).unwrap(),
            "key": java.file(issued.key_pem.expose()).unwrap(),
            "read_timeout_ms": READ_TIMEOUT.as_millis(),
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
            // the port's way of saying "a 200 that is no confirmation" (ZTS then answers 403)
            Err(refusal) if refusal.code == 200 => Concluded::Unreadable(refusal.message),
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
            // the harness's report of a 200 InstanceProviderClient could not read
            ClientAnswer::Answered {
                status: 200,
                message,
                decoded: None,
            } => Concluded::Unreadable(message),
            ClientAnswer::Answered {
                status, message, ..
            } => Concluded::Refused(status, message),
            ClientAnswer::Unsendable(why) => panic!("{op}: unsendable: {why}"),
        }
    }
}

/// Puts the world in the state the case needs (`leave` undoes it).
async fn enter(f: &Fixture, world: World) {
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
        World::ApiUnreachable => f.kube.set_unreachable(true).await,
        World::Api503 => f
            .kube
            .set_failing_status(Some(http::StatusCode::SERVICE_UNAVAILABLE)),
        World::AsIs | World::Replayed => {}
    }
}

async fn leave(f: &Fixture, world: World, restore_pod: impl Fn()) {
    match world {
        World::PodDeleted | World::PodTerminating => restore_pod(),
        World::ApiUnreachable => f.kube.set_unreachable(false).await,
        World::Api503 => f.kube.set_failing_status(None),
        World::AsIs | World::Replayed => {}
    }
}

/// What the callback confirms: the confirmation as sent (no attestation data), with its
/// `certExpiryTime`.
fn echoed(sent: &InstanceConfirmation) -> Value {
    let mut value = without_attestation(serde_json::to_value(sent).unwrap());
    value["attributes"]["certExpiryTime"] = CERT_EXPIRY_MINUTES.into();
    value
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
        // a replay: each token is used once first, by the other client, and must confirm then
        let mut first_use = Ok(());
        if case.world == World::Replayed {
            let athenz_first = clients.athenz(&ask, &for_ours).await;
            let ours_first = clients.ours(&ask, &for_java).await;
            for (who, first) in [("Athenz's", athenz_first), ("dev ZTS's", ours_first)] {
                if !matches!(first, Concluded::Confirmed(_)) {
                    first_use = Err(format!("the first use, by {who} client: {first:?}"));
                }
            }
        }
        enter(&f, case.world).await;
        let ours = clients.ours(&ask, &for_ours).await;
        let theirs = clients.athenz(&ask, &for_java).await;
        leave(&f, case.world, || f.kube.cluster().put_pod(pod.clone())).await;
        // both tokens' confirmations are the same but for the attestation data
        let want = match case.want {
            Outcome::Echoed => Want::Confirmed(echoed(&for_ours)),
            Outcome::Denied(code, reason) => Want::Denied(code, reason),
            Outcome::NoAnswer { ours, athenz } => Want::NoAnswer { ours, athenz },
        };
        let verdict = first_use.and_then(|()| verdict(&want, &ours, &theirs));
        println!(
            "athenz-callback: java {} {}",
            case.name,
            if verdict.is_ok() { "ok" } else { "FAILED" }
        );
        if let Err(why) = verdict {
            failures.push(format!("{}: {why}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "cases where a provider client misses the written outcome:\n{}",
        failures.join("\n")
    );
}

/// How many TLS handshakes of `version` and `kind` the callback counted.
fn handshakes(metrics: &str, version: &str, kind: &str) -> u64 {
    let series =
        format!("athenz_callback_tls_handshakes_total{{version=\"{version}\",kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |count| count.trim().parse().unwrap())
}

/// ZTS resumes its TLS session with the callback, and the dev ZTS does as ZTS does: Athenz's
/// `InstanceHttpProvider`, given the one TLS 1.2 `SSLContext` ZTS keeps for its life, makes a
/// new client and connection for each confirmation, and the second and third resume the first's
/// session; then the dev ZTS's client, the same. Every confirmation confirms, resumed or not:
/// the callback's principal check reads ZTS's chain from the session.
///
/// Seen to fail by giving the callback a cache that stores nothing (then restored): every
/// handshake is then full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zts_resumes_its_tls_session_with_the_callback() {
    let f = start().await;
    let mut clients = Clients::new(&f);
    let ask = Ask {
        endpoint: &f.endpoint,
        provider: PROVIDER,
        route: ProviderRoute::Instance,
    };
    let fresh = || confirmation(f.ec.sign("v1", &claims()).unwrap());
    for who in ["Athenz's", "dev ZTS's"] {
        let before = f.metrics_text().await;
        for _ in 0..3 {
            let c = fresh();
            let concluded = match who {
                "Athenz's" => clients.athenz(&ask, &c).await,
                _ => clients.ours(&ask, &c).await,
            };
            assert!(
                matches!(concluded, Concluded::Confirmed(_)),
                "{who} client: {concluded:?}"
            );
        }
        let after = f.metrics_text().await;
        let added =
            |version, kind| handshakes(&after, version, kind) - handshakes(&before, version, kind);
        assert_eq!(
            (
                added("1.2", "full"),
                added("1.2", "resumed"),
                added("1.3", "full")
            ),
            (1, 2, 0),
            "{who} client's handshakes (TLS 1.2 full, resumed; TLS 1.3 full):\n{after}"
        );
    }
}

/// Answers no callback of ours gives, from a scripted provider: how each client reads them is
/// what ZTS then tells its caller, so the dev ZTS's reading must be Athenz's, and each is written
/// down here as Athenz's client reads it.
///
/// Seen to fail by breaking the dev ZTS's reading on purpose (then restored): make
/// `provider_answer::is_json` accept any media type → 200_confirmation_without_content_type
/// fails, the dev ZTS's client confirming what Athenz's cannot read.
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
    let as_read = Want::Confirmed(serde_json::from_str(confirmed).unwrap());
    // Jersey hides the parse error behind one sentence
    let unreadable = |ours| Want::Unreadable {
        ours,
        athenz: "Error reading entity from input stream.",
    };
    let answers = [
        ("200_confirmation", json(200, confirmed), as_read.clone()),
        (
            "200_confirmation_without_content_type",
            raw(200, confirmed),
            Want::Unreadable {
                ours: "MessageBodyReader not found for media type=application/octet-stream",
                athenz: "MessageBodyReader not found for media type=application/octet-stream",
            },
        ),
        ("403_empty_body", raw(403, ""), Want::Answered(403, "")),
        (
            "500_two_lines",
            raw(500, "first line\nsecond line"),
            Want::Answered(500, "first line second line"),
        ),
        (
            "504_from_the_provider",
            raw(504, r#"{"code":504,"message":"later"}"#),
            Want::Answered(504, r#"{"code":504,"message":"later"}"#),
        ),
        (
            "429_text",
            raw(429, "slow down"),
            Want::Answered(429, "slow down"),
        ),
        (
            "200_not_json",
            json(200, "not json"),
            unreadable("expected ident at line 1 column 2"),
        ),
        (
            "200_not_an_object",
            json(200, "[]"),
            unreadable("not a JSON object"),
        ),
        (
            "200_number_attribute",
            json(
                200,
                r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attributes":{"certExpiryTime":90}}"#,
            ),
            as_read.clone(),
        ),
        (
            "200_unknown_field",
            json(
                200,
                r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attributes":{},"extra":true}"#,
            ),
            unreadable("unrecognized field \"extra\""),
        ),
        // what ZTS's client reports for a provider that does not answer in time: 504 with its
        // own words (InstanceProviderClient: GATEWAY_TIMEOUT with the exception's message), the
        // shape a hung callback would show where a case wants the callback's own 504
        (
            "no_answer_within_the_read_timeout",
            Decision::Stall {
                millis: u64::try_from(READ_TIMEOUT.as_millis()).unwrap() + 3_000,
            },
            Want::NoAnswer {
                ours: "operation timed out",
                athenz: "java.net.SocketTimeoutException: Read timed out",
            },
        ),
    ];
    let mut failures = Vec::new();
    for (name, decision, want) in answers {
        stub.set_decision(decision);
        let ask = Ask {
            endpoint: stub.endpoint(),
            provider: PROVIDER,
            route: ProviderRoute::Instance,
        };
        let c = confirmation(f.ec.sign("v1", &claims()).unwrap());
        let ours = clients.ours(&ask, &c).await;
        let theirs = clients.athenz(&ask, &c).await;
        let verdict = verdict(&want, &ours, &theirs);
        println!(
            "athenz-provider-answer: java {name} {}",
            if verdict.is_ok() { "ok" } else { "FAILED" }
        );
        if let Err(why) = verdict {
            failures.push(format!("{name}: {why}"));
        }
    }
    assert!(
        failures.is_empty(),
        "provider answers a client reads otherwise than written:\n{}",
        failures.join("\n")
    );
}
