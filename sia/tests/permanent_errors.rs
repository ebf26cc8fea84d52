//! The SIA against an agent that refuses: in `init` a refusal (400/403/404) ends the run at once
//! with the reason, "try again" (503) is retried; the refresher retries refusals too; an
//! endpoint that cannot be a socket ends either at once. The agent is a real HTTP server on a real Unix socket answering a fixed status.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::http::{
    Body, ConnInfo, Handler, Listener, Server, error_response, unavailable_response,
};
use athenz_core::volume::VolumeId;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const SIA: &str = env!("CARGO_BIN_EXE_athenz-sia");

struct FixedAgent {
    status: StatusCode,
    calls: Arc<AtomicUsize>,
}

impl Handler for FixedAgent {
    async fn handle(&self, _req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            unavailable_response("ZTS unreachable", Duration::from_secs(1))
        } else {
            error_response(self.status, format!("refused with {}", self.status))
        }
    }
}

struct Setup {
    dir: tempfile::TempDir,
    socket: PathBuf,
    calls: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn agent_answering(status: StatusCode) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        Server::new(
            Listener::Unix(listener),
            Arc::new(FixedAgent {
                status,
                calls: calls.clone(),
            }),
        )
        .serve(async {
            let _ = rx.await;
        }),
    );
    std::fs::write(dir.path().join("id"), format!("{}\n", "a".repeat(64))).unwrap();
    assert!(VolumeId::parse(&"a".repeat(64)).is_ok());
    Setup {
        dir,
        socket,
        calls,
        _stop: tx,
    }
}

async fn run_sia(verb: &str, dir: &Path, endpoint: &Path) -> std::process::Output {
    let child = tokio::process::Command::new(SIA)
        .arg(verb)
        .env("ID_FILE", dir.join("id"))
        .env("ENDPOINT", endpoint)
        .env("OUT_DIR", dir.join("out"))
        .env("INIT_TIMEOUT", "60s")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // far below INIT_TIMEOUT: an exit inside this bound is not the retry window running out
    tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the SIA kept retrying an error that cannot heal")
        .unwrap()
}

#[tokio::test]
async fn init_exits_at_once_on_a_refusal() {
    for status in [
        StatusCode::BAD_REQUEST,
        StatusCode::FORBIDDEN,
        StatusCode::NOT_FOUND,
    ] {
        let setup = agent_answering(status).await;
        let out = run_sia("init", setup.dir.path(), &setup.socket).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{status}: {stderr}");
        assert!(
            stderr.contains(&format!("refused with {status}")),
            "{stderr}"
        );
        assert!(stderr.contains("not retried"), "{stderr}");
        assert_eq!(setup.calls.load(Ordering::SeqCst), 1, "{status}");
        assert!(
            !setup
                .dir
                .path()
                .join("out")
                .join("service.cert.pem")
                .exists()
        );
    }
}

#[tokio::test]
async fn init_retries_unavailability_until_its_timeout() {
    let setup = agent_answering(StatusCode::SERVICE_UNAVAILABLE).await;
    let child = tokio::process::Command::new(SIA)
        .arg("init")
        .env("ID_FILE", setup.dir.path().join("id"))
        .env("ENDPOINT", &setup.socket)
        .env("OUT_DIR", setup.dir.path().join("out"))
        .env("INIT_TIMEOUT", "4s")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gave up"), "{stderr}");
    assert!(
        setup.calls.load(Ordering::SeqCst) >= 2,
        "503 was not retried"
    );
}

#[tokio::test]
async fn a_socket_path_too_long_for_sun_path_is_a_configuration_error() {
    let setup = agent_answering(StatusCode::FORBIDDEN).await;
    let long = setup.dir.path().join("d".repeat(120)).join("agent.sock");
    for verb in ["init", "refresh"] {
        let out = run_sia(verb, setup.dir.path(), &long).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{verb}: {stderr}");
        assert!(stderr.contains("ENDPOINT"), "{stderr}");
        assert!(stderr.contains("longer than the 107"), "{stderr}");
    }
    assert_eq!(setup.calls.load(Ordering::SeqCst), 0);
}

/// The refresher retries a refusal — ZTS answers 403 also while it cannot ask its provider
/// callback, so a refusal may heal — whether its certificate is still valid (refresh) or has
/// expired (registering anew), keeps its files, says why in its log, and stops cleanly.
#[tokio::test]
async fn refresh_keeps_its_files_and_retries_a_refusal() {
    use athenz_core::files::{Credentials, FileSet, write_credentials};
    use athenz_testbed::pki::{CertAuthority, LeafSpec};
    // (seconds left, since issue): due for refresh at once with 20 s left, and expired
    for (validity, backdate) in [(20, 3600), (-60, 3600)] {
        let setup = agent_answering(StatusCode::FORBIDDEN).await;
        let ca = CertAuthority::new_root("test CA").unwrap();
        let mut spec = LeafSpec::service("media.sports.web", &[]);
        spec.validity = time::Duration::seconds(validity);
        spec.backdate = time::Duration::seconds(backdate);
        let cert = ca
            .issue(&spec, athenz_core::crypto::KeyAlgorithm::P256)
            .unwrap();
        write_credentials(
            &FileSet::new(setup.dir.path().join("out")),
            &Credentials {
                key_pem: Some(&cert.key_pem),
                cert_pem: &cert.chain_pem,
                ca_pem: ca.root_pem(),
                ntoken: &athenz_core::secret::Secret::new("v=S1;d=media.sports"),
            },
            None,
        )
        .unwrap();
        let mut child = tokio::process::Command::new(SIA)
            .arg("refresh")
            .env("ID_FILE", setup.dir.path().join("id"))
            .env("ENDPOINT", &setup.socket)
            .env("OUT_DIR", setup.dir.path().join("out"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let retried = tokio::time::timeout(Duration::from_secs(20), async {
            while setup.calls.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if retried.is_err() {
            child.start_kill().unwrap();
            let out = child.wait_with_output().await.unwrap();
            panic!(
                "the refresher did not retry the refusal (validity {validity} s, {} calls): {}{}",
                setup.calls.load(Ordering::SeqCst),
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the refresher exited on a refusal (validity {validity} s)"
        );
        let status = athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
            .await
            .expect("no exit after SIGTERM");
        assert_eq!(status.code(), Some(0));
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr)
            .await
            .unwrap();
        assert!(stderr.contains("refused with 403"), "{stderr}");
        assert!(stderr.contains("retried"), "{stderr}");
        // the files it had are left as they were
        assert_eq!(
            std::fs::read_to_string(setup.dir.path().join("out").join("service.cert.pem")).unwrap(),
            cert.chain_pem
        );
    }
}
