//! An agent that cannot see its callers' pids (it runs in its own pid namespace: a DaemonSet
//! without `hostPID`) refuses every call in `enforce`, saying it needs `hostPID`
//! (docs/design.md §4.2). The real agent binary runs under `unshare --pid --fork --mount-proc`
//! (root, as CI runs), the caller is this test process in the host's namespace, which the kernel
//! reports to it as pid 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::volume::{VolumeData, VolumeId, VolumesDir, write_json_file};
use athenz_testbed::pki::CertAuthority;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const AGENT: &str = env!("CARGO_BIN_EXE_athenz-identity-agent");

#[test]
fn an_agent_in_another_pid_namespace_refuses_with_the_host_pid_hint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = CertAuthority::new_root("Test Root").unwrap();
    std::fs::write(d.join("ca.pem"), ca.root_pem()).unwrap();
    std::fs::write(d.join("token"), "a.b.c").unwrap();
    // a volume, as the driver makes it
    let volumes = VolumesDir::new(d.join("volumes"));
    volumes.ensure().unwrap();
    let key = volumes.load_or_create_node_key().unwrap();
    let uid = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";
    let mount_dir = format!("/var/lib/kubelet/pods/{uid}/volumes/athenz~volume-driver/v");
    let id = VolumeId::for_mount_dir(&key, &mount_dir);
    let paths = volumes.volume(&id);
    std::fs::create_dir_all(&paths.mount).unwrap();
    write_json_file(
        &paths.data_json,
        &VolumeData {
            namespace: "media-sports".into(),
            pod_name: "web".into(),
            pod_uid: uid.into(),
            service_account: "web".into(),
            mount_dir,
            read_write: false,
            created_at: time::OffsetDateTime::now_utc(),
            csi: None,
        },
        0o600,
    )
    .unwrap();

    let agent_dir = d.join("agent");
    let ca_path = d.join("ca.pem");
    let mut child = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", AGENT])
        .arg(format!("--agent-dir={}", agent_dir.display()))
        .arg(format!("--volumes-dir={}", d.join("volumes").display()))
        .arg("--kubelet-url=http://127.0.0.1:9")
        .arg("--jwt-service-url=https://127.0.0.1:9")
        .arg(format!("--jwt-service-ca={}", ca_path.display()))
        .arg("--zts-url=https://127.0.0.1:9/zts/v1")
        .arg(format!("--zts-ca={}", ca_path.display()))
        .arg("--node-name=node-1")
        .arg(format!("--node-token-file={}", d.join("token").display()))
        .arg("--provider=k8s.admin.athenz-callback")
        .arg("--dns-suffix=athenz.cloud")
        .arg("--admin-domain=k8s.admin")
        .arg("--ops-listen=127.0.0.1:0")
        .arg("--peer-check=enforce")
        // a key-less init reaches the peer check (with pod-made keys it would need a CSR)
        .arg("--key-source=agent")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("unshare (util-linux) runs the agent in a new pid namespace");
    let socket = agent_dir.join("agent.sock");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the agent exited: unshare --pid needs root"
        );
        assert!(Instant::now() < deadline, "no socket within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST /v1/init/{id} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("hostPID"), "{answer}");
    assert!(answer.contains("pid 0"), "{answer}");
}
