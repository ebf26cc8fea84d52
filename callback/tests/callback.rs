//! The callback over real mutual TLS against the Kubernetes API stand-in: for every check a request
//! where only that check fails, and the full round trip dev ZTS → callback with a JWT from the
//! real jwt-service. Forged tokens, malformed confirmations and refused callers:
//! hostile_input.rs; a Kubernetes API that cannot answer: kubernetes_api_down.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_core::identity_jwt::IdentityClaims;
use athenz_core::secret::Secret;
use athenz_core::zts::{
    InstanceConfirmation, InstanceRegisterInformation, ZtsClient, ZtsClientConfig,
};
use athenz_jwt_service::signer::JwtSigner;
use athenz_testbed::fixtures::{self, DOMAIN, NAMESPACE, POD_NAME, POD_UID, PROVIDER, SERVICE};
use athenz_testbed::kube_api::{cluster_ip_service, mark_terminating, running_pod};
use athenz_testbed::pki::LeafSpec;
use clap::Parser;
use std::time::Duration;

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_genuine_pod_is_confirmed_and_echoed() {
    let f = start().await;
    let c = confirmation(es256(&f, &claims()));
    let (status, body) = f.confirm(&c).await;
    assert_eq!(status, 200, "{body}");
    let mut expected = serde_json::to_value(&c).unwrap();
    expected["attributes"]["certExpiryTime"] = "90".into();
    assert_eq!(
        body, expected,
        "every attribute echoed unchanged, plus certExpiryTime"
    );
    // RS256 with the RSA key works too, on /refresh
    let c = confirmation(f.rsa.sign("v2", &claims()).unwrap());
    let (status, _) = f.post("refresh", &serde_json::to_string(&c).unwrap()).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_fails_alone() {
    let f = start().await;
    let cases: Vec<(&str, InstanceConfirmation)> = vec![
        ("provider", {
            let mut c = confirmation(es256(&f, &claims()));
            c.provider = "k8s.admin.other-provider".into();
            c
        }),
        (
            "exp",
            confirmation(es256_raw(&f, &{
                let mut v = serde_json::to_value(claims()).unwrap();
                v.as_object_mut().unwrap().remove("exp");
                v
            })),
        ),
        (
            "exp",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    exp: now() - 120,
                    ..claims()
                },
            )),
        ),
        (
            "iat_nbf",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    iat: now() + 600,
                    ..claims()
                },
            )),
        ),
        (
            "iat_nbf",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    nbf: now() + 600,
                    ..claims()
                },
            )),
        ),
        (
            "aud",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    aud: "someone-else".into(),
                    ..claims()
                },
            )),
        ),
        (
            "aud",
            confirmation(es256_raw(&f, &{
                let mut v = serde_json::to_value(claims()).unwrap();
                v.as_object_mut().unwrap().remove("aud");
                v
            })),
        ),
        (
            "iss",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    iss: "elsewhere".into(),
                    ..claims()
                },
            )),
        ),
        (
            "jti",
            confirmation(es256_raw(&f, &{
                let mut v = serde_json::to_value(claims()).unwrap();
                v.as_object_mut().unwrap().remove("jti");
                v
            })),
        ),
        (
            "subject",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    sub: "pod:../x".into(),
                    ..claims()
                },
            )),
        ),
        ("domain_service", {
            let mut c = confirmation(es256(&f, &claims()));
            c.service = "db".into();
            c
        }),
        ("instance_id", {
            let mut c = confirmation(es256(&f, &claims()));
            c.attributes.insert(
                "instanceId".into(),
                "11111111-2222-4333-8444-555555555555".into(),
            );
            c
        }),
        ("namespace", {
            // a subject whose domain is not what its namespace maps to
            let sub = format!(
                "pod:other-ns/{POD_NAME}?d={DOMAIN}&n={SERVICE}&i={}&u={POD_UID}",
                fixtures::POD_IP
            );
            confirmation(es256(&f, &IdentityClaims { sub, ..claims() }))
        }),
        (
            "pod_node",
            confirmation(es256(
                &f,
                &IdentityClaims {
                    node: "node-2".into(),
                    ..claims()
                },
            )),
        ),
        (
            "pod_node",
            confirmation(es256_raw(&f, &{
                let mut v = serde_json::to_value(claims()).unwrap();
                v.as_object_mut().unwrap().remove("node");
                v
            })),
        ),
        ("san_dns", {
            let mut c = confirmation(es256(&f, &claims()));
            c.attributes.insert(
                "sanDNS".into(),
                "web.media-sports.athenz.cloud,admin.evil.example".into(),
            );
            c
        }),
        ("san_ip", {
            // a cluster IP while the Service does not exist
            let mut c = confirmation(es256(&f, &claims()));
            c.attributes
                .insert("sanIP".into(), format!("{},10.96.0.10", fixtures::POD_IP));
            c
        }),
        ("san_uri", {
            let mut c = confirmation(es256(&f, &claims()));
            c.attributes
                .insert("sanURI".into(), "spiffe://k8s.admin/sa/root".into());
            c
        }),
    ];
    for (check, c) in cases {
        assert_denied(f.confirm(&c).await, check);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_checks_fail_alone() {
    let f = start().await;
    let cluster = f.kube.cluster().clone();
    let reset = || {
        cluster.put_pod(running_pod(
            NAMESPACE,
            POD_NAME,
            POD_UID,
            SERVICE,
            &fixtures::POD_IP.to_string(),
            "node-1",
        ));
    };
    type Breakage<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Breakage)> = vec![
        (
            "pod_exists",
            Box::new(|| {
                cluster.delete_pod(NAMESPACE, POD_NAME);
            }),
        ),
        (
            "pod_uid",
            Box::new(|| {
                cluster.update_pod(NAMESPACE, POD_NAME, |p| {
                    p.metadata.uid = Some("99999999-2222-4333-8444-555555555555".into())
                });
            }),
        ),
        (
            "pod_terminating",
            Box::new(|| {
                cluster.update_pod(NAMESPACE, POD_NAME, mark_terminating);
            }),
        ),
        (
            "pod_phase",
            Box::new(|| {
                cluster.update_pod(NAMESPACE, POD_NAME, |p| {
                    p.status.as_mut().unwrap().phase = Some("Succeeded".into())
                });
            }),
        ),
        (
            "service_account",
            Box::new(|| {
                cluster.update_pod(NAMESPACE, POD_NAME, |p| {
                    p.spec.as_mut().unwrap().service_account_name = Some("db".into())
                });
            }),
        ),
        (
            "pod_node",
            Box::new(|| {
                cluster.update_pod(NAMESPACE, POD_NAME, |p| {
                    p.spec.as_mut().unwrap().node_name = Some("node-2".into())
                });
            }),
        ),
        (
            "pod_ip",
            Box::new(|| {
                cluster.update_pod(NAMESPACE, POD_NAME, |p| {
                    let s = p.status.as_mut().unwrap();
                    s.pod_ip = Some("10.1.2.99".into());
                    s.pod_ips = None;
                });
            }),
        ),
    ];
    for (check, break_it) in cases {
        reset();
        break_it();
        assert_denied(f.confirm(&confirmation(es256(&f, &claims()))).await, check);
    }
    // and a pending pod is fine
    reset();
    cluster.update_pod(NAMESPACE, POD_NAME, |p| {
        p.status.as_mut().unwrap().phase = Some("Pending".into())
    });
    assert_eq!(f.confirm(&confirmation(es256(&f, &claims()))).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_ip_counts_only_when_the_service_exists() {
    let f = start().await;
    let with_service_ip = || {
        let mut c = confirmation(es256(&f, &claims()));
        c.attributes
            .insert("sanIP".into(), format!("{},10.96.0.10", fixtures::POD_IP));
        c
    };
    assert_denied(f.confirm(&with_service_ip()).await, "san_ip");
    f.kube
        .cluster()
        .put_service(cluster_ip_service(NAMESPACE, SERVICE, "10.96.0.10"));
    assert_eq!(f.confirm(&with_service_ip()).await.0, 200);
    f.kube
        .cluster()
        .put_service(cluster_ip_service(NAMESPACE, SERVICE, "10.96.0.11"));
    assert_denied(f.confirm(&with_service_ip()).await, "san_ip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_keys_are_reloaded() {
    let f = start().await;
    let v3 = JwtSigner::from_pem(key_pem(KeyAlgorithm::P256).as_bytes()).unwrap();
    assert_denied(
        f.confirm(&confirmation(v3.sign("v3", &claims()).unwrap()))
            .await,
        "kid",
    );
    std::fs::write(
        f._dir.path().join("public/v3.pem"),
        v3.public_key_pem().unwrap(),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = f
            .confirm(&confirmation(v3.sign("v3", &claims()).unwrap()))
            .await;
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "v3 was never picked up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // and a removed version stops verifying
    std::fs::remove_file(f._dir.path().join("public/v1.pem")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = f.confirm(&confirmation(es256(&f, &claims()))).await;
        if status == 403 && body["message"].as_str().unwrap().starts_with("kid: ") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "v1 was never dropped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The sample pod's JWT from the jwt-service on `port`, asked by node `node`'s agent.
async fn jwt_as(f: &Fixture, node: &str, port: u16) -> serde_json::Value {
    f.node_client(node)
        .post(format!("https://127.0.0.1:{port}/v1/jwt"))
        .json(&serde_json::json!({"subject": {
            "namespace": NAMESPACE, "name": POD_NAME, "uid": POD_UID,
            "domain": DOMAIN, "service": SERVICE, "ip": fixtures::POD_IP.to_string()}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_through_the_dev_zts_with_a_real_jwt_service() {
    let f = start().await;
    // the real jwt-service, signing with a new key v4 whose public half the callback is given
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let signing_pem = key_pem(KeyAlgorithm::P256);
    std::fs::write(keys.join("v4.pem"), &signing_pem).unwrap();
    std::fs::write(
        f._dir.path().join("public/v4.pem"),
        JwtSigner::from_pem(signing_pem.as_bytes())
            .unwrap()
            .public_key_pem()
            .unwrap(),
    )
    .unwrap();
    let files = f
        .zts
        .ca()
        .write_service_cert(
            dir.path(),
            "jwt",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service("k8s.admin.athenz-jwt-service", &[])
            },
        )
        .unwrap();
    let jwt_config = athenz_jwt_service::Config::try_parse_from([
        "athenz-jwt-service",
        "--listen=127.0.0.1:0",
        "--ops-listen=127.0.0.1:0",
        &format!("--tls-cert={}", files.cert.display()),
        &format!("--tls-key={}", files.key.display()),
        &format!("--client-ca={}", f.zts.ca_path().display()),
        &format!("--allowed-principals={}", fixtures::AGENT_PRINCIPAL),
        &format!("--keys-dir={}", keys.display()),
        &format!("--provider={PROVIDER}"),
    ])
    .unwrap();
    let (jwt_bound, _) = athenz_jwt_service::start(jwt_config, f.shutdown.clone())
        .await
        .unwrap();
    // let the callback pick up v4
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // the agent's part: get a JWT as node-1, then register with ZTS
    let jwt: serde_json::Value = jwt_as(&f, "node-1", jwt_bound.api.port()).await;
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let zts = ZtsClient::new(ZtsClientConfig {
        url: f.zts.url().into(),
        ca: athenz_core::tls::ServerCaBundle::fixed(pem_certificates(f.zts.root_pem()).unwrap())
            .unwrap(),
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let info = InstanceRegisterInformation {
        provider: PROVIDER.into(),
        domain: DOMAIN.into(),
        service: SERVICE.into(),
        attestation_data: Secret::new(jwt["jwt"].as_str().unwrap()),
        csr: build_csr(&fixtures::pod_identity_without_service_ip(), &key).unwrap(),
        token: Some(true),
        ..Default::default()
    };
    let registered = zts.register(&info).await.unwrap();
    let cert = athenz_core::crypto::CertInfo::from_pem(
        registered.identity.x509_certificate.as_deref().unwrap(),
    )
    .unwrap();
    assert_eq!(cert.common_name, "media.sports.web");
    // the callback's certExpiryTime (90 minutes) was honoured
    // (to the minute: ZTS, like the dev ZTS, starts a certificate when it signs it)
    assert_eq!((cert.not_after - cert.not_before).whole_minutes(), 90);
    // the same JWT cannot be used again
    let err = zts.register(&info).await.unwrap_err();
    assert!(err.to_string().contains("jti"), "{err}");
    // another node's agent cannot get this pod's identity: its JWT names node-2
    let elsewhere: serde_json::Value = jwt_as(&f, "node-2", jwt_bound.api.port()).await;
    let err = zts
        .register(&InstanceRegisterInformation {
            attestation_data: Secret::new(elsewhere["jwt"].as_str().unwrap()),
            csr: build_csr(&fixtures::pod_identity_without_service_ip(), &key).unwrap(),
            ..info.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert!(err.to_string().contains("pod_node"), "{err}");
    // a deleted pod is refused
    f.kube.cluster().delete_pod(NAMESPACE, POD_NAME);
    let fresh: serde_json::Value = jwt_as(&f, "node-1", jwt_bound.api.port()).await;
    let err = zts
        .register(&InstanceRegisterInformation {
            attestation_data: Secret::new(fresh["jwt"].as_str().unwrap()),
            ..info
        })
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert!(err.to_string().contains("pod_exists"), "{err}");
}

/// A CSI files-mode volume is published before the pod has an IP, and one without `ipSAN` never
/// names it: a launch without an IP (in the JWT and in the SANs) is confirmed whether or not the
/// pod has one, but an IP SAN never appears without the JWT naming it, and a JWT naming an IP
/// the pod lacks is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_without_an_ip_names_no_pod_ip() {
    let f = start().await;
    let cluster = f.kube.cluster().clone();
    let without_ip_claims = || {
        let mut c = claims();
        c.sub = c.sub.replace(&format!("i={}", fixtures::POD_IP), "i=");
        c
    };
    let without_ip = |jwt: String| {
        let mut c = confirmation(jwt);
        c.attributes.remove("sanIP");
        c
    };
    // the pod has its IP: an identity without one makes no claim about it
    let (status, body) = f
        .confirm(&without_ip(es256(&f, &without_ip_claims())))
        .await;
    assert_eq!(status, 200, "{body}");
    // but the pod's IP as a SAN needs the JWT to name it
    assert_denied(
        f.confirm(&confirmation(es256(&f, &without_ip_claims())))
            .await,
        "san_ip",
    );
    // the sandbox has no IP yet (as the API shows a pod while its volumes are set up)
    cluster.update_pod(NAMESPACE, POD_NAME, |p| {
        let s = p.status.as_mut().unwrap();
        s.pod_ip = None;
        s.pod_ips = None;
        s.phase = Some("Pending".into());
    });
    let (status, body) = f
        .confirm(&without_ip(es256(&f, &without_ip_claims())))
        .await;
    assert_eq!(status, 200, "{body}");
    // an IP SAN the JWT does not vouch for is still refused
    assert_denied(
        f.confirm(&confirmation(es256(&f, &without_ip_claims())))
            .await,
        "san_ip",
    );
    // and a JWT naming an IP the pod does not have is refused
    assert_denied(
        f.confirm(&confirmation(es256(&f, &claims()))).await,
        "pod_ip",
    );
}
