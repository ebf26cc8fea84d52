//! The faults `real_cluster` puts to the installed release, each on the running cluster: a
//! terminating pod, the webhook down, the agent deleted, a namespace claiming the admin domain,
//! containerd killed.

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::info::ClusterInfo;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use athenz_devstack::cluster::kubectl::Kubectl;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario, Workload};
use athenz_devstack::cluster::tenant_pods;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `kubectl run`s a pod `name` in `ns` that sleeps five seconds (the devstack's busybox, never
/// pulled), with `extra` flags; kubectl's output, or its refusal.
pub fn run_busybox(
    kubectl: &Kubectl,
    ns: &str,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<String> {
    let mut args = vec![
        "-n",
        ns,
        "run",
        name,
        "--image=localhost/athenz-devstack/busybox:1",
        "--image-pull-policy=Never",
        "--restart=Never",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--command", "--", "/bin/busybox", "sleep", "5"]);
    kubectl.run(&args)
}

/// A terminating pod's SIA is refused by the agent (the pod is being deleted); returns that pod.
pub fn a_terminating_pods_sia_is_refused(scenario: &Scenario, info: &ClusterInfo) -> String {
    let kubectl = scenario.kubectl();
    let doomed = Workload {
        namespace: "media-sports",
        service_account: "api",
        mode: VolumeMode::Flex,
        service: true,
    };
    let pod = scenario
        .pods_of(doomed.namespace, doomed.service_account)
        .unwrap()[0]
        .clone();
    kubectl
        .run(&[
            "-n",
            doomed.namespace,
            "delete",
            "pod",
            &pod,
            "--wait=false",
            "--grace-period=30",
        ])
        .unwrap();
    let refused = Command::new(info.kube_bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&info.kubeconfig)
        .args([
            "-n",
            doomed.namespace,
            "exec",
            &pod,
            "-c",
            "athenz-sia-refresh",
            "--",
        ])
        .args(["athenz-sia", "init"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        !refused.status.success(),
        "a terminating pod got an identity: {said}"
    );
    assert!(
        said.contains("403") && said.contains("being deleted"),
        "{said}"
    );
    pod
}

/// The webhook unavailable: pod creation in opted-in namespaces fails (failurePolicy Fail);
/// elsewhere it goes on. The webhook is scaled back up and rolled out before it returns.
pub fn the_webhook_down_stops_only_opted_in_namespaces(scenario: &Scenario) {
    let kubectl = scenario.kubectl();
    kubectl
        .run(&[
            "-n",
            CONTROL_NAMESPACE,
            "scale",
            "deployment/athenz-initializer",
            "--replicas=0",
        ])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        let attempt = run_busybox(kubectl, "news-feed", "while-down", &[]);
        match attempt {
            Err(e) => break format!("{e:#}"),
            Ok(_) => {
                // the endpoints had not gone yet: try again with the pod removed
                let _ = kubectl.run(&["-n", "news-feed", "delete", "pod", "while-down", "--wait"]);
                assert!(
                    Instant::now() < deadline,
                    "pods were admitted with the webhook down"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    };
    assert!(refusal.contains("initializer.athenz.io"), "{refusal}");
    scenario.ensure_namespace("shop-cart", false).unwrap();
    run_busybox(kubectl, "shop-cart", "elsewhere", &[])
        .expect("a namespace that did not opt in is not affected");
    kubectl
        .run(&[
            "-n",
            CONTROL_NAMESPACE,
            "scale",
            "deployment/athenz-initializer",
            "--replicas=2",
        ])
        .unwrap();
    kubectl
        .wait_rolled_out(
            CONTROL_NAMESPACE,
            "deployment/athenz-initializer",
            Duration::from_secs(120),
        )
        .unwrap();
}

/// The agent deleted while a new pod waits for its identity: its DaemonSet starts another, and
/// the pod's init container gets the identity from it.
pub fn the_agent_deleted_while_a_pod_waits_is_replaced(scenario: &Scenario) {
    let kubectl = scenario.kubectl();
    let late = Workload {
        namespace: "news-feed",
        service_account: "late",
        mode: VolumeMode::Flex,
        service: false,
    };
    kubectl
        .run(&[
            "-n",
            NODE_NAMESPACE,
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=athenz-agent",
            "--wait=false",
        ])
        .unwrap();
    let pods = scenario.deploy(&late).unwrap();
    for pod in &pods {
        scenario
            .check_identity(late.namespace, pod, late.mode)
            .unwrap();
    }
}

/// A namespace whose domain would fall in the admin domain (k8s-admin-evil -> k8s.admin.evil):
/// the agent refuses, and the SIA's init container says why in its log. Returns the namespace.
pub fn a_namespace_in_the_admin_domain_is_refused(scenario: &Scenario) -> &'static str {
    let kubectl = scenario.kubectl();
    let evil = "k8s-admin-evil";
    scenario.ensure_namespace(evil, true).unwrap();
    kubectl
        .apply_manifest(
            &format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: app, namespace: {evil}}}\n"
            ),
            "the service account",
        )
        .unwrap();
    let pod = scenario
        .pod_json(
            evil,
            "evil",
            "app",
            Some(VolumeMode::Flex),
            tenant_pods::app_container(),
        )
        .unwrap();
    kubectl
        .apply_manifest(&pod.to_string(), "pod k8s-admin-evil/evil")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut init_log = String::new();
    loop {
        let pod = kubectl.get_json(&["pod", "-n", evil, "evil"]).unwrap();
        let init = &pod["status"]["initContainerStatuses"][0];
        let failed = [
            &init["state"]["terminated"],
            &init["lastState"]["terminated"],
        ]
        .iter()
        .any(|t| t["exitCode"].as_i64().is_some_and(|c| c != 0));
        if failed {
            let mut args = vec!["-n", evil, "logs", "evil", "-c", "athenz-sia-init"];
            if init["state"]["terminated"].is_null() {
                // it is waiting to start again: the log of the run that failed
                args.push("--previous");
            }
            // The kubelet answers "unable to retrieve container logs" when the failed run's
            // container is already gone (it restarted again): read the next failed run's log
            init_log = kubectl.run(&args).unwrap();
            if init_log.contains("reserved for system namespaces") {
                break;
            }
        }
        assert_ne!(
            pod["status"]["phase"], "Running",
            "a pod of {evil} got an identity"
        );
        assert!(
            Instant::now() < deadline,
            "the init container never failed saying why: {init}; its last log: {init_log}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        init_log.contains("reserved for system namespaces"),
        "the refusal does not say why: {init_log}"
    );
    evil
}

/// containerd killed: the node's supervisor restarts it, running pods keep their identity and a
/// new pod gets one.
pub fn containerd_killed_is_restarted(scenario: &Scenario, info: &ClusterInfo, state_dir: &Path) {
    let containerd = info.pids["containerd"];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(containerd as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let after_restart = Workload {
        namespace: RESTRICTED_NAMESPACE,
        service_account: "after-restart",
        mode: VolumeMode::CsiFiles,
        service: false,
    };
    let pods = scenario.deploy(&after_restart).unwrap();
    scenario
        .check_identity(after_restart.namespace, &pods[0], after_restart.mode)
        .unwrap();
    let restarted = athenz_devstack::cluster::ClusterInfo::read(&state_dir.join("cluster.json"))
        .unwrap()
        .pids["containerd"];
    assert_ne!(restarted, containerd, "containerd was not restarted");
}
