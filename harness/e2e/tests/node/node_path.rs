//! The node path end to end: the real agent on its socket, the real jwt-service and callback over
//! mutual TLS, the dev ZTS, the API and kubelet stand-ins, and the real `athenz-sia` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "node_path/refresh.rs"]
mod refresh;

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
