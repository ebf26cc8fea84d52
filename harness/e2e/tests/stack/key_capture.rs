//! Where a pod's private key travels (docs/design.md §4.6), through the real binaries:
//! `athenz-devstack up`, the real driver, `athenz-sia init` and `athenz-sia refresh` as processes
//! of the pod. The SIA talks to the agent through a recording relay (a process in the pod's cgroup,
//! so the agent's peer check is unchanged) that keeps every byte both ways, during init and three
//! refreshes. With pod-made keys no key the pod held (as PEM, as DER, or as a line of its
//! base64) and no `PRIVATE KEY` block is in the capture; with agent-made keys, the same check
//! finds them, so it can fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::CertInfo;
use athenz_devstack::node;
use common::Devstack;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Unix socket relay: accepts on argv[1], connects each client to argv[2], copies both ways
/// and appends every byte to argv[3].
const RELAY: &str = r#"
import os, socket, sys, threading
listen, target, capture = sys.argv[1], sys.argv[2], sys.argv[3]
lock = threading.Lock()
def pump(src, dst):
    while True:
        data = src.recv(65536)
        if not data:
            try: dst.shutdown(socket.SHUT_WR)
            except OSError: pass
            return
        with lock, open(capture, "ab") as f:
            f.write(data)
        dst.sendall(data)
server = socket.socket(socket.AF_UNIX)
server.bind(listen)
os.chmod(listen, 0o666)
server.listen(64)
while True:
    client, _ = server.accept()
    upstream = socket.socket(socket.AF_UNIX)
    upstream.connect(target)
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
"#;

/// What a key PEM gives away: the PEM itself, its DER, and each of its base64 lines.
fn key_traces(pem: &str) -> Vec<Vec<u8>> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(&body)
        .unwrap();
    let mut traces = vec![der];
    traces.extend(
        pem.lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 40)
            .map(|l| l.as_bytes().to_vec()),
    );
    traces
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Init and three refreshes of one pod through the relay; returns the capture and every key
/// the pod held.
async fn capture(key_source: &str) -> (Vec<u8>, Vec<String>) {
    let stack = Devstack::start_with(&["--key-source", key_source]);
    let info = &stack.info;
    let volume = stack.pod("media-sports", "web-kc", "10.1.0.91").await;
    let dir = tempfile::Builder::new()
        .prefix("kc")
        .tempdir_in("/tmp")
        .unwrap();
    let relay_socket = dir.path().join("r.sock");
    let capture_file = dir.path().join("capture");
    std::fs::write(dir.path().join("relay.py"), RELAY).unwrap();
    let relay_argv = node::in_pod(
        info,
        &volume.uid,
        &[
            "python3".to_owned(),
            dir.path().join("relay.py").display().to_string(),
            relay_socket.display().to_string(),
            volume.node.socket.display().to_string(),
            capture_file.display().to_string(),
        ],
    )
    .unwrap();
    let mut relay = Command::new(&relay_argv[0])
        .args(&relay_argv[1..])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !relay_socket.exists() {
        assert!(Instant::now() < deadline, "the relay did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sia = |verb: &str, extra: &[&str]| {
        let mut argv = info.sia.clone();
        argv.push(verb.to_owned());
        argv.extend(extra.iter().map(|s| (*s).to_owned()));
        let argv = node::in_pod(info, &volume.uid, &argv).unwrap();
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .current_dir(&volume.mount_dir)
            .envs(node::sia_env(info, &volume))
            // stack.json's argv prefix alone must carry the stack's key source
            .env_remove("KEY_SOURCE")
            .env("ENDPOINT", &relay_socket)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };
    let init = sia("init", &[]).output().unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let key_file = volume.credentials_dir.join("service.key.pem");
    let serial = || {
        CertInfo::from_pem(
            &std::fs::read_to_string(volume.credentials_dir.join("service.cert.pem")).unwrap(),
        )
        .map(|c| c.serial_hex)
        .unwrap_or_default()
    };
    let mut keys = vec![std::fs::read_to_string(&key_file).unwrap()];
    let mut serials = BTreeSet::from([serial()]);
    let mut refresher = sia("refresh", &["--refresh-interval=1s"]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while serials.len() < 4 {
        assert!(
            Instant::now() < deadline,
            "fewer than three refreshes in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = serial();
        if !serials.contains(&now) {
            serials.insert(now);
            keys.push(std::fs::read_to_string(&key_file).unwrap());
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(refresher.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(refresher.wait().unwrap().success());
    let _ = relay.kill();
    let _ = relay.wait();
    node::unmount(info, &volume).await.unwrap();
    (std::fs::read(&capture_file).unwrap(), keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_private_key_crosses_the_agent_socket_with_pod_made_keys() {
    let (bytes, keys) = capture("pod").await;
    assert!(
        contains(&bytes, b"CERTIFICATE REQUEST"),
        "the init's CSR was not captured"
    );
    assert!(
        contains(&bytes, b"CONNECT "),
        "no refresh went through the tunnel"
    );
    assert!(!contains(&bytes, b"PRIVATE KEY"));
    assert_eq!(keys.len(), 4, "init and three refreshes, each a new key");
    for key in &keys {
        for trace in key_traces(key) {
            assert!(
                !contains(&bytes, &trace),
                "a key the pod held crossed the socket"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_capture_finds_the_keys_the_agent_makes() {
    let (bytes, keys) = capture("agent").await;
    assert!(contains(&bytes, b"PRIVATE KEY"));
    for key in &keys {
        let traces = key_traces(key);
        assert!(
            traces[1..].iter().any(|t| contains(&bytes, t)),
            "an agent-made key was not found in the capture"
        );
    }
}

#[test]
fn traces_are_what_a_key_pem_holds() {
    let key =
        athenz_core::crypto::PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256).unwrap();
    let pem = key.to_pkcs8_pem().unwrap();
    let traces = key_traces(pem.expose());
    assert!(traces.len() >= 2);
    assert!(contains(pem.expose().as_bytes(), &traces[1]));
}
