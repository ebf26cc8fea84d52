//! The per-node promise between real kubelets (docs/design.md §4.9, §6): on a cluster of three
//! real nodes (`cluster up --nodes 3`: the host's, and two in namespaces of their own, each with
//! its containerd, kubelet, kube-proxy and our agent), a node's agent vouches only for its own
//! pods, and nothing a node holds — its agent's socket and CSI driver, its service-account
//! tokens, its node certificate — obtains an identity for another node's pod. A drained node's
//! pods get identities again on the others; a lost node's pods, once deleted from the API, get
//! nothing more.
//!
//! Needs root, `harness/real-node/kube/build.sh`'s binaries and the image (`deploy/image.sh`);
//! fails naming what is missing, never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::info::ClusterInfo;
use athenz_devstack::cluster::install::CONTROL_NAMESPACE;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario};
use athenz_devstack::cluster::{Layout, teardown, tenant_pods};
use athenz_devstack::crossnode::DirectAccess;
use athenz_testbed::csi_kubelet::{CsiPod, KubeletCsi};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;
use common::DEVSTACK;
use common::cluster::{require_prerequisites, start_cluster};
use common::nodes::{agent_file, has_volume_of, kubelet_root, pods_on_every_node};
use common::release::build_image;
#[path = "real_cluster_nodes/tokens.rs"]
mod tokens;

/// The agents' node principal (deploy/base: `<admin domain>.athenz-agent`).
const AGENT_PRINCIPAL: &str = "k8s.admin.athenz-agent";
/// Where the agent's container holds its API token, its node token and its node certificate
/// (deploy/base/agent.yaml).
const API_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const NODE_TOKEN: &str = "/var/run/secrets/athenz/node-token/token";
const NODE_CERT: &str = "/var/run/athenz/node-identity/node.cert.pem";
const NODE_KEY: &str = "/var/run/athenz/node-identity/node.key.pem";

