//! Our release on a real node (docs/design.md §5.1): `cluster up` installs it as an operator does
//! (the image from `deploy/image.sh` imported, `kubectl apply -k deploy/overlays/local`), and the
//! real kubelet and API server judge the driver, CSI, webhook, RBAC, tokens and manifests:
//!
//! - the four workloads run from the image, Ready;
//! - pods in flex (webhook, two namespaces), csi-socket and csi-files mode read a certificate
//!   naming their pod, verified to the ZTS CA ([`Scenario::run_all`]);
//! - the sidecar refreshes a flex pod's certificate and the agent rotates a files-mode one;
//! - the API server's audit log shows the callback used exactly what its ClusterRole grants,
//!   no request of ours was refused, and the kubelet allowed the agent's token;
//! - a namespace that would map into the admin domain is refused, the SIA's log says why;
//! - containerd killed and restarted: a new pod still gets its identity;
//! - a pod with the identity volume but no webhook (csi-files, a namespace not opted in) gets
//!   its identity like any other: opting in is the webhook's convenience, Athenz's `launch`
//!   grant per domain is the control;
//! - a terminating pod's SIA is refused; the webhook down stops pod creation in opted-in
//!   namespaces only (failurePolicy Fail, as documented); the agent deleted while a pod waits
//!   for its identity is restarted by its DaemonSet and the pod still gets it.
//!
//! Needs root, `harness/real-node/kube/build.sh`'s binaries, buildah, cargo-auditable (the image) and the
//! node's tools; it fails naming what is missing, never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::control_plane::AUDIT_LOG;
use athenz_devstack::cluster::install::{self, CONTROL_NAMESPACE, NODE_NAMESPACE, WORKLOADS};
use athenz_devstack::cluster::runbook;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario, Workload};
use athenz_devstack::cluster::tenant_pods;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::cluster::{require_prerequisites, start_cluster};
use common::previous_release::PreviousRelease;
use common::real_node::{
    access, audit_events, callback_pod_reads, check_metrics_reference, granted,
    uninstall_as_documented, webhook_ca_bundle,
};
use common::release::{build_image, check_features, rotate_the_athenz_ca_and_check_new_pods};

