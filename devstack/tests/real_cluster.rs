//! Our release on a real node (DESIGN.md 5.1): `cluster up` installs it as an operator does
//! (the image from `deploy/image.sh` imported, `kubectl apply -k deploy/overlays/local`), and the
//! real kubelet and API server judge the driver, CSI, webhook, RBAC, tokens and manifests:
//!
//! - the four workloads run from the image, Ready;
//! - pods in flex (webhook, two namespaces), csi-socket and csi-files mode read a certificate
//!   naming their pod, verified to the ZTS CA ([`Scenario::run_all`]);
//! - a terminating pod's SIA is refused; the webhook down stops pod creation in opted-in
//!   namespaces only (failurePolicy Fail, as documented); the agent deleted while a pod waits
//!   for its identity is restarted by its DaemonSet and the pod still gets it.
//!
//! Needs root, `tests/kube/build.sh`'s binaries, buildah, cargo-auditable (the image) and the
//! node's tools; it fails naming what is missing, never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::install::{NAMESPACE, WORKLOADS};
use athenz_devstack::cluster::scenario::{Mode, Scenario, Workload};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::cluster::{require_prerequisites, start_cluster};

/// Builds the release image as CI and operators do: `deploy/image.sh` (warm: seconds).
fn build_image() -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(repo.join("deploy/image.sh"))
        .current_dir(&repo)
        .output()
        .expect("deploy/image.sh");
    assert!(
        out.status.success(),
        "deploy/image.sh failed (it needs buildah, binutils and cargo-auditable: tests/setup \
         installs them): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = repo.join(format!(
        "target/image/athenz-k8s-identity-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    assert!(archive.is_file(), "{} was not written", archive.display());
    archive
}

#[test]
fn our_release_on_a_real_node_gives_every_pod_its_identity_and_refuses_what_it_must() {
    require_prerequisites();
    let archive = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-real-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    let archive_arg = archive.display().to_string();
    let (guard, info) = start_cluster(
        &state_dir,
        &["--image-archive", &archive_arg],
        Duration::from_secs(600),
    );
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().expect("cluster.json names the dev ZTS");
    let image = info.image.clone().expect("cluster.json names the image");
    assert_eq!(
        image, "ghcr.io/athenz-k8s-identity/athenz-k8s-identity:0.1.0",
        "the overlay keeps deploy/base's image name"
    );
    assert!(
        info.overlay
            .as_ref()
            .unwrap()
            .ends_with("athenz/deploy/overlays/local")
    );
    let scenario = Scenario::new(&layout, &zts.ca);
    let kubectl = scenario.kubectl();

    // the four workloads, Running and Ready, from the image
    let pods = kubectl.get_json(&["pods", "-n", NAMESPACE]).unwrap();
    let pods = pods["items"].as_array().unwrap();
    for workload in WORKLOADS {
        let name = workload.split('/').nth(1).unwrap();
        let mine: Vec<_> = pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/name"].as_str() == Some(name))
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
    Scenario::import_app_image(&layout).unwrap();
    let started = Instant::now();
    let identities = scenario.run_all().unwrap();
    let modes = |mode: Mode| identities.iter().filter(|i| i.mode == mode).count();
    assert_eq!(
        modes(Mode::Flex),
        4,
        "two Deployments of two pods: {identities:#?}"
    );
    assert_eq!(modes(Mode::CsiSocket), 1);
    assert_eq!(modes(Mode::CsiFiles), 1);
    let flex_namespaces: std::collections::BTreeSet<_> = identities
        .iter()
        .filter(|i| i.mode == Mode::Flex)
        .map(|i| i.namespace.clone())
        .collect();
    assert_eq!(
        flex_namespaces.len(),
        2,
        "the webhook served two namespaces"
    );
    for id in &identities {
        assert_eq!(id.ip_addresses, std::slice::from_ref(&id.pod_ip), "{id:#?}");
    }
    let scenario_seconds = started.elapsed().as_secs_f64();

    // a terminating pod's SIA is refused by the agent (the pod is being deleted)
    let doomed = Workload {
        namespace: "media-sports",
        service_account: "api",
        mode: Mode::Flex,
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

    // the webhook unavailable: pod creation in opted-in namespaces fails (failurePolicy Fail);
    // elsewhere it goes on
    kubectl
        .run(&[
            "-n",
            NAMESPACE,
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
            NAMESPACE,
            "scale",
            "deployment/athenz-initializer",
            "--replicas=2",
        ])
        .unwrap();
    kubectl
        .wait_rolled_out(
            NAMESPACE,
            "deployment/athenz-initializer",
            Duration::from_secs(120),
        )
        .unwrap();

    // the agent deleted while a new pod waits for its identity: its DaemonSet starts another,
    // and the pod's init container gets the identity from it
    let late = Workload {
        namespace: "news-feed",
        service_account: "late",
        mode: Mode::Flex,
    };
    kubectl
        .run(&[
            "-n",
            NAMESPACE,
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

    eprintln!(
        "real node: up with our release in {:.1} s; {} identities checked in {scenario_seconds:.1} s",
        guard.up_seconds,
        identities.len()
    );
    drop(guard);
}
