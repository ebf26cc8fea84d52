//! End to end, through the real binaries: `athenz-devstack up` runs every component as its own
//! process (dev ZTS, Kubernetes API and kubelet stand-ins, jwt-service, callback, initializer,
//! agent, control-sia sidecars); the tests play kubelet and the pod — the real volume driver with
//! kubelet's arguments, the real `athenz-sia` — and judge the files with `openssl`.
//!
//! Needs root (bind mounts) and the `athenz-devstack` binary, which `cargo test --workspace` builds
//! (the devstack crate has integration tests of its own).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::agent_api::KeySource;
use athenz_core::crypto::CertInfo;
use athenz_devstack::crossnode;
use athenz_devstack::demo::count_volumes;
use athenz_devstack::identity;
use athenz_devstack::kube::NewPod;
use athenz_devstack::node::{self, NodeDirs, PodVolume};
use athenz_devstack::stack::StackInfo;
use nix::sys::signal::{Signal, kill};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{Devstack, openssl_verifies};

fn is_mount_point(path: &Path) -> bool {
    athenz_core::volume_mount::mountinfo::MountTable::read()
        .unwrap()
        .is_mounted(path)
}

async fn refresh_directly(stack: &StackInfo, volume: &PodVolume) -> Result<String, String> {
    node::refresh_once(stack, volume).await.unwrap()
}

