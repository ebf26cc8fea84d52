//! `athenz-devstack cluster up --bare` / `cluster down`: a real node from Kubernetes' own
//! modules runs pods from an image built here, they reach each other over the CNI bridge and a
//! Service through kube-proxy, the node authorizer scopes the agents' pod list to their node
//! (`--node-authorizer`), and `down` leaves no process, mount, cgroup, chain or device.
//!
//! Needs root, `harness/real-node/kube/build.sh`'s binaries and the node's tools (runc, iptables, conntrack,
//! containernetworking-plugins, buildah, gcc, busybox-static). It fails naming what is missing;
//! it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_devstack::cluster::images::{ImageSpec, build_and_import};
use athenz_devstack::cluster::{ClusterInfo, KUBE_VERSION, Layout, teardown};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
#[path = "cluster/node_authorizer.rs"]
mod node_authorizer;
use common::DEVSTACK;
use common::cluster::{BUSYBOX, require_prerequisites, start_cluster};

/// The test's image: Debian's static busybox.
const IMAGE: &str = "localhost/athenz-devstack/busybox:1";

/// `kubectl --kubeconfig <admin>` with `args`; its stdout, failing with its stderr.
fn kubectl(info: &ClusterInfo, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(info.kube_bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&info.kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pod as JSON.
fn pod(info: &ClusterInfo, name: &str) -> serde_json::Value {
    serde_json::from_str(&kubectl(info, &["get", "pod", name, "-o", "json"], None)).unwrap()
}

/// Waits up to `limit` for the pod's phase to be one of `phases`; returns the pod.
fn wait_phase(
    info: &ClusterInfo,
    name: &str,
    phases: &[&str],
    limit: Duration,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let pod = pod(info, name);
        if phases.contains(&pod["status"]["phase"].as_str().unwrap_or_default()) {
            return pod;
        }
        if started.elapsed() > limit {
            let events = kubectl(
                info,
                &[
                    "get",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={name}"),
                ],
                None,
            );
            panic!(
                "pod {name} not {phases:?} after {limit:?}: {}\nevents:\n{events}",
                pod["status"]
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A pod that fetches `url` once with busybox wget and exits.
fn client_pod(name: &str, url: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}"}},
  "spec": {{"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
    "containers": [{{"name": "get", "image": "{IMAGE}", "imagePullPolicy": "Never",
      "command": ["{BUSYBOX}", "timeout", "20", "{BUSYBOX}", "wget", "-q", "-O", "-", "{url}"]}}]}}}}"#
    )
}

/// Runs a client pod to completion and returns what it fetched.
fn fetch_from_pod(info: &ClusterInfo, name: &str, url: &str) -> String {
    kubectl(info, &["apply", "-f", "-"], Some(&client_pod(name, url)));
    let done = wait_phase(
        info,
        name,
        &["Succeeded", "Failed"],
        Duration::from_secs(90),
    );
    let logs = kubectl(info, &["logs", name], None);
    assert_eq!(
        done["status"]["phase"], "Succeeded",
        "{name} could not fetch {url}: {}; its output: {logs}",
        done["status"]["containerStatuses"]
    );
    logs
}

#[test]
fn a_real_node_runs_pods_that_reach_each_other_and_a_service_then_goes_down_clean() {
    require_prerequisites();
    let temp = tempfile::Builder::new()
        .prefix("athenz-cluster-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    // the API server's authorization as deploy/node-authorizer configures it (Node, the node
    // authorizer, RBAC): every check below runs under it, and node_authorizer's checks it
    let (mut guard, info) = start_cluster(
        &state_dir,
        &["--bare", "--node-authorizer"],
        Duration::from_secs(300),
    );
    let up_seconds = guard.up_seconds;
    assert_eq!(info.kubernetes_version, KUBE_VERSION);
    assert_eq!(info.pod_cidr, "10.244.0.0/24");
    let ready = kubectl(
        &info,
        &[
            "get",
            "node",
            &info.node_name,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
        ],
        None,
    );
    assert_eq!(ready, "True");

    // an image built here from a static binary, imported into the node's containerd
    let layout = Layout::existing(&state_dir).unwrap();
    let www = temp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let greeting = format!("hello from web {}", std::process::id());
    std::fs::write(www.join("index.html"), &greeting).unwrap();
    build_and_import(
        &layout,
        &ImageSpec {
            name: IMAGE.to_owned(),
            files: vec![
                (PathBuf::from(BUSYBOX), BUSYBOX.to_owned()),
                (www, "/www".to_owned()),
            ],
            entrypoint: vec![BUSYBOX.to_owned()],
        },
    )
    .unwrap();

    // a web server pod and a Service in front of it
    let web = format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
  {{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "web", "labels": {{"app": "web"}}}},
    "spec": {{"terminationGracePeriodSeconds": 0, "containers": [{{"name": "httpd",
      "image": "{IMAGE}", "imagePullPolicy": "Never",
      "command": ["{BUSYBOX}", "httpd", "-f", "-p", "8080", "-h", "/www"],
      "ports": [{{"containerPort": 8080}}]}}]}}}},
  {{"apiVersion": "v1", "kind": "Service", "metadata": {{"name": "web"}},
    "spec": {{"selector": {{"app": "web"}}, "ports": [{{"port": 80, "targetPort": 8080}}]}}}}]}}"#
    );
    let pod_started = Instant::now();
    kubectl(&info, &["apply", "-f", "-"], Some(&web));
    let running = wait_phase(&info, "web", &["Running"], Duration::from_secs(120));
    let pod_seconds = pod_started.elapsed().as_secs_f64();
    let pod_ip = running["status"]["podIP"].as_str().unwrap().to_owned();
    assert!(
        pod_ip.starts_with("10.244.0.") && pod_ip != "10.244.0.0" && pod_ip != "10.244.0.1",
        "pod IP {pod_ip} is not from the node's 10.244.0.0/24"
    );
    let uid = running["metadata"]["uid"].as_str().unwrap().to_owned();
    let pod_dir = Path::new(teardown::KUBELET_PODS).join(&uid);
    assert!(
        !teardown::mounts_under(&[&pod_dir]).is_empty(),
        "the kubelet mounted nothing for the pod under {}",
        pod_dir.display()
    );

    // another pod reaches it over the bridge, then through the Service's ClusterIP
    let direct = fetch_from_pod(
        &info,
        "client-direct",
        &format!("http://{pod_ip}:8080/index.html"),
    );
    assert_eq!(direct.trim(), greeting);
    let cluster_ip = kubectl(
        &info,
        &["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"],
        None,
    );
    assert!(cluster_ip.starts_with("10.96."), "{cluster_ip}");
    let via_service = fetch_from_pod(
        &info,
        "client-service",
        &format!("http://{cluster_ip}/index.html"),
    );
    assert_eq!(via_service.trim(), greeting);
    node_authorizer::check(&info, IMAGE, BUSYBOX, &|args, stdin| {
        kubectl(&info, args, stdin)
    });

    // down: nothing is left
    let down_started = Instant::now();
    let down = Command::new(&*DEVSTACK)
        .args(["cluster", "down", "--state-dir"])
        .arg(&state_dir)
        .output()
        .unwrap();
    let down_seconds = down_started.elapsed().as_secs_f64();
    assert!(
        down.status.success(),
        "cluster down failed: {}{}",
        String::from_utf8_lossy(&down.stdout),
        String::from_utf8_lossy(&down.stderr)
    );
    let mut up = guard.up.take().unwrap();
    let exited = Instant::now();
    let status = loop {
        if let Some(status) = up.try_wait().unwrap() {
            break status;
        }
        assert!(
            exited.elapsed() < Duration::from_secs(30),
            "cluster up still runs after cluster down"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let up_output = std::fs::read_to_string(state_dir.with_extension("log")).unwrap_or_default();
    assert!(status.success(), "cluster up ended {status}:\n{up_output}");
    for (name, pid) in &info.pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "{name} (pid {pid}) still runs"
        );
    }
    assert_eq!(teardown::leftovers(&layout, true), Vec::<String>::new());
    assert!(teardown::mounts_under(&[&state_dir, &pod_dir]).is_empty());
    assert!(!Path::new("/sys/class/net/cni0").exists(), "cni0 is left");
    let saved = Command::new("iptables-save").output().unwrap();
    let saved = String::from_utf8_lossy(&saved.stdout);
    assert!(
        !saved.contains(":KUBE-") && !saved.contains(":CNI-"),
        "iptables chains are left:\n{saved}"
    );
    eprintln!(
        "cluster up to Ready {up_seconds:.1} s; web pod Running {pod_seconds:.1} s after \
         apply; cluster down {down_seconds:.1} s"
    );
}
