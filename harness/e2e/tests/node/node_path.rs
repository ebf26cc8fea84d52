//! The node path end to end: the real agent on its socket, the real jwt-service and callback over
//! mutual TLS, the dev ZTS, the API and kubelet stand-ins, and the real `athenz-sia` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::agent_api::RefreshRequest;
use athenz_core::crypto::{CertInfo, PrivateKey, key_matches_cert, pem_certificates};
use athenz_core::files::{CA_FILE, CERT_FILE, KEY_FILE, NTOKEN_FILE};
use athenz_core::secret::Secret;
use athenz_core::volume::{VolumeId, VolumeState, read_json_file};
use athenz_sia::client::{AgentClient, AgentError};
use athenz_testbed::fixtures;
use athenz_testbed::openssl;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

const IP: &str = "10.1.2.3";

fn refused(e: AgentError) -> (u16, String) {
    match e {
        AgentError::Refused { code, message, .. } => (code, message),
        other => panic!("expected a refusal, got {other}"),
    }
}

fn read(out: &Path, name: &str) -> String {
    std::fs::read_to_string(out.join(name)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_init_writes_a_verified_identity() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-1", &uid(1), IP);
    let out = node.dir.path().join("out");
    let output = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let key = read(&out, KEY_FILE);
    let cert = read(&out, CERT_FILE);
    let ca = read(&out, CA_FILE);
    let mode = |n: &str| std::fs::metadata(out.join(n)).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        [
            mode(KEY_FILE),
            mode(CERT_FILE),
            mode(CA_FILE),
            mode(NTOKEN_FILE)
        ],
        [0o600, 0o644, 0o644, 0o600]
    );
    // leaf + intermediate, verified by openssl against the written CA bundle
    let chain = pem_certificates(&cert).unwrap();
    assert_eq!(chain.len(), 2);
    openssl::verify(
        node.zts.root_pem(),
        &athenz_core::crypto::der_to_pem(&chain[1]),
        &athenz_core::crypto::der_to_pem(&chain[0]),
    )
    .unwrap();
    assert!(ca.contains(node.zts.root_pem().trim()));
    // SANs exactly as DESIGN section 3
    let info = CertInfo::from_pem(&cert).unwrap();
    let wanted = athenz_core::names::CsrIdentity::for_pod(&athenz_core::names::PodIdentityInput {
        domain: fixtures::DOMAIN,
        service: fixtures::SERVICE,
        provider: fixtures::PROVIDER,
        dns_suffix: fixtures::DNS_SUFFIX,
        instance_id: &uid(1),
        pod_ip: Some(IP.parse().unwrap()),
        service_ip: None,
    })
    .unwrap();
    assert_eq!(info.common_name, wanted.common_name);
    assert_eq!(info.dns_names, wanted.dns_names);
    assert_eq!(info.ip_addresses, wanted.ip_addresses);
    assert_eq!(info.uris, wanted.uris);
    assert!(key_matches_cert(
        &PrivateKey::from_pem(&key).unwrap(),
        &info
    ));
    // the ntoken ZTS issued (token: true), and ZTS recorded the instance
    let token = athenz_core::ntoken::NToken::parse(read(&out, NTOKEN_FILE).trim()).unwrap();
    assert_eq!(token.principal(), "media.sports.web");
    let record = node
        .zts
        .instance(&athenz_testbed::zts::instances::InstanceKey {
            provider: fixtures::PROVIDER.into(),
            domain: fixtures::DOMAIN.into(),
            service: fixtures::SERVICE.into(),
            instance_id: uid(1),
        })
        .unwrap();
    assert_eq!(record.current_serial, info.serial_hex);
    let state: VolumeState = read_json_file(&node.volumes.volume(&id).state_json).unwrap();
    assert_eq!(state.cert_serial, info.serial_hex);
    assert_eq!(state.pod_uid, uid(1));
    // the agent's metrics saw each upstream once and the request
    for upstream in ["kubelet", "jwt_service", "zts_register"] {
        let count = metric(
            node.agent_ops,
            &format!(r#"athenz_agent_upstream_duration_seconds_count{{upstream="{upstream}"}}"#),
        )
        .await;
        assert_eq!(count, 1.0, "{upstream}");
    }
    assert_eq!(
        metric(
            node.agent_ops,
            r#"athenz_agent_http_requests_total{route="init",status="200"}"#
        )
        .await,
        1.0
    );
    // the pod, and the agent's own pod (scheduled on this node too)
    assert_eq!(
        metric(node.agent_ops, "athenz_agent_kubelet_cached_pods").await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_and_unknown_ids_touch_nothing() {
    let node = node("p256").await;
    let before = node.kubelet.controls().requests();
    for id in [
        "..".to_owned(),
        "%2F".to_owned(),
        "a%00b".to_owned(),
        "a".repeat(63),
        "a".repeat(65),
        "A".repeat(64),
        "g".repeat(64),
        format!("{}/../x", "a".repeat(64)),
    ] {
        let (status, text) = raw(&node.socket, format!("POST /v1/init/{id} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes()).await;
        assert!(status == 400 || status == 404, "{id}: {text}");
        if status == 404 {
            // only a path with more segments is not an init route at all
            assert!(id.contains('/'), "{id}: {text}");
        } else {
            assert!(text.contains("64 lowercase hex"), "{id}: {text}");
        }
    }
    // a well-formed id with no volume: 404, nobody asked
    let (status, text) = raw(&node.socket, format!("POST /v1/init/{} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n", "ab".repeat(32)).as_bytes()).await;
    assert_eq!(status, 404, "{text}");
    assert_eq!(
        node.kubelet.controls().requests(),
        before,
        "the kubelet was asked"
    );
    assert_eq!(jwts(&node).await, 0.0);
    assert_eq!(registers(&node).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_elsewhere_or_replaced_get_no_jwt() {
    let node = node("p256").await;
    // a volume whose pod is not on this node
    let elsewhere = volume_for(&node, "ghost", &uid(2));
    let (code, message) = refused(client(&node, &elsewhere).init().await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("not on this node"), "{message}");
    // a pod of the same name but another uid (replaced)
    node.kube
        .cluster()
        .put_pod(athenz_testbed::kube_api::running_pod(
            fixtures::NAMESPACE,
            "web-3",
            &uid(99),
            fixtures::SERVICE,
            IP,
            NODE,
        ));
    let replaced = volume_for(&node, "web-3", &uid(3));
    let (code, message) = refused(client(&node, &replaced).init().await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    assert_eq!(
        jwts(&node).await,
        0.0,
        "a JWT was signed for a pod that is not there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_init_waits_for_the_ip_and_for_the_kubelet() {
    let node = node("p256").await;
    // no IP yet: 503 with Retry-After, and the SIA keeps trying
    let id = pod_with_volume(&node, "web-4", &uid(4), "");
    match client(&node, &id).init().await.unwrap_err() {
        AgentError::Refused {
            code: 503,
            retry_after,
            message,
        } => {
            assert!(message.contains("no IP"), "{message}");
            assert!(retry_after.is_some());
        }
        other => panic!("{other}"),
    }
    let out = node.dir.path().join("out4");
    let child = sia(&node, "init", &id, &out, &[]).await.spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.kube
        .cluster()
        .update_pod(fixtures::NAMESPACE, "web-4", |p| {
            p.status.as_mut().unwrap().pod_ip = Some(IP.into())
        });
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.join(CERT_FILE).exists());

    // the kubelet lists the pod late (within the agent's wait)
    let id = pod_with_volume(&node, "web-5", &uid(5), "10.1.2.5");
    node.kubelet.controls().hide(fixtures::NAMESPACE, "web-5");
    let controls_show = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        node.kubelet.controls().show(fixtures::NAMESPACE, "web-5");
    };
    let late_client = client(&node, &id);
    let (answer, ()) = tokio::join!(late_client.init(), controls_show);
    answer.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_inits_of_one_volume_register_once() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-6", &uid(6), "10.1.2.6");
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let c = client(&node, &id);
            tokio::spawn(async move { c.init().await })
        })
        .collect();
    let mut certs = Vec::new();
    for call in calls {
        certs.push(call.await.unwrap().unwrap().cert_pem);
    }
    assert!(
        certs.iter().all(|c| *c == certs[0]),
        "callers got different identities"
    );
    assert_eq!(registers(&node).await, 1.0);
    let state: VolumeState = read_json_file(&node.volumes.volume(&id).state_json).unwrap();
    assert_eq!(
        state.cert_serial,
        CertInfo::from_pem(&certs[0]).unwrap().serial_hex
    );
    // an init-container restart later re-inits fine
    tokio::time::sleep(Duration::from_secs(6)).await;
    let again = client(&node, &id).init().await.unwrap();
    assert_ne!(again.cert_pem, certs[0]);
    assert_eq!(registers(&node).await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_checks_the_pair_before_anything_leaves_the_node() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-7", &uid(7), "10.1.2.7");
    let other = pod_with_volume(&node, "web-8", &uid(8), "10.1.2.8");
    let mine = client(&node, &id).init().await.unwrap();
    let theirs = client(&node, &other).init().await.unwrap();
    let pair = |key: &Secret, cert: &str| RefreshRequest {
        key_pem: key.clone(),
        cert_pem: cert.to_owned(),
    };
    let stranger_key = PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256)
        .unwrap()
        .to_pkcs8_pem()
        .unwrap();
    for (request, why) in [
        (pair(&Secret::new("garbage"), "garbage"), "garbage"),
        (pair(&stranger_key, &mine.cert_pem), "mismatched pair"),
        (
            pair(theirs.key_pem.as_ref().unwrap(), &theirs.cert_pem),
            "another volume's certificate",
        ),
    ] {
        let (code, message) = refused(client(&node, &id).refresh(&request).await.unwrap_err());
        assert_eq!(code, 400, "{why}: {message}");
    }
    assert_eq!(refreshes(&node).await, 0.0, "ZTS was called");
    // oversized body: 413
    let big = format!(
        "POST /v1/refresh/{id} HTTP/1.1\r\nhost: x\r\ncontent-length: 70000\r\nconnection: close\r\n\r\n{}",
        "x".repeat(70_000)
    );
    assert_eq!(raw(&node.socket, big.as_bytes()).await.0, 413);

    // the happy refresh, twice; then the first certificate again, superseded twice: refused by
    // the agent (ZTS never sees it, so it does not revoke the instance)
    let second = client(&node, &id)
        .refresh(&pair(mine.key_pem.as_ref().unwrap(), &mine.cert_pem))
        .await
        .unwrap();
    assert_ne!(second.cert_pem, mine.cert_pem);
    let third = client(&node, &id)
        .refresh(&pair(second.key_pem.as_ref().unwrap(), &second.cert_pem))
        .await
        .unwrap();
    assert_eq!(refreshes(&node).await, 2.0);
    let (code, message) = refused(
        client(&node, &id)
            .refresh(&pair(mine.key_pem.as_ref().unwrap(), &mine.cert_pem))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("superseded"), "{message}");
    assert_eq!(refreshes(&node).await, 2.0, "ZTS was called");
    // the one presented for the latest refresh is still accepted (an answer the pod never
    // wrote), as ZTS accepts its previous serial; then the one before is superseded
    let fourth = client(&node, &id)
        .refresh(&pair(second.key_pem.as_ref().unwrap(), &second.cert_pem))
        .await
        .unwrap();
    assert_ne!(fourth.cert_pem, third.cert_pem);
    let (code, message) = refused(
        client(&node, &id)
            .refresh(&pair(third.key_pem.as_ref().unwrap(), &third.cert_pem))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.contains("superseded")),
        (403, true),
        "{message}"
    );
}

/// A certificate of this volume's exact names that Athenz did not issue now — self-signed, from
/// another CA, or expired — is refused by the agent with the reason, and ZTS is never called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_refuses_certificates_athenz_did_not_issue_without_asking_zts() {
    use athenz_testbed::pki::{CertAuthority, LeafSpec};
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-12", &uid(12), "10.1.2.12");
    let mine = client(&node, &id).init().await.unwrap();
    let info = CertInfo::from_pem(&mine.cert_pem).unwrap();
    let key = PrivateKey::from_pem(mine.key_pem.as_ref().unwrap().expose()).unwrap();
    let spec = |validity: time::Duration, backdate: time::Duration| LeafSpec {
        common_name: info.common_name.clone(),
        organizational_units: info.organizational_units.clone(),
        dns_names: info.dns_names.clone(),
        ip_addresses: info.ip_addresses.clone(),
        uris: info.uris.clone(),
        emails: Vec::new(),
        validity,
        backdate,
    };
    let day = time::Duration::days(1);
    // the right CA, the right names and key, but expired
    let expired = node
        .zts
        .ca()
        .issue_for_key(&spec(-day, day * 2), &key.public_key_der())
        .unwrap();
    // the right names and key under a CA Athenz does not use
    let other_ca = CertAuthority::new_root("Not Athenz")
        .unwrap()
        .issue_for_key(
            &spec(day, time::Duration::minutes(1)),
            &key.public_key_der(),
        )
        .unwrap();
    // self-signed by the pod's own key, made by openssl
    let uri_sans: Vec<String> = info.uris.iter().map(|u| format!("URI:{u}")).collect();
    let self_signed = openssl::run(
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "/dev/stdin",
            "-days",
            "1",
            "-subj",
            &format!("/CN={}", info.common_name),
            "-addext",
            &format!("subjectAltName={}", uri_sans.join(",")),
        ],
        mine.key_pem.as_ref().unwrap().expose().as_bytes(),
    )
    .unwrap();
    let self_signed =
        self_signed[self_signed.find("-----BEGIN CERTIFICATE-----").unwrap()..].to_owned();
    for (cert, why) in [
        (expired.chain_pem.as_str(), "expired"),
        (other_ca.chain_pem.as_str(), "not issued by the Athenz CA"),
        (self_signed.as_str(), "not issued by the Athenz CA"),
    ] {
        let request = RefreshRequest {
            key_pem: mine.key_pem.clone().unwrap(),
            cert_pem: cert.to_owned(),
        };
        let (code, message) = refused(client(&node, &id).refresh(&request).await.unwrap_err());
        assert_eq!(code, 403, "{why}: {message}");
        assert!(message.contains(why), "{why}: {message}");
    }
    assert_eq!(refreshes(&node).await, 0.0, "ZTS was called");
    // and the real one still refreshes
    let request = RefreshRequest {
        key_pem: mine.key_pem.clone().unwrap(),
        cert_pem: mine.cert_pem.clone(),
    };
    client(&node, &id).refresh(&request).await.unwrap();
    assert_eq!(refreshes(&node).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_are_503_or_403_with_the_reason() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-9", &uid(9), "10.1.2.9");
    let out = node.dir.path().join("out9");
    // ZTS down: 503, nothing written; back up: success
    node.zts_proxy.set_down(true).await;
    let (code, _) = refused(client(&node, &id).init().await.unwrap_err());
    assert_eq!(code, 503);
    let child = sia(&node, "init", &id, &out, &[]).await.spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!out.join(CERT_FILE).exists());
    node.zts_proxy.set_down(false).await;
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // the callback denies (its key for the JWT is gone): 403 carrying the reason
    std::fs::remove_file(node.public_keys.join("v1.pem")).unwrap();
    let id2 = pod_with_volume(&node, "web-10", &uid(10), "10.1.2.10");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client(&node, &id2).init().await {
            Err(AgentError::Refused {
                code: 403, message, ..
            }) => {
                assert!(message.contains("kid"), "{message}");
                break;
            }
            other => assert!(Instant::now() < deadline, "never denied: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // jwt-service down: 503
    node.jwt_shutdown.trigger();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id3 = pod_with_volume(&node, "web-11", &uid(11), "10.1.2.11");
    let (code, message) = refused(client(&node, &id3).init().await.unwrap_err());
    assert_eq!(code, 503, "{message}");
    assert!(message.contains("jwt-service"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_does_not_stop_the_agent() {
    let node = node("p256").await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = node.agent_config.clone();
    config.agent_dir = dir.path().join("agent2");
    std::fs::create_dir_all(&config.agent_dir).unwrap();
    std::fs::write(config.agent_dir.join("agent.sock"), b"stale").unwrap();
    let shutdown = athenz_core::daemon::Shutdown::new();
    let (bound, task) = athenz_identity_agent::start(config, shutdown.clone())
        .await
        .unwrap();
    common::wait_ready(bound.ops).await;
    let mode = std::fs::metadata(&bound.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o666, "non-root pods must be able to connect");
    let (status, _) = raw(
        &bound.socket,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    assert!(!bound.socket.exists(), "socket left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_refresh_keeps_a_consistent_set_and_stops_on_sigterm() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-12", &uid(12), "10.1.2.12");
    let out = node.dir.path().join("out12");
    let output = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // refresh as often as allowed, while a reader checks every pair it reads
    let mut child = sia(&node, "refresh", &id, &out, &[("REFRESH_INTERVAL", "50ms")])
        .await
        .spawn()
        .unwrap();
    let set = athenz_core::files::FileSet::new(&out);
    let first = read(&out, CERT_FILE);
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "only {} refreshes seen",
            seen.len()
        );
        let files = set.read(&[KEY_FILE, CERT_FILE]).unwrap();
        let key = PrivateKey::from_pem(std::str::from_utf8(&files[0]).unwrap()).unwrap();
        let cert = CertInfo::from_pem(std::str::from_utf8(&files[1]).unwrap()).unwrap();
        assert!(
            key_matches_cert(&key, &cert),
            "a reader saw a key and certificate of different issues"
        );
        seen.insert(cert.serial_hex);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_ne!(read(&out, CERT_FILE), first);
    let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_refresh_without_files_or_id_says_why() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-13", &uid(13), "10.1.2.13");
    let out = node.dir.path().join("empty");
    let output = sia(&node, "refresh", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no current identity"));
    let output = sia(&node, "init", &id, &out, &[("ID_FILE", "/nonexistent/id")])
        .await
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--id-file (ID_FILE)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_refresh_timing_follows_the_certificate_lifetime() {
    // one-minute certificates, not backdated: the refresh is due at 70 % of the lifetime, minus
    // up to 10 % jitter — between 36 s and 42 s after issue
    let node = node_with(
        "p256",
        athenz_testbed::zts::DevZtsConfig {
            max_cert_lifetime_minutes: 1,
            cert_backdate_secs: 0,
            ..Default::default()
        },
    )
    .await;
    let id = pod_with_volume(&node, "web-14", &uid(14), "10.1.2.14");
    let out = node.dir.path().join("out14");
    let output = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let first = CertInfo::from_pem(&read(&out, CERT_FILE)).unwrap();
    assert_eq!((first.not_after - first.not_before).whole_seconds(), 60);
    let _child = sia(&node, "refresh", &id, &out, &[]).await.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(70);
    let refreshed_at = loop {
        let now = time::OffsetDateTime::now_utc();
        if CertInfo::from_pem(&read(&out, CERT_FILE))
            .is_ok_and(|c| c.serial_hex != first.serial_hex)
        {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the certificate was never refreshed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = (refreshed_at - first.not_before).whole_seconds();
    assert!(
        (34..=46).contains(&after),
        "refreshed {after} s into a 60 s certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_initialised_for_another_pod_is_refused() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-15", &uid(15), "10.1.2.15");
    client(&node, &id).init().await.unwrap();
    // the same volume now claims another pod (uid)
    let paths = node.volumes.volume(&id);
    let mut data: athenz_core::volume::VolumeData = read_json_file(&paths.data_json).unwrap();
    data.pod_uid = uid(16);
    athenz_core::volume::write_json_file(&paths.data_json, &data, 0o600).unwrap();
    node.kube
        .cluster()
        .update_pod(fixtures::NAMESPACE, "web-15", |p| {
            p.metadata.uid = Some(uid(16))
        });
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (code, message) = refused(client(&node, &id).init().await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("another pod"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_ip_san_comes_from_the_configured_dns_server() {
    let node = node("p256").await;
    let dns = athenz_testbed::dns::Dns::start().await.unwrap();
    let service_ip: std::net::IpAddr = "10.96.0.10".parse().unwrap();
    dns.set(
        &format!(
            "{}.{}.svc.cluster.local",
            fixtures::SERVICE,
            fixtures::NAMESPACE
        ),
        &[service_ip],
    );
    // a second agent on this node with the lookup turned on
    let dir = tempfile::tempdir().unwrap();
    let mut config = node.agent_config.clone();
    config.agent_dir = dir.path().join("agent");
    config.cluster_domain = Some("cluster.local".into());
    config.dns_resolver = Some(dns.addr());
    let shutdown = athenz_core::daemon::Shutdown::new();
    let (bound, _) = athenz_identity_agent::start(config, shutdown.clone())
        .await
        .unwrap();
    common::wait_ready(bound.ops).await;
    let via =
        |id: &VolumeId| AgentClient::new(bound.socket.clone(), id.clone(), Duration::from_secs(30));

    // the Service exists: the SAN is issued
    node.kube
        .cluster()
        .put_service(athenz_testbed::kube_api::cluster_ip_service(
            fixtures::NAMESPACE,
            fixtures::SERVICE,
            "10.96.0.10",
        ));
    let id = pod_with_volume(&node, "web-20", &uid(20), "10.1.2.20");
    let answer = via(&id).init().await.unwrap();
    let cert = CertInfo::from_pem(&answer.cert_pem).unwrap();
    assert_eq!(
        cert.ip_addresses,
        ["10.1.2.20".parse::<std::net::IpAddr>().unwrap(), service_ip]
    );

    // DNS says so but the Service is gone: the callback refuses the SAN
    node.kube
        .cluster()
        .delete_service(fixtures::NAMESPACE, fixtures::SERVICE);
    let id = pod_with_volume(&node, "web-21", &uid(21), "10.1.2.21");
    let (code, message) = refused(via(&id).init().await.unwrap_err());
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("san_ip"), "{message}");

    // no DNS record: the pod gets its identity without the SAN
    dns.set(
        &format!(
            "{}.{}.svc.cluster.local",
            fixtures::SERVICE,
            fixtures::NAMESPACE
        ),
        &[],
    );
    let id = pod_with_volume(&node, "web-22", &uid(22), "10.1.2.22");
    let cert = CertInfo::from_pem(&via(&id).init().await.unwrap().cert_pem).unwrap();
    assert_eq!(
        cert.ip_addresses,
        ["10.1.2.22".parse::<std::net::IpAddr>().unwrap()]
    );
    shutdown.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_status_shows_each_volume_and_its_last_error() {
    use athenz_identity_agent::status::report;
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-20", &uid(20), "10.1.2.20");
    let pending = pod_with_volume(&node, "web-21", &uid(21), "10.1.2.21");
    let issued = client(&node, &id).init().await.unwrap();
    let serial = CertInfo::from_pem(&issued.cert_pem).unwrap().serial_hex;
    let now = time::OffsetDateTime::now_utc();

    let r = report(&node.volumes, now).unwrap();
    assert_eq!(r.volumes.len(), 2, "{r:?}");
    let mine = r.volumes.iter().find(|v| v.id == id.to_string()).unwrap();
    assert_eq!(mine.pod, format!("{}/web-20", fixtures::NAMESPACE));
    assert_eq!(mine.mode, athenz_core::volume_mode::VolumeMode::Flex);
    assert_eq!(mine.refreshed_by, "pod");
    assert_eq!(
        mine.principal.as_deref(),
        Some(format!("{}.{}", fixtures::DOMAIN, fixtures::SERVICE).as_str())
    );
    assert_eq!(mine.cert_serial.as_deref(), Some(serial.as_str()));
    assert!(mine.healthy && mine.last_error.is_none(), "{mine:?}");
    assert!(mine.next_refresh.is_some());
    let waiting = r
        .volumes
        .iter()
        .find(|v| v.id == pending.to_string())
        .unwrap();
    assert_eq!(waiting.problem.as_deref(), Some("no identity issued yet"));
    assert_eq!(r.unhealthy, 1);

    // a refused refresh is what the operator sees next, with the pod's own message
    let garbage = RefreshRequest {
        key_pem: Secret::new("garbage"),
        cert_pem: "garbage".into(),
    };
    let (code, message) = refused(client(&node, &id).refresh(&garbage).await.unwrap_err());
    let r = report(&node.volumes, now).unwrap();
    let mine = r.volumes.iter().find(|v| v.id == id.to_string()).unwrap();
    assert!(!mine.healthy);
    let last = mine.last_error.as_deref().unwrap();
    assert!(last.ends_with(&format!("{code} {message}")), "{last}");
    assert!(
        mine.problem.as_deref().unwrap().contains(&message),
        "{mine:?}"
    );

    // the next success clears it
    let good = RefreshRequest {
        key_pem: issued.key_pem.clone().unwrap(),
        cert_pem: issued.cert_pem.clone(),
    };
    let renewed = client(&node, &id).refresh(&good).await.unwrap();
    let r = report(&node.volumes, now).unwrap();
    let mine = r.volumes.iter().find(|v| v.id == id.to_string()).unwrap();
    assert!(mine.healthy, "{mine:?}");
    assert_eq!(
        mine.cert_serial.as_deref(),
        Some(
            CertInfo::from_pem(&renewed.cert_pem)
                .unwrap()
                .serial_hex
                .as_str()
        )
    );
    // an unknown id leaves no record anywhere
    let stranger = VolumeId::parse(&"f".repeat(64)).unwrap();
    let _ = client(&node, &stranger).init().await.unwrap_err();
    assert!(!node.volumes.volume(&stranger).dir.exists());
}

/// The refresh sidecar whose certificate expired (ZTS or the agent away longer than it lived)
/// registers anew instead of asking to refresh a certificate no one refreshes, and the pod is
/// whole again; before, the agent refused the refresh, the sidecar exited, and a restart of it
/// could never heal (found by `athenz-devstack chaos`, fault zts-stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_registers_anew_once_the_certificate_expired() {
    use athenz_core::files::{Credentials, FileSet, write_credentials};
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-30", &uid(30), "10.1.2.30");
    let out = node.dir.path().join("out");
    let init = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    // the set now holds an expired certificate of the same key
    let key_pem = read(&out, KEY_FILE);
    let expired = athenz_testbed::pki::expired_self_signed(&key_pem, "media.sports.web").unwrap();
    write_credentials(
        &FileSet::new(&out),
        &Credentials {
            key_pem: Some(&Secret::new(key_pem)),
            cert_pem: &expired,
            ca_pem: &read(&out, CA_FILE),
            ntoken: &Secret::new(read(&out, NTOKEN_FILE)),
        },
        None,
    )
    .unwrap();
    let mut refresher = sia(&node, "refresh", &id, &out, &[]).await.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let renewed = loop {
        let cert = read(&out, CERT_FILE);
        if cert != expired {
            break cert;
        }
        assert!(
            refresher.try_wait().unwrap().is_none(),
            "the refresher exited instead of registering anew"
        );
        assert!(Instant::now() < deadline, "no new certificate within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let info = CertInfo::from_pem(&renewed).unwrap();
    assert!(info.not_after > time::OffsetDateTime::now_utc());
    assert_eq!(info.common_name, "media.sports.web");
    assert!(key_matches_cert(
        &PrivateKey::from_pem(&read(&out, KEY_FILE)).unwrap(),
        &info
    ));
    let chain = pem_certificates(&renewed).unwrap();
    openssl::verify(
        node.zts.root_pem(),
        &athenz_core::crypto::der_to_pem(&chain[1]),
        &athenz_core::crypto::der_to_pem(&chain[0]),
    )
    .unwrap();
    // and it keeps running, refreshing as usual from here
    assert!(refresher.try_wait().unwrap().is_none());
    refresher.kill().await.unwrap();
}
