//! The cases `athenz_provider_client` puts to both provider clients, each with its written
//! outcome: a genuine launch or refresh, each way the callback must deny, and each way it must
//! not answer at all.

use super::*;

/// One case: which route, which provider name the client expects, the token's claims, the
/// confirmation's edits, and the state of the Kubernetes API while the clients ask.
pub struct Case {
    pub name: &'static str,
    pub route: ProviderRoute,
    pub expect_provider: &'static str,
    pub claims: fn(&mut IdentityClaims),
    /// Which of the callback's keys signs the token, under which `kid`.
    pub signed_with: (Key, &'static str),
    pub edit: fn(&mut InstanceConfirmation),
    pub world: World,
    /// The outcome both must reach ([`Want::Confirmed`]'s value is filled in per case: the
    /// confirmation sent, echoed with the callback's `certExpiryTime`).
    pub want: Outcome,
}

/// A case's written outcome.
#[derive(Clone, Copy)]
pub enum Outcome {
    /// The confirmation sent, echoed with `certExpiryTime` = the callback's
    /// `--cert-expiry-minutes` (90).
    Echoed,
    /// [`Want::Denied`].
    Denied(u16, &'static str),
    /// [`Want::NoAnswer`].
    NoAnswer {
        ours: &'static str,
        athenz: &'static str,
    },
}

/// The callback's `--cert-expiry-minutes` (tests/common): what a confirmation carries back.
pub const CERT_EXPIRY_MINUTES: &str = "90";

#[derive(Clone, Copy, PartialEq)]
pub enum Key {
    /// The EC key the callback knows as `v1`.
    Ec,
    /// The RSA key the callback knows as `v2`.
    Rsa,
}

#[derive(Clone, Copy, PartialEq)]
pub enum World {
    AsIs,
    PodDeleted,
    PodTerminating,
    ApiUnreachable,
    Api503,
    /// The token was already used once (by the other client's turn beforehand).
    Replayed,
}

pub fn keep_claims(_: &mut IdentityClaims) {}
pub fn keep(_: &mut InstanceConfirmation) {}

pub fn cases() -> Vec<Case> {
    let case = |name, route, want| Case {
        name,
        route,
        expect_provider: PROVIDER,
        claims: keep_claims,
        signed_with: (Key::Ec, "v1"),
        edit: keep,
        world: World::AsIs,
        want,
    };
    let denied = |reason| Outcome::Denied(403, reason);
    use Outcome::Echoed;
    use ProviderRoute::{Instance, Refresh};
    // Each verdict was seen to fail by breaking the callback on purpose (then restored):
    // - the genuine cases: make the callback answer its confirmations 200 with an empty body →
    //   launch_genuine fails with both clients Unreadable (before, two unreadable 200s agreed and
    //   passed as status 200); make it echo certExpiryTime "60" → refresh_genuine fails on
    //   attributes.certExpiryTime;
    // - the refusals: change the text of the pod_node check's denial → wrong_node fails on its
    //   reason though both clients still agreed;
    // - the 504s: make the callback hang instead of answering 504 when the Kubernetes API is
    //   unreachable → kubernetes_api_unreachable fails with both clients' read timeouts (before,
    //   any two no-answer failures passed).
    vec![
        case("launch_genuine", Instance, Echoed),
        case("refresh_genuine", Refresh, Echoed),
        Case {
            claims: |c| c.node = "node-2".into(),
            ..case(
                "wrong_node",
                Instance,
                denied(
                    "pod_node: pod media-sports/web-7d9f is scheduled on \"node-1\", but the \
                     identity was asked for by node node-2",
                ),
            )
        },
        Case {
            world: World::PodDeleted,
            ..case(
                "deleted_pod",
                Instance,
                denied("pod_exists: pod media-sports/web-7d9f does not exist"),
            )
        },
        Case {
            world: World::PodTerminating,
            ..case(
                "terminating_pod",
                Refresh,
                denied("pod_terminating: the pod is being deleted"),
            )
        },
        Case {
            edit: |c| {
                let dns = c.attributes.get("sanDNS").cloned().unwrap_or_default();
                c.attributes
                    .insert("sanDNS".into(), format!("{dns},web.evil.example"));
            },
            ..case(
                "san_dns_not_the_pods",
                Instance,
                denied("san_dns: web.evil.example is not one of the pod's names"),
            )
        },
        Case {
            edit: |c| {
                c.attributes.insert("sanIP".into(), "10.9.8.7".into());
            },
            ..case(
                "san_ip_not_the_pods",
                Instance,
                denied("san_ip: 10.9.8.7 is not one of the pod's addresses"),
            )
        },
        Case {
            edit: |c| {
                c.attributes.insert(
                    "instanceId".into(),
                    "00000000-0000-4000-8000-000000000000".into(),
                );
            },
            ..case(
                "instance_id_not_the_pods",
                Instance,
                denied(
                    "instance_id: instanceId Some(\"00000000-0000-4000-8000-000000000000\") is \
                     not the pod uid ",
                ),
            )
        },
        Case {
            edit: |c| c.service = "db".into(),
            ..case(
                "service_not_the_tokens",
                Instance,
                denied(
                    "domain_service: the JWT is for media.sports.web, the request for media.sports.db",
                ),
            )
        },
        Case {
            edit: |c| c.provider = "k8s.admin.unknown".into(),
            ..case(
                "provider_not_ours",
                Instance,
                denied(
                    "provider: provider \"k8s.admin.unknown\" is not \"k8s.admin.athenz-callback\"",
                ),
            )
        },
        Case {
            edit: |c| c.attestation_data = Secret::new(String::new()),
            ..case("missing_attestation_data", Instance, denied(NO_ATTESTATION))
        },
        Case {
            edit: |c| c.attestation_data = Secret::new(String::new()),
            ..case(
                "refresh_without_attestation_data",
                Refresh,
                denied(NO_ATTESTATION),
            )
        },
        Case {
            claims: |c| {
                c.iat -= 3600;
                c.nbf -= 3600;
                c.exp -= 3600;
            },
            ..case(
                "expired_token",
                Instance,
                denied("exp: the JWT expired at "),
            )
        },
        Case {
            world: World::Replayed,
            ..case(
                "replayed_token",
                Instance,
                denied("jti: the JWT was already used"),
            )
        },
        Case {
            claims: |c| {
                c.iat += 3600;
                c.nbf += 3600;
                c.exp += 3600;
            },
            ..case(
                "token_from_the_future",
                Instance,
                denied("exp: the JWT is valid until "),
            )
        },
        Case {
            claims: |c| c.aud = "another-audience".into(),
            ..case(
                "token_for_another_audience",
                Instance,
                denied("aud: audience \"another-audience\" is not \"k8s-athenz-identity\""),
            )
        },
        Case {
            claims: |c| c.iss = "someone-else".into(),
            ..case(
                "token_of_another_issuer",
                Refresh,
                denied(
                    "iss: issuer Some(\"someone-else\") is not \"athenz-k8s-identity/jwt-service\"",
                ),
            )
        },
        Case {
            claims: |c| c.sub = c.sub.replace("?d=media.sports&", "?d=news&"),
            ..case(
                "subject_domain_not_the_requests",
                Instance,
                denied("domain_service: the JWT is for news.web, the request for media.sports.web"),
            )
        },
        Case {
            claims: |c| c.sub = c.sub.replace("&i=10.1.2.3&", "&i=10.9.8.7&"),
            ..case(
                "subject_ip_not_the_pods",
                Instance,
                denied("pod_ip: the pod does not have IP 10.9.8.7"),
            )
        },
        Case {
            signed_with: (Key::Ec, "v9"),
            ..case(
                "unknown_key_version",
                Instance,
                denied("kid: unknown key id \"v9\""),
            )
        },
        Case {
            signed_with: (Key::Rsa, "v1"),
            ..case(
                "signed_by_another_key",
                Instance,
                denied("algorithm: key v1 verifies ES256, the token claims RS256"),
            )
        },
        Case {
            signed_with: (Key::Rsa, "v2"),
            ..case("rs256_genuine", Refresh, Echoed)
        },
        // the callback's own 504 (a check it cannot make now), passed on by both clients with its
        // body: not their read timeout, which a callback that hung would cause
        Case {
            world: World::ApiUnreachable,
            ..case(
                "kubernetes_api_unreachable",
                Instance,
                Outcome::Denied(
                    504,
                    "cannot tell now (kubernetes_api): Kubernetes API: pod media-sports/web-7d9f: ",
                ),
            )
        },
        Case {
            world: World::Api503,
            ..case(
                "kubernetes_api_503",
                Refresh,
                Outcome::Denied(
                    504,
                    "cannot tell now (kubernetes_api): Kubernetes API: pod media-sports/web-7d9f: \
                     answered 503 Service Unavailable",
                ),
            )
        },
        // no answer: each client refuses the callback's certificate in the handshake
        Case {
            expect_provider: OTHER_PROVIDER,
            ..case(
                "provider_certificate_of_another_service",
                Instance,
                Outcome::NoAnswer {
                    ours: "server certificate principal Some(\"k8s.admin.athenz-callback\") is \
                           not the expected \"k8s.admin.other\"",
                    athenz: "javax.net.ssl.SSLPeerUnverifiedException: Certificate for \
                             <127.0.0.1> doesn't match",
                },
            )
        },
    ]
}

/// The callback's denial of a confirmation without attestation data.
pub const NO_ATTESTATION: &str =
    "attestation_data: missing: every launch and refresh must carry a fresh attestation";
