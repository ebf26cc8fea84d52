//! The release as a new user meets it, on a real node of its own each: README.md's `cluster demo`
//! verbatim, and the Helm chart installed by docs/operating.md's "Install with Helm" steps (keys
//! through kubectl, never through Helm's values). Needs root and what `harness/setup` installs; it
//! fails naming what is missing, never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::install;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::cluster::{require_prerequisites, start_cluster};
use common::real_node::{check_metrics_reference, uninstall_as_documented};
use common::release::{build_image, check_features, check_no_key_in_helm_releases};

/// One cluster per host (`cluster up` holds the node's lock): the tests here take turns.
static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// README.md's real-node command, exactly as it shows it (`athenz-devstack cluster demo
/// --state-dir DIR`, the image from `deploy/image.sh`): exits 0, prints every mode's pods and
/// the features pod, says nothing of a teardown problem, and leaves nothing mounted.
#[test]
fn the_readmes_cluster_demo_exits_0_and_prints_its_identities() {
    let _node = ONE_NODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    require_prerequisites();
    build_image();
    let readme =
        std::fs::read_to_string(athenz_testbed::bins::repo_root().join("README.md")).unwrap();
    let shown = "athenz-devstack cluster demo --state-dir DIR";
    assert!(
        readme.contains(&format!("`{shown}`")),
        "README.md no longer shows {shown}"
    );
    let temp = tempfile::Builder::new()
        .prefix("athenz-demo-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    let args: Vec<String> = shown
        .split_whitespace()
        .skip(1)
        .map(|a| {
            if a == "DIR" {
                state_dir.display().to_string()
            } else {
                a.to_owned()
            }
        })
        .collect();
    let mut child = Command::new(&*common::DEVSTACK)
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // bounded: the demo's own waits are each bounded, this bounds their sum
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(1200) {
            let _ = child.kill();
            let _ = Command::new(&*common::DEVSTACK)
                .args(["cluster", "down", "--state-dir"])
                .arg(&state_dir)
                .status();
            panic!("cluster demo still running after 20 minutes");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        status.success(),
        "cluster demo: {status}\n{stdout}\n{stderr}"
    );
    for needle in [
        "flex ",
        "csi-socket ",
        "csi-files ",
        "role certificate bank.vault:role.auditors",
        "access token from its token server",
        "SDS served bank.vault.auditor",
        "verified to the ZTS CA",
    ] {
        assert!(
            stdout.contains(needle),
            "the demo did not print {needle:?}:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains("not entirely down") && !stderr.contains("not entirely down"),
        "{stdout}\n{stderr}"
    );
    let left = athenz_devstack::cluster::teardown::mounts_under(&[
        Path::new("/var/athenz"),
        Path::new("/var/lib/kubelet/pods"),
    ]);
    assert!(left.is_empty(), "left mounted: {left:?}");
    eprintln!(
        "cluster demo as README.md shows it: exit 0 in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The Helm chart, installed by docs/operating.md's "Install with Helm" steps on a cluster of
/// its own with three nodes: every mode's pods get their identities as with the kustomize
/// install, and the page's Helm uninstall, its node steps run on each node, leaves nothing on
/// any.
#[test]
fn the_helm_chart_installs_the_same_release() {
    let _node = ONE_NODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    require_prerequisites();
    let archive = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-helm-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    let archive_arg = archive.display().to_string();
    let (guard, info) = start_cluster(
        &state_dir,
        &[
            "--image-archive",
            &archive_arg,
            "--installer",
            "helm",
            "--nodes",
            "3",
        ],
        Duration::from_secs(600),
    );
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().expect("cluster.json names the dev ZTS");
    assert!(
        info.overlay
            .as_ref()
            .unwrap()
            .ends_with("checkout/deploy/helm/athenz-k8s-identity")
    );
    let scenario = Scenario::new(&layout, &zts.ca);
    let kubectl = scenario.kubectl();
    let releases = kubectl
        .run_script("helm list -A -o json", &state_dir, &[], "helm list")
        .unwrap();
    assert!(releases.contains("\"name\":\"athenz\""), "{releases}");
    Scenario::import_app_image(&layout).unwrap();
    let outcome = scenario.run_all().unwrap();
    let identities = outcome.identities;
    for mode in [
        VolumeMode::Flex,
        VolumeMode::CsiSocket,
        VolumeMode::CsiFiles,
    ] {
        assert!(
            identities.iter().any(|i| i.mode == mode),
            "no {mode:?} identity: {identities:#?}"
        );
    }
    check_features(&outcome.features);
    check_no_key_in_helm_releases(kubectl);
    check_metrics_reference(kubectl);
    uninstall_as_documented(
        kubectl,
        install::Installer::Helm,
        &install::checkout_dir(&layout.athenz),
        &["media-sports", "news-feed", RESTRICTED_NAMESPACE],
        &info.nodes,
    );
    eprintln!(
        "real node, Helm: up in {:.1} s; {} identities checked",
        guard.up_seconds,
        identities.len()
    );
    drop(guard);
}