/// Waits until the pod's certificate serial differs from `old`.
async fn wait_new_serial(volume: &PodVolume, old: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(now) = identity::check(&volume.credentials_dir)
            && now.serial != old
        {
            return now.serial;
        }
        assert!(
            Instant::now() < deadline,
            "no new certificate within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_init_and_openssl_verify_then_clean_unmount() {
    let stack = Devstack::start();
    let volume = stack.pod("media-sports", "web-1", "10.1.0.11").await;
    // the pod's view: the id and the agent's socket, read-only
    assert!(is_mount_point(&volume.mount_dir));
    assert!(volume.mount_dir.join("connect/agent.sock").exists());
    node::sia_init(&stack.info, &volume).await.unwrap();
    let cert = openssl_verifies(&stack.info, &volume);
    assert_eq!(cert.common_name, "media.sports.web");
    assert!(cert.ip_addresses.contains(&"10.1.0.11".parse().unwrap()));
    assert!(
        cert.dns_names
            .contains(&"web.media-sports.athenz.cloud".to_owned())
    );
    node::unmount(&stack.info, &volume).await.unwrap();
    assert!(!is_mount_point(&volume.mount_dir));
    assert_eq!(count_volumes(&stack.info.volumes_dir).unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_pods_at_once() {
    let stack = Devstack::start();
    let mut tasks = tokio::task::JoinSet::new();
    let stack = std::sync::Arc::new(stack);
    for n in 0..20 {
        let stack = stack.clone();
        tasks.spawn(async move {
            let ns = if n % 2 == 0 {
                "media-sports"
            } else {
                "finance-ledger"
            };
            let volume = stack
                .pod(ns, &format!("pod-{n}"), &format!("10.3.0.{}", n + 1))
                .await;
            node::sia_init(&stack.info, &volume).await.unwrap();
            volume
        });
    }
    let mut serials = std::collections::BTreeSet::new();
    let mut volumes = Vec::new();
    while let Some(v) = tasks.join_next().await {
        let volume = v.unwrap();
        let cert = openssl_verifies(&stack.info, &volume);
        let domain = if volume.pod.namespace == "media-sports" {
            "media.sports"
        } else {
            "finance.ledger"
        };
        assert_eq!(cert.common_name, format!("{domain}.web"));
        assert!(cert.ip_addresses.contains(&volume.pod.ip.parse().unwrap()));
        serials.insert(cert.serial_hex);
        volumes.push(volume);
    }
    assert_eq!(serials.len(), 20, "every pod has its own certificate");
    for volume in &volumes {
        node::unmount(&stack.info, volume).await.unwrap();
    }
    assert_eq!(count_volumes(&stack.info.volumes_dir).unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_sidecar_replaces_the_set_and_exits_cleanly() {
    let stack = Devstack::start();
    let volume = stack.pod("media-sports", "web-r", "10.1.0.31").await;
    node::sia_init(&stack.info, &volume).await.unwrap();
    let first = identity::check(&volume.credentials_dir).unwrap();
    let logs = stack.dir.path().join("state/logs");
    let mut sidecar = node::sia_refresh(&stack.info, &volume, "1s", &logs, &[])
        .await
        .unwrap();
    let second = wait_new_serial(&volume, &first.serial, Duration::from_secs(30)).await;
    let _third = wait_new_serial(&volume, &second, Duration::from_secs(30)).await;
    openssl_verifies(&stack.info, &volume);
    sidecar.stop().await;
    assert!(sidecar.wait_exit(Duration::from_secs(5)).await.unwrap());
    node::unmount(&stack.info, &volume).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pod_is_refused_a_refresh_and_unmounts_cleanly() {
    let stack = Devstack::start();
    assert_eq!(stack.info.key_source, KeySource::Pod, "the default");
    a_deleted_pod_is_refused_a_refresh(&stack).await;
}

/// The refusals between pods, nodes and deleted pods hold with agent-made keys too (the
/// default, pod-made keys, is checked by the tests above and below; between pods:
/// harness/e2e/tests/node/peer_binding.rs, in both modes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_hold_with_agent_made_keys() {
    let stack = Devstack::start_with(&["--nodes", "2", "--key-source", "agent"]);
    assert_eq!(stack.info.key_source, KeySource::Agent);
    a_node_obtains_identities_only_for_its_own_pods_in(&stack).await;
    a_deleted_pod_is_refused_a_refresh(&stack).await;
}

async fn a_deleted_pod_is_refused_a_refresh(stack: &Devstack) {
    let volume = stack.pod("finance-ledger", "ledger-0", "10.1.0.41").await;
    node::sia_init(&stack.info, &volume).await.unwrap();
    // while it exists, a refresh works
    refresh_directly(&stack.info, &volume).await.unwrap();
    stack
        .kube
        .delete_pod("finance-ledger", "ledger-0")
        .await
        .unwrap();
    let refusal = refresh_directly(&stack.info, &volume).await.unwrap_err();
    assert!(refusal.contains("403"), "{refusal}");
    assert!(refusal.contains("pod_exists"), "{refusal}");
    node::unmount(&stack.info, &volume).await.unwrap();
    assert!(!volume.mount_dir.exists());
    assert_eq!(count_volumes(&stack.info.volumes_dir).unwrap(), 0);
    // the agent's own directory is untouched by the unmount
    assert!(stack.info.agent.socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sia_init_retries_while_the_agent_restarts() {
    let stack = Devstack::start();
    let volume = stack.pod("media-sports", "web-a", "10.1.0.51").await;
    let agent = stack.pid("agent");
    // The agent dies just as the pod starts; the devstack restarts it as kubelet would.
    kill(agent, Signal::SIGKILL).unwrap();
    node::sia_init(&stack.info, &volume).await.unwrap();
    openssl_verifies(&stack.info, &volume);
    assert_ne!(stack.pid("agent"), agent, "the agent was restarted");
    node::unmount(&stack.info, &volume).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zts_outage_keeps_the_files_and_refresh_recovers() {
    let stack = Devstack::start();
    let volume = stack.pod("media-sports", "web-z", "10.1.0.61").await;
    node::sia_init(&stack.info, &volume).await.unwrap();
    let before = identity::check(&volume.credentials_dir).unwrap();
    let cert_before = std::fs::read(volume.credentials_dir.join("service.cert.pem")).unwrap();

    // ZTS stops answering (frozen: connections hang until the agent's timeout).
    let zts = stack.pid("zts");
    kill(zts, Signal::SIGSTOP).unwrap();
    let logs = stack.dir.path().join("state/logs");
    let mut sidecar = node::sia_refresh(&stack.info, &volume, "1s", &logs, &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    sidecar.check_alive().unwrap();
    let during = identity::check(&volume.credentials_dir).unwrap();
    assert_eq!(
        during.serial, before.serial,
        "nothing was issued during the outage"
    );
    assert_eq!(
        std::fs::read(volume.credentials_dir.join("service.cert.pem")).unwrap(),
        cert_before,
        "the files were kept"
    );
    let log = std::fs::read_to_string(sidecar.log_path()).unwrap();
    assert!(log.contains("keeping the current files"), "{log}");

    kill(zts, Signal::SIGCONT).unwrap();
    wait_new_serial(&volume, &before.serial, Duration::from_secs(60)).await;
    openssl_verifies(&stack.info, &volume);
    sidecar.stop().await;
    node::unmount(&stack.info, &volume).await.unwrap();
}

/// stack.json is the contract of docs/design.md §5: its precise points (docs/development.md,
/// "Local stack") hold, and its three credentials are what they say — ZTS's is served by the
/// callback, the node's by the jwt-service, the stranger's by neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_json_is_the_contract() {
    let stack = Devstack::start();
    let info = &stack.info;
    assert!(info.zts.url.starts_with("https://127.0.0.1:") && info.zts.url.ends_with("/zts/v1"));
    assert!(
        !info
            .callback
            .url
            .trim_start_matches("https://")
            .contains('/')
    );
    assert!(info.callback.base_path.starts_with('/'));
    assert!(info.agent.metrics_url.ends_with("/metrics"));
    assert!(!info.dns_suffix.starts_with('.'));
    assert!(info.kube_api.url.starts_with("http://127.0.0.1:"));
    assert!(info.kubelet.url.starts_with("http://127.0.0.1:"));
    // root with runc installed (CI installs it): these end-to-end tests run every pod's SIA
    // as a container of a real runtime, not as our stand-in's process
    assert_eq!(
        info.runtime.kind,
        athenz_testbed::runtime::RuntimeKind::Runc,
        "{}",
        info.runtime.reason
    );
    let state = stack.dir.path().join("state").canonicalize().unwrap();
    assert!(info.runtime.state_dir.as_ref().unwrap().starts_with(&state));
    for path in [
        &info.volumes_dir,
        &info.agent_dir,
        &info.agent.socket,
        &info.jwt_public_keys_dir,
        &info.zts.ca,
        &info.credentials.zts.cert,
        &info.credentials.node.key,
        &info.credentials.stranger.cert,
    ] {
        assert!(
            path.starts_with(&state),
            "{} is outside the state dir",
            path.display()
        );
        assert!(path.exists(), "{}", path.display());
    }
    let metrics = reqwest::get(&info.agent.metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("athenz_agent_"), "{metrics}");

    // nodes: the first is the node the fields above describe; its agent pod is in the API on it
    assert_eq!(info.nodes.len(), 1);
    let first = &info.nodes[0];
    assert_eq!(first.name, info.node_name);
    assert_eq!(first.agent.socket, info.agent.socket);
    assert_eq!(first.agent.metrics_url, info.agent.metrics_url);
    assert_eq!(first.volumes_dir, info.volumes_dir);
    assert_eq!(first.credentials.cert, info.credentials.node.cert);
    assert_eq!(first.kubelet.url, info.kubelet.url);
    assert_eq!(info.node_attestation.audience, "athenz-node");
    assert_eq!(first.agent.pod.namespace, info.node_attestation.namespace);
    let pod: serde_json::Value = reqwest::get(format!(
        "{}/api/v1/namespaces/{}/pods/{}",
        info.kube_api.url, first.agent.pod.namespace, first.agent.pod.name
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(pod["metadata"]["uid"], first.agent.pod.uid);
    assert_eq!(pod["spec"]["nodeName"], first.name);
    assert_eq!(
        pod["spec"]["serviceAccountName"],
        info.node_attestation.service_account
    );
    // as root with a writable cgroup hierarchy, the stack enforces the peer check
    assert_eq!(info.peer_check, athenz_core::peer::PeerCheck::Enforce);
    assert!(info.pod_cgroup_root.as_ref().unwrap().is_dir());

    // Each credential as a client of the stack's mutual-TLS servers.
    let client = |who: &athenz_devstack::stack::Credential| {
        let mut pem = std::fs::read(&who.cert).unwrap();
        pem.extend(std::fs::read(&who.key).unwrap());
        reqwest::Client::builder()
            .tls_certs_only([
                reqwest::Certificate::from_pem(&std::fs::read(&who.ca).unwrap()).unwrap(),
            ])
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .build()
            .unwrap()
    };
    let status = |client: reqwest::Client, url: String| async move {
        match client.post(url).body("{}").send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0, // refused in the handshake
        }
    };
    let callback = format!("{}{}/instance", info.callback.url, info.callback.base_path);
    let jwt = format!("{}/v1/jwt", info.jwt_service.url);
    let c = &info.credentials;
    // allowed callers get past TLS and the allow-list to the body check
    assert_eq!(status(client(&c.zts), callback.clone()).await, 400);
    assert_eq!(status(client(&c.node), jwt.clone()).await, 400);
    // everyone else is refused
    for (who, url) in [
        (&c.stranger, callback.clone()),
        (&c.stranger, jwt.clone()),
        (&c.node, callback),
        (&c.zts, jwt),
    ] {
        let code = status(client(who), url.clone()).await;
        assert!(
            code == 403 || code == 0,
            "{} got {code} from {url}",
            who.cert.display()
        );
    }
}

/// docs/design.md §4.9, §6: with two nodes, node 2 — through its agent's socket, or with its own
/// certificate used directly against the jwt-service and ZTS — obtains no identity for a pod
/// scheduled on node 1, nor refreshes one; a JWT node 1 asked for cannot serve a pod on node 2;
/// and each node still serves its own pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_obtains_identities_only_for_its_own_pods() {
    let stack = Devstack::start_with(&["--nodes", "2"]);
    assert_eq!(stack.info.key_source, KeySource::Pod, "the default");
    a_node_obtains_identities_only_for_its_own_pods_in(&stack).await;
}

async fn a_node_obtains_identities_only_for_its_own_pods_in(stack: &Devstack) {
    let info = &stack.info;
    assert_eq!(info.nodes.len(), 2);
    let (n1, n2) = (&info.nodes[0], &info.nodes[1]);
    assert_eq!(n1.name, info.node_name);
    assert_ne!(n1.agent.socket, n2.agent.socket);
    // each node's identity is its own: its node in the instance-id URI
    for n in [n1, n2] {
        let cert =
            CertInfo::from_pem(&std::fs::read_to_string(&n.credentials.cert).unwrap()).unwrap();
        assert_eq!(cert.common_name, info.node_attestation.principal);
        assert!(
            cert.uris.contains(&athenz_core::names::instance_id_uri(
                &info.provider,
                &n.name
            )),
            "{:?}",
            cert.uris
        );
    }

    // a pod on node 1, issued through node 1
    let on_1 = stack.pod("media-sports", "web-n1", "10.1.0.81").await;
    node::sia_init(info, &on_1).await.unwrap();
    openssl_verifies(info, &on_1);

    // each node serves its own: a pod on node 2 through node 2's driver and agent
    let pod = NewPod {
        namespace: "media-sports".into(),
        name: "web-n2".into(),
        service_account: "web".into(),
        ip: "10.1.0.82".into(),
    };
    let uid = stack.kube.create_running_pod(&pod, &n2.name).await.unwrap();
    let root_2 = stack.dir.path().join("kubelet-node-2");
    let on_2 = node::mount_on(info, &NodeDirs::of(n2), &root_2, &pod, &uid)
        .await
        .unwrap();
    node::sia_init(info, &on_2).await.unwrap();
    assert_eq!(
        openssl_verifies(info, &on_2).uris[1],
        athenz_core::names::instance_id_uri(&info.provider, &uid)
    );

    // node 2's socket: node 1's pod's volume mounted on node 2 is refused by node 2's agent
    let stolen_root = stack.dir.path().join("kubelet-node-2-stolen");
    let stolen = node::mount_on(info, &NodeDirs::of(n2), &stolen_root, &on_1.pod, &on_1.uid)
        .await
        .unwrap();
    let err = node::sia_init(info, &stolen).await.unwrap_err().to_string();
    assert!(
        err.contains("403") && err.contains("not on this node"),
        "{err}"
    );
    node::unmount(info, &stolen).await.unwrap();

    // node 2's certificate used directly: a JWT (naming node 2) and a registration → pod_node
    let subject_1 = crossnode::subject_of(info, &on_1.pod, &on_1.uid).unwrap();
    let refusal = crossnode::register_with_node_certificate(info, n2, &subject_1)
        .await
        .unwrap();
    assert!(
        refusal.contains("403") && refusal.contains("pod_node"),
        "{refusal}"
    );
    // nor a refresh, even presenting the pod's own certificate and key
    let refusal =
        crossnode::refresh_with_node_certificate(info, n2, &subject_1, &on_1.credentials_dir)
            .await
            .unwrap();
    assert!(
        refusal.contains("403") && refusal.contains("pod_node"),
        "{refusal}"
    );
    // a JWT node 1 asked for does not serve a pod on node 2
    let subject_2 = crossnode::subject_of(info, &pod, &uid).unwrap();
    let refusal = crossnode::register_with_node_certificate(info, n1, &subject_2)
        .await
        .unwrap();
    assert!(refusal.contains("pod_node"), "{refusal}");

    // and the pods' own refreshes still work, each through its node
    refresh_directly(info, &on_1).await.unwrap();
    refresh_directly(info, &on_2).await.unwrap();
    node::unmount(info, &on_1).await.unwrap();
    node::unmount(info, &on_2).await.unwrap();
}