#[test]
fn each_node_vouches_only_for_its_own_pods_between_real_kubelets() {
    require_prerequisites();
    let archive = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-nodes-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    let archive_arg = archive.display().to_string();
    let (mut guard, info) = start_cluster(
        &state_dir,
        &["--image-archive", &archive_arg, "--nodes", "3"],
        Duration::from_secs(600),
    );
    eprintln!(
        "three nodes with our release up in {:.1} s",
        guard.up_seconds
    );
    assert_eq!(info.nodes.len(), 3, "cluster.json lists every node");
    assert!(info.nodes[0].namespaces.is_none() && info.nodes[1].namespaces.is_some());
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().expect("cluster.json names the dev ZTS");
    let scenario = Scenario::new(&layout, &zts.ca);
    Scenario::import_app_image(&layout).unwrap();
    // node A and node B: the two further nodes; the primary keeps the control plane company
    let (a, b) = (1, 2);

    // every node's agent issues its own pods' identities, in each CSI mode
    let pods = pods_on_every_node(&scenario, &info, "node");
    for (index, node) in info.nodes.iter().enumerate() {
        for (pod, mode) in &pods[index] {
            let identity = scenario
                .check_identity(RESTRICTED_NAMESPACE, pod, *mode)
                .unwrap();
            assert_eq!(identity.node, node.name);
            let uid = pod_uid(&scenario, pod);
            for other in 0..info.nodes.len() {
                assert_eq!(
                    has_volume_of(&state_dir, other, &uid),
                    other == index,
                    "pod {pod} (on {}) in node {}'s agent's volumes",
                    node.name,
                    info.nodes[other].name
                );
            }
        }
    }
    eprintln!("each of the 3 nodes' agents issued its own pods' identities, and only those");

    let (pod_on_a, _) = &pods[a][1];
    let pod_on_a_uid = pod_uid(&scenario, pod_on_a);
    csi_driver_of_b_refuses_a_pod_of_a(&state_dir, &info, b, pod_on_a, &pod_on_a_uid);
    tokens::tokens_of_b_reach_nothing_of_a(&info, a, b, &zts.ca);
    let access_b = direct_access(&scenario, &info, b, &zts.url, &zts.ca);
    let subject = subject_of(&scenario, RESTRICTED_NAMESPACE, pod_on_a);
    let refusal = tokio_run(access_b.register(&subject)).unwrap();
    eprintln!("node B's certificate, registering a pod of node A: {refusal}");
    let scheduled = format!(
        "pod_node: pod {RESTRICTED_NAMESPACE}/{pod_on_a} is scheduled on \\\"{}\\\", but the \
         identity was asked for by node {}",
        info.nodes[a].name, info.nodes[b].name
    );
    assert!(
        refusal.contains("ZTS refused (403)") && refusal.contains(&scheduled),
        "{refusal}"
    );

    drain_moves_pods_to_nodes_that_issue_them(&scenario, &info, a);
    lost_node_pods_get_nothing_more(&scenario, &state_dir, &info, b, &zts.url, &zts.ca);

    // down, as the guard would; nothing of any node is left
    let down = Command::new(&*DEVSTACK)
        .args(["cluster", "down", "--state-dir"])
        .arg(&state_dir)
        .output()
        .unwrap();
    assert!(
        down.status.success(),
        "cluster down: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    let _ = guard.up.take().map(|mut up| up.wait());
    let left = teardown::leftovers(&layout, true);
    assert!(left.is_empty(), "cluster down left: {left:?}");
}

/// Runs a future on a runtime of its own.
fn tokio_run<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// A pod's uid, from the API.
fn pod_uid(scenario: &Scenario, pod: &str) -> String {
    scenario
        .kubectl()
        .get_json(&["pod", "-n", RESTRICTED_NAMESPACE, pod])
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Node B's CSI driver (its socket, as node B's kubelet calls it) asked to mount an identity
/// for a pod running on node A: refused by ZTS's callback, naming node B.
fn csi_driver_of_b_refuses_a_pod_of_a(
    state_dir: &Path,
    info: &ClusterInfo,
    b: usize,
    pod_on_a: &str,
    uid: &str,
) {
    // the request as node B's kubelet sends it (paths under its /var/lib/kubelet), the volume
    // dir made where node B's kubelet would make it (its root, as the host sees it)
    let root = kubelet_root(state_dir, b);
    let socket = root.join("plugins/csi.athenz.io/csi.sock");
    let node_b = &info.nodes[b].name;
    let pod = CsiPod {
        namespace: RESTRICTED_NAMESPACE.to_owned(),
        name: pod_on_a.to_owned(),
        uid: uid.to_owned(),
        service_account: "node-files".to_owned(),
        fs_group: None,
    };
    let refused = tokio_run(async {
        let as_b_sees_it = Path::new(athenz_devstack::cluster::nodes::KUBELET_ROOT);
        let mut kubelet = KubeletCsi::connect(&socket, as_b_sees_it).await.unwrap();
        assert_eq!(
            kubelet.node_id(),
            node_b,
            "the driver on node B says it is B"
        );
        let request = kubelet.publish_request(&pod, &[("mode", "files")], false);
        let target = Path::new(&request.target_path);
        let dir_on_b = root.join(target.parent().unwrap().strip_prefix(as_b_sees_it).unwrap());
        std::fs::create_dir_all(&dir_on_b).unwrap();
        kubelet.raw_publish(request).await
    })
    .expect_err("node B's CSI driver mounted an identity for a pod of node A");
    let said = refused.to_string();
    eprintln!("node B's CSI driver, asked for a pod of node A: {said}");
    // kubelet's publish names the pod, so node B's agent reads no list and asks ZTS, whose
    // callback refuses: the pod is scheduled on A, and B's agent asked (docs/design.md §4.10)
    assert_eq!(
        refused.code(),
        Some(tonic::Code::PermissionDenied),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "pod_node: pod {RESTRICTED_NAMESPACE}/{pod_on_a} is scheduled on"
        )) && said.contains(&format!("but the identity was asked for by node {node_b}")),
        "{said}"
    );
}

