//! The CSI community's conformance suite, csi-sanity (github.com/kubernetes-csi/csi-test, built
//! from its module by harness/real-node/kube/build.sh), against the agent's CSI socket in `athenz-devstack up
//! --volume csi-files`: every node and identity spec that applies to a node-only, ephemeral
//! driver, with 0 failures.
//!
//! The driver has no controller, so csi-sanity's "Controller Service" specs do not apply and are
//! skipped. Two node specs start from a created volume; `csi-sanity-controller` (our stand-in,
//! harness/real-node/csi-sanity/controller) creates it with the volume context kubelet passes for an inline
//! volume of a real pending pod, so the agent publishes a real identity for them.
//! (Broken on purpose: NodeGetVolumeStats answering INVALID_ARGUMENT for a path that names no
//! volume, as it did, gives "FAIL! -- 13 Passed | 2 Failed": "should fail when volume is not
//! found" and "... does not exist on the specified path".)
//!
//! Needs root (the driver mounts) and the `athenz-devstack` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Devstack, pending_pod};
use std::process::Command;

/// The specs that must have run and passed: the ones this driver got wrong before, and the
/// two that need the stand-in controller's volume.
const MUST_PASS: &[&str] = &[
    "NodeGetVolumeStats should fail when volume is not found",
    "NodeGetVolumeStats should fail when volume does not exist on the specified path",
    "NodeUnpublishVolume should remove target path",
    "NodePublishVolume should fail when no volume capability is provided",
    "Node Service NodeGetInfo should return appropriate values",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_passes_every_spec_that_applies() {
    let bin = athenz_devstack::cluster::default_kube_bin();
    let sanity = bin.join("csi-sanity");
    let controller_bin = bin.join("csi-sanity-controller");
    for tool in [&sanity, &controller_bin] {
        assert!(
            tool.exists(),
            "{} is missing: run harness/real-node/kube/build.sh (harness/setup does)",
            tool.display()
        );
    }
    let stack = Devstack::start_with(&["--volume", "csi-files"]);
    let (_pod, csi_pod) = pending_pod(&stack, "sanity").await;
    let work = tempfile::tempdir().unwrap();
    let controller_socket = work.path().join("controller.sock");
    let context = [
        ("mode", "files".to_owned()),
        ("csi.storage.k8s.io/ephemeral", "true".to_owned()),
        ("csi.storage.k8s.io/pod.name", csi_pod.name.clone()),
        (
            "csi.storage.k8s.io/pod.namespace",
            csi_pod.namespace.clone(),
        ),
        ("csi.storage.k8s.io/pod.uid", csi_pod.uid.clone()),
        (
            "csi.storage.k8s.io/serviceAccount.name",
            csi_pod.service_account.clone(),
        ),
    ];
    let mut controller = Command::new(&controller_bin);
    controller.arg("--endpoint").arg(&controller_socket);
    for (key, value) in &context {
        controller.arg("--context").arg(format!("{key}={value}"));
    }
    let mut controller = KillOnDrop(controller.spawn().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !controller_socket.exists() {
        assert!(
            controller.0.try_wait().unwrap().is_none(),
            "csi-sanity-controller exited"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "csi-sanity-controller did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let agent_socket = stack.info.nodes[0].agent.csi_socket.clone().unwrap();
    let report = work.path().join("junit.xml");
    let run = Command::new(&sanity)
        .arg(format!("--csi.endpoint=unix://{}", agent_socket.display()))
        .arg(format!(
            "--csi.controllerendpoint=unix://{}",
            controller_socket.display()
        ))
        .arg(format!(
            "--csi.mountdir={}",
            work.path().join("mount").display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            work.path().join("staging").display()
        ))
        .arg("--ginkgo.skip=Controller Service")
        .arg("--ginkgo.no-color")
        .arg(format!("--ginkgo.junit-report={}", report.display()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let summary = stdout
        .lines()
        .filter(|l| l.starts_with("Ran ") || l.contains("Passed |"))
        .collect::<Vec<_>>()
        .join("; ");
    println!("csi-sanity: {summary}");
    assert!(
        run.status.success(),
        "csi-sanity failed ({}): {stdout}\n{stderr}",
        run.status
    );

    // the verdicts, read from the suite's own report rather than trusted from its exit status
    let junit = std::fs::read_to_string(&report).unwrap();
    assert!(!junit.contains("<failure"), "{junit}");
    let cases = athenz_testbed::junit::cases(&junit);
    let passed: Vec<&str> = cases
        .iter()
        .filter(|case| case.passed())
        .map(|case| case.name.as_str())
        .collect();
    assert!(
        passed.len() >= 15,
        "only {} specs passed: {passed:?}",
        passed.len()
    );
    for spec in MUST_PASS {
        assert!(
            passed.iter().any(|name| name.contains(spec)),
            "{spec:?} did not run and pass; passed: {passed:?}"
        );
    }
    println!("csi-sanity: {} specs passed", passed.len());
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
