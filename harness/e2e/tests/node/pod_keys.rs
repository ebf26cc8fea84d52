//! Pod-made keys (docs/design.md §4.6) against the real agent, jwt-service, callback and dev ZTS:
//! the agent checks a pod's CSR exactly and refuses anything else with 400 naming it, before a JWT
//! is asked for or ZTS called; a pod refreshes with ZTS itself through the agent's tunnel; an agent
//! and a SIA that disagree on `--key-source` refuse each other with 400 naming the setting.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::agent_api::CsrTemplate;
use athenz_core::crypto::{CertInfo, KeyAlgorithm, PrivateKey, build_csr};
use athenz_core::names::CsrIdentity;
use athenz_core::volume::VolumeState;
use athenz_sia::client::{AgentClient, AgentError};
use athenz_sia::pod_key::PodKey;
use athenz_sia::pod_refresh::{self, ZtsRoute};
use common::*;
use std::time::Duration;

fn client(node: &Node, id: &athenz_core::volume::VolumeId) -> AgentClient {
    AgentClient::new(node.socket.clone(), id.clone(), Duration::from_secs(20))
}

fn refused(e: AgentError) -> (u16, String) {
    match e {
        AgentError::Refused { code, message, .. } => (code, message),
        other => panic!("not a refusal: {other}"),
    }
}

/// A CSR for `identity` signed by a fresh key of `alg`.
fn csr(identity: &CsrIdentity, alg: KeyAlgorithm) -> String {
    build_csr(identity, &PrivateKey::generate(alg).unwrap()).unwrap()
}