/// Node `index`'s own certificate (from its agent's memory-backed node-identity volume) as a
/// client of the jwt-service (its Service reached at its ClusterIP) and ZTS.
fn direct_access(
    scenario: &Scenario,
    info: &ClusterInfo,
    index: usize,
    zts_url: &str,
    zts_ca: &Path,
) -> DirectAccess {
    let node = &info.nodes[index];
    let service = scenario
        .kubectl()
        .get_json(&["service", "-n", CONTROL_NAMESPACE, "athenz-jwt-service"])
        .unwrap();
    let cluster_ip: std::net::IpAddr = service["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let host = format!("athenz-jwt-service.{CONTROL_NAMESPACE}.svc");
    DirectAccess {
        node_name: node.name.clone(),
        jwt_service_url: format!("https://{host}:443"),
        jwt_service_address: Some((host, (cluster_ip, 443).into())),
        zts_url: zts_url.to_owned(),
        cas: athenz_core::crypto::pem_certificates(&std::fs::read_to_string(zts_ca).unwrap())
            .unwrap(),
        provider: "k8s.admin.athenz-callback".to_owned(),
        dns_suffix: "athenz.cloud".to_owned(),
        cert_pem: agent_file(node, NODE_CERT),
        key_pem: athenz_core::secret::Secret::new(agent_file(node, NODE_KEY)),
    }
}

/// The subject a pod's own node would attest for it.
fn subject_of(scenario: &Scenario, ns: &str, pod: &str) -> athenz_core::subject::PodSubject {
    let json = scenario
        .kubectl()
        .get_json(&["pod", "-n", ns, pod])
        .unwrap();
    athenz_core::subject::PodSubject::new(
        ns.to_owned(),
        pod.to_owned(),
        json["metadata"]["uid"].as_str().unwrap().to_owned(),
        ns.replace('-', "."),
        json["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_owned(),
        json["status"]["podIP"].as_str(),
    )
    .unwrap()
}

/// A Deployment whose pods prefer node `drained`, then `kubectl drain` of that node: the
/// replacements run on the other nodes and each gets its identity there.
fn drain_moves_pods_to_nodes_that_issue_them(
    scenario: &Scenario,
    info: &ClusterInfo,
    drained: usize,
) {
    let (ns, sa) = ("news-feed", "drained");
    let drained_name = &info.nodes[drained].name;
    scenario.ensure_namespace(ns, true).unwrap();
    scenario.ensure_service_account(ns, sa).unwrap();
    let mut deployment: serde_json::Value =
        serde_json::from_str(&tenant_pods::app_deployment(ns, sa, None)).unwrap();
    deployment["spec"]["template"]["spec"]["affinity"] = serde_json::json!({
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "preference": {"matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In", "values": [drained_name]
            }]}
        }]}
    });
    let kubectl = scenario.kubectl();
    kubectl
        .apply_manifest(&deployment.to_string(), "the drained deployment")
        .unwrap();
    kubectl
        .wait_rolled_out(ns, &format!("deployment/{sa}"), Duration::from_secs(180))
        .unwrap();
    let before = scenario.pods_of(ns, sa).unwrap();
    let on_drained = before
        .iter()
        .filter(|p| node_of(scenario, ns, p) == *drained_name)
        .count();
    assert!(on_drained > 0, "no pod of {sa} ran on {drained_name}");
    kubectl
        .run(&[
            "drain",
            drained_name,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            // the standalone pods pinned to the node above go with it
            "--force",
            "--timeout=180s",
        ])
        .unwrap();
    kubectl
        .wait_rolled_out(ns, &format!("deployment/{sa}"), Duration::from_secs(180))
        .unwrap();
    let after = scenario.pods_of(ns, sa).unwrap();
    for pod in &after {
        let identity = scenario
            .check_identity(ns, pod, VolumeMode::CsiSocket)
            .unwrap();
        assert_ne!(
            identity.node, *drained_name,
            "{pod} still on the drained node"
        );
    }
    eprintln!(
        "{drained_name} drained: {on_drained} pods moved; their replacements got identities on \
         the other nodes"
    );
    kubectl.run(&["uncordon", drained_name]).unwrap();
}

