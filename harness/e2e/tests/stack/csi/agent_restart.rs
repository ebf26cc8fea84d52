//! The agent restarting under files-mode volumes: found again and rotated, sealed again after
//! a graceful stop opened them, reported abnormal when it cannot replace an expired set.

use super::common::{Devstack, pending_pod};
use super::{kubelet, read_set, unpublish_leaves_nothing, wait_for};
use athenz_core::files::{CA_FILE, CERT_FILE, FileSet, KEY_FILE, NTOKEN_FILE};
use athenz_testbed::csi_kubelet::KubeletCsi;
use std::path::Path;
use std::time::Duration;

/// Waits until the stack has replaced the agent process `old` (it restarts whatever exited).
async fn wait_agent_replaced(stack: &Devstack, old: nix::unistd::Pid) {
    wait_for("the agent restarted", Duration::from_secs(20), async || {
        stack
            .current_info()
            .processes
            .get("agent")
            .is_some_and(|p| *p as i32 != old.as_raw())
    })
    .await;
}

/// The agent restarts: files-mode volumes are found again and rotation resumes; a volume whose
/// mounts were lost (as after a reboot) still unpublishes cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_resumes_rotation_and_lost_mounts_unpublish() {
    let stack = Devstack::start_with_env(
        &["--volume", "csi-files"],
        &[("CSI_REFRESH_INTERVAL", "1s")],
    );
    let mut kubelet = kubelet(&stack).await;
    let (pod, csi_pod) = pending_pod(&stack, "web-restart").await;
    stack.kube.report_running(pod, "10.1.7.9").await.unwrap();
    let volume = kubelet
        .publish(&csi_pod, &[("mode", "files")])
        .await
        .unwrap();
    let before = read_set(&volume.target).serial_hex;

    let agent = stack.pid("agent");
    nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_agent_replaced(&stack, agent).await;
    let target = volume.target.clone();
    wait_for(
        "a rotation after the restart",
        Duration::from_secs(20),
        async || read_set(&target).serial_hex != before,
    )
    .await;

    // a reboot-like loss of every mount: unpublish still succeeds and leaves nothing
    let mut kubelet = KubeletCsi::connect(
        stack.info.nodes[0].agent.csi_socket.as_ref().unwrap(),
        &stack.kubelet_root(),
    )
    .await
    .unwrap();
    let table = athenz_core::volume_mount::mountinfo::MountTable::read().unwrap();
    let mounts: Vec<_> = table
        .under(&stack.kubelet_root())
        .chain(table.under(&stack.info.volumes_dir))
        .map(Path::to_owned)
        .collect();
    for m in mounts.iter().rev() {
        nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;
}

/// A files-mode volume's tmpfs is sealed (read-only for every mount of it); an agent stopped
/// gracefully opens the seal for whichever release comes next (a rollback's does not know it),
/// and the next agent of this release seals it again as it resumes the volume and rotates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_agent_opens_its_seals_and_the_next_closes_them() {
    use athenz_core::volume_mount::seal::is_sealed;
    let stack = Devstack::start_with_env(
        &["--volume", "csi-files"],
        &[("CSI_REFRESH_INTERVAL", "1s")],
    );
    let mut kubelet = kubelet(&stack).await;
    let (pod, csi_pod) = pending_pod(&stack, "web-sealed").await;
    stack.kube.report_running(pod, "10.1.7.11").await.unwrap();
    let volume = kubelet
        .publish(&csi_pod, &[("mode", "files")])
        .await
        .unwrap();
    let files = std::fs::read_dir(&stack.info.volumes_dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("files"))
        .find(|p| p.is_dir())
        .expect("the volume's files dir");
    assert!(is_sealed(&files).unwrap(), "sealed once published");
    let target = volume.target.clone();
    let first = read_set(&target).serial_hex;
    wait_for("a rotation", Duration::from_secs(20), async || {
        read_set(&target).serial_hex != first
    })
    .await;
    assert!(is_sealed(&files).unwrap(), "sealed again after a rotation");

    let agent = stack.pid("agent");
    nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGTERM).unwrap();
    wait_agent_replaced(&stack, agent).await;
    let log = std::fs::read_to_string(stack.dir.path().join("state/logs/agent.log")).unwrap();
    // the log's fields are coloured: each escape sequence runs from ESC to its `m`
    let plain: String = log
        .split('\x1b')
        .enumerate()
        .map(|(i, part)| match part.split_once('m') {
            Some((_, rest)) if i > 0 => rest,
            _ => part,
        })
        .collect();
    assert!(
        plain
            .lines()
            .any(|l| l.contains("handed over: seals opened opened=1")),
        "the stopping agent opened the one volume's seal: {plain}"
    );
    wait_for(
        "the next agent sealed the volume it resumed",
        Duration::from_secs(20),
        async || is_sealed(&files).unwrap(),
    )
    .await;
    let resumed = read_set(&target).serial_hex;
    wait_for(
        "a rotation by the next agent",
        Duration::from_secs(20),
        async || read_set(&target).serial_hex != resumed,
    )
    .await;
    assert!(
        is_sealed(&files).unwrap(),
        "still sealed after its rotation"
    );
    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;
}