/// A CSR of `identity` with a 1024-bit RSA key, as `openssl req` makes it.
fn weak_csr(identity: &CsrIdentity) -> String {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.pem");
    let mut san: Vec<String> = identity
        .dns_names
        .iter()
        .map(|d| format!("DNS:{d}"))
        .collect();
    san.extend(identity.ip_addresses.iter().map(|i| format!("IP:{i}")));
    san.extend(identity.uris.iter().map(|u| format!("URI:{u}")));
    let out = std::process::Command::new("openssl")
        .args(["req", "-new", "-newkey", "rsa:1024", "-nodes", "-keyout"])
        .arg(&key)
        .arg("-subj")
        .arg(format!(
            "/CN={}/OU={}",
            identity.common_name,
            identity.organizational_unit.clone().unwrap()
        ))
        .arg("-addext")
        .arg(format!("subjectAltName={}", san.join(",")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csr_that_is_not_exactly_the_pods_is_refused_before_zts() {
    let node = node_pod_keys().await;
    let id = pod_with_volume(&node, "web-1", &uid(1), "10.1.3.1");
    let client = client(&node, &id);
    let template = client.csr_template().await.unwrap();
    let expected: CsrIdentity = template.clone().into();
    let registers = node.zts.requests("register");

    let mut changed = expected.clone();
    changed.dns_names[0] = "api.media-sports.athenz.cloud".into();
    let mut added = expected.clone();
    added.ip_addresses.push("10.9.9.9".parse().unwrap());
    let mut removed = expected.clone();
    let uri = removed.uris.pop().unwrap();
    let mut other_service = expected.clone();
    other_service.common_name = "media.sports.api".into();
    let good = csr(&expected, KeyAlgorithm::P256);
    // a good CSR with its signature broken: flip a byte of the signature (the DER's end)
    let tampered = {
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(good.as_bytes())
            .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())
            .unwrap();
        let mut der = der;
        let last = der.len() - 3;
        der[last] ^= 0x5a;
        athenz_core::crypto::der_to_pem_labelled(&der, "CERTIFICATE REQUEST")
    };
    let cases = [
        (
            csr(&changed, KeyAlgorithm::P256),
            "DNS SAN api.media-sports.athenz.cloud is not this pod's".to_owned(),
        ),
        (
            csr(&added, KeyAlgorithm::P256),
            "IP SAN 10.9.9.9 is not this pod's".to_owned(),
        ),
        (
            csr(&removed, KeyAlgorithm::P256),
            format!("URI SAN {uri} is missing"),
        ),
        (
            csr(&other_service, KeyAlgorithm::P256),
            "subject CN is \"media.sports.api\"".to_owned(),
        ),
        (weak_csr(&expected), "key RSA-1024 is too weak".to_owned()),
        (tampered, "signature does not verify".to_owned()),
    ];
    for (pem, named) in cases {
        let (code, message) = refused(client.init_with_csr(pem).await.unwrap_err());
        assert_eq!(code, 400, "{message}");
        assert!(message.contains(&named), "{named:?} not in {message:?}");
    }
    assert_eq!(node.zts.requests("register"), registers, "ZTS was called");
    assert!(
        node.volumes.volume(&id).state_json.metadata().is_err(),
        "a refused init left state behind"
    );

    // the exact CSR, with either key type: issued, and no key in the answer
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PodKey::generate(alg).unwrap();
        let answer = client
            .init_with_csr(key.csr(template.clone()).unwrap())
            .await
            .unwrap();
        assert!(answer.key_pem.is_none());
        key.check_certificate(&answer.cert_pem).unwrap();
        // init coalescing never hands a certificate for another key
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_refreshes_with_zts_through_the_tunnel_and_the_agent_learns_the_serial() {
    let node = node_pod_keys().await;
    let id = pod_with_volume(&node, "web-2", &uid(2), "10.1.3.2");
    let client = client(&node, &id);
    let key = PodKey::generate(KeyAlgorithm::P256).unwrap();
    let template: CsrTemplate = client.csr_template().await.unwrap();
    let first = client
        .init_with_csr(key.csr(template).unwrap())
        .await
        .unwrap();
    let refreshes = node.zts.requests("instance_refresh");
    let route = ZtsRoute::Tunnel { ca: None };
    let mut key_pem = key.pem().clone();
    let mut cert_pem = first.cert_pem.clone();
    for _ in 0..2 {
        // certificate times are in whole seconds: a second apart, each expires later
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let next = pod_refresh::refresh(
            &client,
            &route,
            KeyAlgorithm::P256,
            &key_pem,
            &cert_pem,
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        let info = CertInfo::from_pem(&next.cert_pem).unwrap();
        client.report_certificate(&next.cert_pem).await.unwrap();
        let state: VolumeState =
            athenz_core::volume::read_json_file(&node.volumes.volume(&id).state_json).unwrap();
        assert_eq!(state.cert_serial, info.serial_hex);
        assert_eq!(
            state.key_source,
            Some(athenz_core::agent_api::KeySource::Pod)
        );
        key_pem = next.key_pem.unwrap();
        cert_pem = next.cert_pem;
    }
    assert_eq!(node.zts.requests("instance_refresh") - refreshes, 2);

    // the agent answers attestations only for a current certificate of this volume
    let (code, message) = refused(client.attestation(&first.cert_pem).await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("superseded"), "{message}");
    let other = pod_with_volume(&node, "web-3", &uid(3), "10.1.3.3");
    let (code, message) = refused(
        AgentClient::new(node.socket.clone(), other, Duration::from_secs(5))
            .attestation(&cert_pem)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 404, "{message}");

    // tunnels go to the configured ZTS only
    let (code, message) = refused(client.tunnel("example.com:443").await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("ZTS"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_and_a_sia_that_disagree_on_the_key_source_say_so() {
    // the agent makes keys; a pod-key SIA's calls are refused naming the setting
    let agent_keys = node("p256").await;
    let id = pod_with_volume(&agent_keys, "web-4", &uid(4), "10.1.3.4");
    let c = client(&agent_keys, &id);
    let template = CsrTemplate {
        common_name: "media.sports.web".into(),
        organizational_unit: None,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        uris: Vec::new(),
    };
    let csr = PodKey::generate(KeyAlgorithm::P256)
        .unwrap()
        .csr(template)
        .unwrap();
    for e in [
        c.init_with_csr(csr).await.unwrap_err(),
        c.csr_template().await.unwrap_err(),
    ] {
        let (code, message) = refused(e);
        assert_eq!(code, 400);
        assert!(message.contains("--key-source agent"), "{message}");
    }

    // the pod makes keys; a key-less init and a refresh carrying a key are refused
    let pod_keys = node_pod_keys().await;
    let id = pod_with_volume(&pod_keys, "web-5", &uid(5), "10.1.3.5");
    let c = client(&pod_keys, &id);
    let (code, message) = refused(c.init().await.unwrap_err());
    assert_eq!(code, 400);
    assert!(message.contains("--key-source pod"), "{message}");
    let pair = athenz_core::agent_api::RefreshRequest {
        key_pem: athenz_core::secret::Secret::new("k"),
        cert_pem: "c".into(),
    };
    let (code, message) = refused(c.refresh(&pair).await.unwrap_err());
    assert_eq!(code, 400);
    assert!(message.contains("--key-source pod"), "{message}");

    // and the real SIA, misconfigured, exits naming it instead of falling back
    let out = pod_keys.dir.path().join("out-5");
    let output = sia(&pod_keys, "init", &id, &out, &[("KEY_SOURCE", "agent")])
        .await
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--key-source pod"), "{stderr}");
    assert!(!out.join("service.key.pem").exists());
}
