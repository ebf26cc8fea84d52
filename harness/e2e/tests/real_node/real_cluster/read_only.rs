//! A files-mode volume stays read-only to the pod whatever its spec says (docs/design.md §4.10):
//! the container runtime binds the volume into the container and remounts that bind read-write
//! when the mount says `readOnly: false`; only the tmpfs's own read-only superblock refuses the
//! write. Tried as a tenant would, with root in the container: create, change, remove.

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::scenario::{APP_IMAGE, BUSYBOX, CREDENTIALS, Scenario};
use std::time::Duration;

/// The namespace the pods run in (not opted in: a files-mode volume needs no webhook).
const NAMESPACE: &str = "shop-cart";

/// For `readOnly: false` and `true` (on the CSI volume and on the mount alike): a pod running as
/// root gets its identity, and can neither create, change nor remove anything in the volume.
pub fn a_files_volume_is_read_only_whatever_the_pod_spec_says(scenario: &Scenario) {
    let kubectl = scenario.kubectl();
    scenario.ensure_namespace(NAMESPACE, false).unwrap();
    scenario
        .ensure_service_account(NAMESPACE, "writer")
        .unwrap();
    for read_only in [false, true] {
        let name = format!("files-read-only-{read_only}");
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {athenz_core::volume_mode::INJECTED_LABEL: "csi-files"}},
            "spec": {
                "serviceAccountName": "writer",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app",
                    "image": APP_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": [BUSYBOX, "sleep", "3600"],
                    "securityContext": {"runAsUser": 0},
                    "volumeMounts": [{"name": "athenz-identity", "mountPath": CREDENTIALS,
                                      "readOnly": read_only}],
                }],
                "volumes": [{"name": "athenz-identity",
                             "csi": {"driver": "csi.athenz.io", "readOnly": read_only,
                                     "volumeAttributes": {"mode": "files"}}}],
            }
        });
        kubectl
            .apply_manifest(&pod.to_string(), &format!("pod {name}"))
            .unwrap();
        scenario
            .wait_pod_ready(NAMESPACE, &name, Duration::from_secs(120))
            .unwrap();
        scenario
            .check_identity(NAMESPACE, &name, VolumeMode::CsiFiles)
            .unwrap();
        let cert = format!("{CREDENTIALS}/service.cert.pem");
        for (what, script) in [
            ("create a file", format!("echo x > {CREDENTIALS}/planted")),
            (
                "create a directory",
                format!("mkdir {CREDENTIALS}/planted.d"),
            ),
            ("change the certificate", format!("echo x > {cert}")),
            ("append to the certificate", format!("echo x >> {cert}")),
            ("remove the certificate", format!("rm -f {cert}")),
            (
                "remove the current set's link",
                format!("rm -f {CREDENTIALS}/..data"),
            ),
            (
                "rename the certificate",
                format!("mv {cert} {CREDENTIALS}/moved.pem"),
            ),
            (
                "fill the volume",
                format!("dd if=/dev/zero of={CREDENTIALS}/fill bs=1k count=1"),
            ),
        ] {
            let refused = kubectl.run(&[
                "-n", NAMESPACE, "exec", &name, "-c", "app", "--", BUSYBOX, "sh", "-c", &script,
            ]);
            let said = format!(
                "{:#}",
                refused.expect_err(&format!(
                    "readOnly: {read_only}: the app could {what} in its files-mode volume"
                ))
            );
            assert!(
                said.contains("Read-only file system"),
                "readOnly: {read_only}: {what} failed, but not for the read-only volume: {said}"
            );
        }
        // nothing changed: the certificate still verifies (the agent may have rotated it
        // meanwhile, by its own write), nothing was planted
        scenario
            .check_identity(NAMESPACE, &name, VolumeMode::CsiFiles)
            .unwrap();
        let listing = kubectl
            .run(&[
                "-n",
                NAMESPACE,
                "exec",
                &name,
                "-c",
                "app",
                "--",
                BUSYBOX,
                "ls",
                "-a",
                CREDENTIALS,
            ])
            .unwrap();
        assert!(
            !listing.contains("planted") && !listing.contains("fill"),
            "readOnly: {read_only}: {listing}"
        );
        kubectl
            .run(&["-n", NAMESPACE, "delete", "pod", &name, "--wait=true"])
            .unwrap();
        eprintln!("a files-mode volume with readOnly: {read_only} refused every write of the app");
    }
}