/// The node a pod runs on.
fn node_of(scenario: &Scenario, ns: &str, pod: &str) -> String {
    scenario
        .kubectl()
        .get_json(&["pod", "-n", ns, pod])
        .unwrap()["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Node `lost` lost (`cluster stop-node`: its kubelet, containerd and every container stop):
/// once its pods are deleted from the API, neither a refresh with a pod's own pair nor a
/// registration (with the lost node's certificate, or another node's) gets them anything.
/// A call to ZTS, answering with its refusal.
type Ask<'a> = dyn Fn() -> anyhow::Result<String> + 'a;

/// ZTS's answer to `ask`, asked again while it is a 504. The lost node's pods were just deleted,
/// CoreDNS's among them when one ran there: until kube-proxy drops its address, ZTS's lookup of
/// the callback's name may go to it and time out, and ZTS answers a provider it cannot reach
/// with 504. That says nothing about the pod, so it is asked again, at most 10 times a second
/// apart; the caller's assertion is on the first answer that is not a 504.
fn past_unreachable(
    what: &str,
    ask: impl Fn() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    for _ in 0..10 {
        let answer = ask()?;
        if !answer.contains("ZTS refused (504)") {
            return Ok(answer);
        }
        eprintln!("lost node's pod, deleted: {what}: provider unreachable, asked again: {answer}");
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    ask()
}

fn lost_node_pods_get_nothing_more(
    scenario: &Scenario,
    state_dir: &Path,
    info: &ClusterInfo,
    lost: usize,
    zts_url: &str,
    zts_ca: &Path,
) {
    let node = &info.nodes[lost];
    let pod = format!("node-files-{}", lost + 1);
    let subject = subject_of(scenario, RESTRICTED_NAMESPACE, &pod);
    // what the pod held, and what its node held, before the loss
    let cat = |file: &str| {
        scenario
            .kubectl()
            .run(&[
                "exec",
                "-n",
                RESTRICTED_NAMESPACE,
                &pod,
                "-c",
                "app",
                "--",
                "/bin/busybox",
                "cat",
                &format!("/var/run/athenz/{file}"),
            ])
            .unwrap()
    };
    let (pod_cert, pod_key) = (cat("service.cert.pem"), cat("service.key.pem"));
    let access_lost = direct_access(scenario, info, lost, zts_url, zts_ca);
    let access_other = direct_access(scenario, info, 0, zts_url, zts_ca);
    let stopped = Command::new(&*DEVSTACK)
        .args(["cluster", "stop-node", "--state-dir"])
        .arg(state_dir)
        .args(["--node", &node.name])
        .output()
        .unwrap();
    assert!(
        stopped.status.success(),
        "cluster stop-node: {}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&stopped.stdout).trim());
    let kubectl = scenario.kubectl();
    let listed = kubectl
        .get_json(&[
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={}", node.name),
        ])
        .unwrap();
    for item in listed["items"].as_array().unwrap() {
        let (ns, name) = (
            item["metadata"]["namespace"].as_str().unwrap(),
            item["metadata"]["name"].as_str().unwrap(),
        );
        kubectl
            .run(&[
                "delete",
                "pod",
                "-n",
                ns,
                name,
                "--force",
                "--grace-period=0",
            ])
            .unwrap();
    }
    let asks: [(&str, Box<Ask>); 4] = [
        (
            "a refresh with the pod's own pair and the lost node's certificate",
            Box::new(|| tokio_run(access_lost.refresh(&subject, &pod_cert, &pod_key))),
        ),
        (
            "a refresh with the pod's own pair and another node's certificate",
            Box::new(|| tokio_run(access_other.refresh(&subject, &pod_cert, &pod_key))),
        ),
        (
            "a registration with the lost node's certificate",
            Box::new(|| tokio_run(access_lost.register(&subject))),
        ),
        (
            "a registration with another node's certificate",
            Box::new(|| tokio_run(access_other.register(&subject))),
        ),
    ];
    for (what, ask) in asks {
        let refusal = past_unreachable(what, ask).unwrap_or_else(|e| panic!("{what}: {e:#}"));
        eprintln!("lost node's pod, deleted: {what}: {refusal}");
        let gone = format!("pod_exists: pod {RESTRICTED_NAMESPACE}/{pod} does not exist");
        assert!(
            refusal.contains("ZTS refused (403)") && refusal.contains(&gone),
            "{what}: {refusal}"
        );
    }
}