/// An expired certificate the agent cannot replace (ZTS unreachable) makes the volume abnormal,
/// with the reason, in the stats kubelet polls (it becomes a pod event). The set on disk is
/// replaced by an expired one while the agent is down; the restarted agent resumes from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_an_expired_certificate() {
    use nix::sys::signal::{Signal, kill};
    let stack = Devstack::start_with(&["--volume", "csi-files"]);
    let mut kubelet = kubelet(&stack).await;
    let (pod, csi_pod) = pending_pod(&stack, "web-expired").await;
    stack.kube.report_running(pod, "10.1.7.10").await.unwrap();
    let volume = kubelet
        .publish(&csi_pod, &[("mode", "files")])
        .await
        .unwrap();
    let healthy = kubelet.stats(&volume).await.unwrap();
    assert!(!healthy.volume_condition.unwrap().abnormal);

    // ZTS stops answering; the agent goes down and its volume's set is swapped for an expired
    // certificate of the same key (as if the node had been off past the certificate's life)
    let zts = stack.pid("zts");
    kill(zts, Signal::SIGSTOP).unwrap();
    let agent = stack.pid("agent");
    kill(agent, Signal::SIGKILL).unwrap();
    let files = std::fs::read_dir(&stack.info.volumes_dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("files"))
        .find(|p| p.is_dir())
        .expect("the volume's files dir");
    let set = FileSet::new(&files)
        .read(&[KEY_FILE, CA_FILE, NTOKEN_FILE])
        .unwrap();
    let key_pem = String::from_utf8(set[0].clone()).unwrap();
    let expired = athenz_testbed::pki::expired_self_signed(&key_pem, "media.sports.web").unwrap();
    // (the tmpfs is sealed read-only: opened for this write as the agent opens it for its own)
    athenz_core::volume_mount::seal::write_sealed(&files, || {
        athenz_core::files::write_credentials(
            &FileSet::new(&files),
            &athenz_core::files::Credentials {
                key_pem: Some(&athenz_core::secret::Secret::new(key_pem.clone())),
                cert_pem: &expired,
                ca_pem: &String::from_utf8(set[1].clone()).unwrap(),
                ntoken: &athenz_core::secret::Secret::new(
                    String::from_utf8(set[2].clone()).unwrap(),
                ),
            },
            None,
        )
        .map_err(|e| e.to_string())
    })
    .unwrap();

    wait_agent_replaced(&stack, agent).await;
    let mut condition = None;
    wait_for(
        "the volume reported abnormal",
        Duration::from_secs(20),
        async || match KubeletCsi::connect(
            stack.info.nodes[0].agent.csi_socket.as_ref().unwrap(),
            &stack.kubelet_root(),
        )
        .await
        {
            Ok(mut k) => match k.stats(&volume).await {
                Ok(stats) => {
                    condition = stats.volume_condition;
                    condition.as_ref().is_some_and(|c| c.abnormal)
                }
                Err(_) => false,
            },
            Err(_) => false,
        },
    )
    .await;
    let message = condition.unwrap().message;
    assert!(
        message.starts_with("the certificate expired at 2024-01-02"),
        "{message}"
    );
    // the operator's command shows the failed re-issue and when the agent tries again
    let mut report = serde_json::Value::Null;
    wait_for(
        "agent status shows the failed re-issue",
        Duration::from_secs(40),
        async || {
            let (code, r) = stack.agent_status();
            report = r;
            code == 1 && report["volumes"][0]["last_error"].is_string()
        },
    )
    .await;
    let v = &report["volumes"][0];
    assert_eq!(v["mode"], "csi-files", "{report}");
    assert_eq!(v["refreshed_by"], "agent");
    assert!(v["next_refresh"].is_string(), "{report}");
    assert!(
        v["problem"]
            .as_str()
            .unwrap()
            .starts_with("the last attempt failed: "),
        "{report}"
    );
    // what the pod reads is the set on disk, untouched by the failed renewal
    assert_eq!(
        std::fs::read_to_string(volume.target.join(CERT_FILE)).unwrap(),
        expired
    );
    kill(zts, Signal::SIGCONT).unwrap();
    unpublish_leaves_nothing(&stack, &mut kubelet, &volume).await;
}