/// One cluster per host (`cluster up` holds the node's lock): the tests here take turns.
static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn our_release_on_a_real_node_gives_every_pod_its_identity_and_refuses_what_it_must() {
    let _node = ONE_NODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    require_prerequisites();
    let archive = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-real-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    // the previous release (its image built from its own commit, its manifests, installed with
    // its steps); upgraded below to this one's as docs/operating.md says
    let previous = PreviousRelease::from_changelog();
    let previous_image = previous.image();
    let archive_arg = previous_image.display().to_string();
    let previous_deploy = previous.deploy.display().to_string();
    let previous_steps = previous.page.display().to_string();
    // three-minute certificates: the sidecar's refresh and the agent's files-mode rotation
    // come within the test
    let (guard, info) = start_cluster(
        &state_dir,
        &[
            "--image-archive",
            &archive_arg,
            "--cert-minutes",
            "3",
            "--deploy",
            &previous_deploy,
            "--steps",
            &previous_steps,
        ],
        Duration::from_secs(600),
    );
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().expect("cluster.json names the dev ZTS");
    let image = info.image.clone().expect("cluster.json names the image");
    assert_eq!(
        image,
        format!(
            "ghcr.io/athenz-k8s-identity/athenz-k8s-identity:{}",
            previous.version
        ),
        "the overlay keeps deploy/base's image name"
    );
    assert!(
        info.overlay
            .as_ref()
            .unwrap()
            .ends_with("athenz/checkout/deploy/overlays/local")
    );
    let scenario = Scenario::new(&layout, &zts.ca);
    let kubectl = scenario.kubectl();

    // a pod of the previous release, then the upgrade: this release's deploy/ under the same
    // overlay, this release's steps; the pod keeps its identity, new pods get theirs (below)
    Scenario::import_app_image(&layout).unwrap();
    // (no mode annotation: whatever the previous release's template injects by default, which
    // it allows whatever its allowedVolumes say; csi-socket from 0.2.0, flex before)
    let before_upgrade = Workload {
        namespace: "news-feed",
        service_account: "before-upgrade",
        mode: VolumeMode::CsiSocket,
        service: false,
    };
    let old_pods = scenario.deploy(&before_upgrade).unwrap();
    // this release's image, as an operator pushes it before applying the new manifests
    athenz_devstack::cluster::images::import(&layout, &archive).unwrap();
    install::upgrade(
        install::Installer::Kustomize,
        kubectl,
        &install::checkout_dir(&layout.athenz),
        &athenz_testbed::bins::repo_root().join("deploy"),
        &zts.url,
        &zts.ca,
        &install::operator_keys_dir(&layout.athenz),
    )
    .unwrap_or_else(|e| panic!("upgrading from {}: {e:#}", previous.commit));
    for (namespace, workload) in WORKLOADS {
        kubectl
            .wait_rolled_out(namespace, workload, Duration::from_secs(180))
            .unwrap();
    }
    for pod in &old_pods {
        scenario
            .check_identity(before_upgrade.namespace, pod, before_upgrade.mode)
            .unwrap();
    }
    eprintln!("upgraded from {} (its deploy/ and steps)", previous.commit);

    // the four workloads, Running and Ready, from this release's image
    let image = athenz_devstack::cluster::images::archive_reference(&archive).unwrap();
    for (namespace, workload) in WORKLOADS {
        let pods = kubectl.get_json(&["pods", "-n", namespace]).unwrap();
        let pods = pods["items"].as_array().unwrap();
        let name = workload.split('/').nth(1).unwrap();
        let mine: Vec<_> = pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/name"].as_str() == Some(name))
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        assert!(!mine.is_empty(), "no pod of {workload}");
        for pod in mine {
            assert_eq!(pod["status"]["phase"], "Running", "{workload}: {pod}");
            for c in pod["status"]["containerStatuses"].as_array().unwrap() {
                assert_eq!(c["ready"], true, "{workload}: {c}");
                assert!(
                    c["image"].as_str().unwrap().ends_with(&image)
                        || c["image"].as_str().unwrap() == image,
                    "{workload} runs {} instead of {image}",
                    c["image"]
                );
            }
        }
    }

    // every mode, through the real kubelet and API server
    let started = Instant::now();
    let outcome = scenario.run_all().unwrap();
    let identities = outcome.identities.clone();
    let modes = |mode: VolumeMode| identities.iter().filter(|i| i.mode == mode).count();
    // flex only once the operator allowed it (a template change the initializer picked up with
    // no restart, pods admitted throughout: run_all's allow_volume)
    assert_eq!(
        modes(VolumeMode::Flex),
        2,
        "a Deployment of two pods asking for flex: {identities:#?}"
    );
    // the template's default, csi-socket: a Deployment of two pods with no annotation, one pod
    // naming it and the features pod, both under Pod Security "restricted"
    assert_eq!(modes(VolumeMode::CsiSocket), 4, "{identities:#?}");
    assert_eq!(modes(VolumeMode::CsiFiles), 1);
    for id in identities.iter().filter(|i| i.mode == VolumeMode::CsiFiles) {
        assert_eq!(id.namespace, RESTRICTED_NAMESPACE, "{id:#?}");
    }
    check_features(&outcome.features);
    rotate_the_athenz_ca_and_check_new_pods(&scenario);
    let enforced = kubectl
        .get_json(&["namespace", RESTRICTED_NAMESPACE])
        .unwrap();
    assert_eq!(
        enforced["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    // ... which does enforce it: a flex pod there is refused by Pod Security, naming the volume
    let flex_there = kubectl.run(&[
        "-n",
        RESTRICTED_NAMESPACE,
        "run",
        "flex-in-restricted",
        "--image=localhost/athenz-devstack/busybox:1",
        "--image-pull-policy=Never",
        "--restart=Never",
        "--annotations=athenz.io/volume=flex",
        "--command",
        "--",
        "/bin/busybox",
        "sleep",
        "5",
    ]);
    let refusal = format!(
        "{:#}",
        flex_there.expect_err("a flex pod was admitted under restricted")
    );
    assert!(
        refusal.contains("violates PodSecurity") && refusal.contains("athenz-identity"),
        "{refusal}"
    );
    let injected_namespaces: std::collections::BTreeSet<_> = identities
        .iter()
        .filter(|i| i.mode != VolumeMode::CsiFiles)
        .map(|i| i.namespace.clone())
        .collect();
    assert_eq!(
        injected_namespaces.len(),
        3,
        "the webhook served three namespaces"
    );
    for id in &identities {
        // the webhook's files-mode volume leaves `ipSAN` at its default: one issuance, no IP
        let names_pod_ip = id.mode != VolumeMode::CsiFiles;
        let mut expected: Vec<String> = names_pod_ip
            .then(|| id.pod_ip.clone())
            .into_iter()
            .chain(id.service_ip.clone())
            .collect();
        let mut got = id.ip_addresses.clone();
        expected.sort();
        got.sort();
        assert_eq!(got, expected, "{id:#?}");
    }
    assert!(
        identities.iter().any(|i| i.service_ip.is_some()),
        "no pod had a Service: the callback's service check never ran"
    );
    let scenario_seconds = started.elapsed().as_secs_f64();

    // a terminating pod's SIA is refused by the agent (the pod is being deleted)
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
    let doomed_pod = pod.clone();
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

    // the webhook unavailable: pod creation in opted-in namespaces fails (failurePolicy Fail);
    // elsewhere it goes on
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
        let attempt = kubectl.run(&[
            "-n",
            "news-feed",
            "run",
            "while-down",
            "--image=localhost/athenz-devstack/busybox:1",
            "--image-pull-policy=Never",
            "--restart=Never",
            "--command",
            "--",
            "/bin/busybox",
            "sleep",
            "5",
        ]);
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
    kubectl
        .run(&[
            "-n",
            "shop-cart",
            "run",
            "elsewhere",
            "--image=localhost/athenz-devstack/busybox:1",
            "--image-pull-policy=Never",
            "--restart=Never",
            "--command",
            "--",
            "/bin/busybox",
            "sleep",
            "5",
        ])
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

    // the agent deleted while a new pod waits for its identity: its DaemonSet starts another,
    // and the pod's init container gets the identity from it
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

    // a namespace whose domain would fall in the admin domain (k8s-admin-evil -> k8s.admin.evil):
    // the agent refuses, and the SIA's init container says why in its log
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

    // containerd killed: the node's supervisor restarts it, running pods keep their identity
    // and a new pod gets one
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

    // the sidecar refreshes a flex and a csi-socket pod's certificate (the flex Deployment's
    // pods but the one deleted above), the agent rotates a files-mode volume's
    let refreshed_at = Instant::now();
    for before in identities.iter().filter(|i| {
        (["media-sports", "news-feed"].contains(&i.namespace.as_str()) && i.pod != doomed_pod)
            || i.mode == VolumeMode::CsiFiles
    }) {
        loop {
            let now = scenario
                .check_identity(&before.namespace, &before.pod, before.mode)
                .unwrap();
            if now.serial != before.serial {
                break;
            }
            assert!(
                refreshed_at.elapsed() < Duration::from_secs(300),
                "{}/{} kept serial {} past its refresh time",
                before.namespace,
                before.pod,
                before.serial
            );
            std::thread::sleep(Duration::from_secs(5));
        }
    }

    // the real API server's audit log: our service accounts used exactly what deploy/ grants
    // them (a missing grant is a 403 here; an unused one is an extra), and the kubelet let the
    // agent read its /pods
    let audit = audit_events(&state_dir.join("logs").join(AUDIT_LOG));
    let callback_user = format!("system:serviceaccount:{CONTROL_NAMESPACE}:athenz-callback");
    let mut used = std::collections::BTreeSet::new();
    let mut non_resource = std::collections::BTreeSet::new();
    for event in &audit {
        let user = event["user"]["username"].as_str().unwrap_or_default();
        let ours = [NODE_NAMESPACE, CONTROL_NAMESPACE]
            .iter()
            .any(|ns| user.starts_with(&format!("system:serviceaccount:{ns}:")));
        if ours {
            assert_ne!(event["responseStatus"]["code"], 403, "refused: {event}");
        }
        if user == callback_user {
            if event["objectRef"].is_null() {
                // a non-resource URL (discovery, /version): every authenticated user may
                non_resource.insert(format!(
                    "{} {}",
                    event["verb"].as_str().unwrap_or(""),
                    event["requestURI"].as_str().unwrap_or("")
                ));
            } else {
                used.insert(access(event));
            }
        }
    }
    let callback_granted = granted(kubectl, "athenz-callback");
    assert_eq!(
        used, callback_granted,
        "the callback's use of the API (left) against its ClusterRole (right)"
    );
    let agent_user = format!("system:serviceaccount:{NODE_NAMESPACE}:athenz-agent");
    let kubelet_checks: Vec<_> = audit
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "subjectaccessreviews")
        .filter(|e| e["requestObject"]["spec"]["user"] == agent_user.as_str())
        .map(|e| {
            let attrs = &e["responseObject"]["spec"]["resourceAttributes"];
            (
                format!(
                    "{}/{}",
                    attrs["resource"].as_str().unwrap_or(""),
                    attrs["subresource"].as_str().unwrap_or("")
                ),
                e["responseObject"]["status"]["allowed"] == true,
            )
        })
        .collect();
    assert!(
        kubelet_checks.iter().any(|(_, allowed)| *allowed),
        "the kubelet never allowed the agent's token: {kubelet_checks:?}"
    );
    // fine-grained kubelet authorization: the kubelet asks for nodes/pods first and, allowed,
    // never for nodes/proxy; the agent's ClusterRole is exactly what the kubelet asked
    let asked: std::collections::BTreeSet<String> = kubelet_checks
        .iter()
        .map(|(resource, allowed)| {
            assert!(
                allowed,
                "the kubelet refused the agent {resource}: {kubelet_checks:?}"
            );
            format!("get {resource}")
        })
        .collect();
    assert_eq!(
        asked,
        granted(kubectl, "athenz-agent"),
        "what the kubelet required of the agent (left) against its ClusterRole (right)"
    );
    eprintln!("the kubelet's checks of the agent's token: {kubelet_checks:?}");
    eprintln!(
        "the callback's API use: {used:?}; outside its ClusterRole, allowed to every authenticated user: {non_resource:?}"
    );

    // docs/operating.md's metrics reference is what each daemon serves
    check_metrics_reference(kubectl);

    // the callback's pod cache answered from the real API server's watch (the audit check
    // above saw it list and watch), and what it could not answer was read
    let reads = callback_pod_reads(kubectl);
    eprintln!("the callback's pod reads by source: {reads:?}");
    assert!(
        reads.get("cache").copied().unwrap_or(0) > 0,
        "no confirmation was answered from the pod cache: {reads:?}"
    );

    // the install's steps run again (what an upgrade under the same overlay does): nothing
    // changes, the webhook keeps its CA bundle and a new pod is admitted and gets its identity
    let bundle_before = webhook_ca_bundle(kubectl);
    install::run_install_steps(
        install::Installer::Kustomize,
        runbook::OPERATING,
        kubectl,
        &install::checkout_dir(&layout.athenz),
        &zts.url,
        &zts.ca,
        &install::operator_keys_dir(&layout.athenz),
    )
    .unwrap();
    assert_eq!(webhook_ca_bundle(kubectl), bundle_before);
    // (the steps put the base's template back: the template's default mode, csi-socket)
    let after_reapply = Workload {
        namespace: "news-feed",
        service_account: "after-reapply",
        mode: VolumeMode::CsiSocket,
        service: false,
    };
    let pods = scenario.deploy(&after_reapply).unwrap();
    for pod in &pods {
        scenario
            .check_identity(after_reapply.namespace, pod, VolumeMode::CsiSocket)
            .unwrap();
    }

    // uninstalled as documented: the tenants' pods first, then the page's steps; nothing of
    // ours is left in the cluster or on the node
    uninstall_as_documented(
        kubectl,
        install::Installer::Kustomize,
        &install::checkout_dir(&layout.athenz),
        &[
            "media-sports",
            "news-feed",
            RESTRICTED_NAMESPACE,
            "shop-cart",
            evil,
        ],
        &info.nodes,
    );

    eprintln!(
        "real node: up with our release in {:.1} s; {} identities checked in {scenario_seconds:.1} s",
        guard.up_seconds,
        identities.len()
    );
    drop(guard);
}
