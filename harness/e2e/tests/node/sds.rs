//! `athenz-sia refresh --sds-socket`: the real SIA process on a whole node (agent, jwt-service,
//! callback, dev ZTS), driven by the test bed's SDS client built from Envoy's API bindings. Every
//! pushed `Secret` is decoded and checked field by field against the files written from the same
//! issue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::CertInfo;
use athenz_core::files::{CA_FILE, CERT_FILE, FileSet, KEY_FILE};
use athenz_testbed::sds_client::{self, Decoded, SdsClient, SdsStream, request};
use common::*;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::timeout;

/// The most any one wait here may take (a rotation comes every 2 s).
const WAIT: Duration = Duration::from_secs(20);

/// A refresh sidecar serving SDS for a fresh pod of `node`.
struct SdsSia {
    child: tokio::process::Child,
    out: PathBuf,
    socket: PathBuf,
}

async fn start(node: &Node, n: usize, refresh_interval: &str) -> SdsSia {
    let id = pod_with_volume(node, &format!("envoy-{n}"), &uid(n), &format!("10.7.0.{n}"));
    let out = node.dir.path().join(format!("out-{n}"));
    let init = sia(node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let socket = node.dir.path().join(format!("sds-{n}/sds.sock"));
    let child = sia(
        node,
        "refresh",
        &id,
        &out,
        &[
            ("REFRESH_INTERVAL", refresh_interval),
            ("SDS_SOCKET", socket.to_str().unwrap()),
        ],
    )
    .await
    .spawn()
    .unwrap();
    wait_for_socket(&socket).await;
    SdsSia { child, out, socket }
}

async fn wait_for_socket(socket: &Path) {
    timeout(WAIT, async {
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the SDS socket never appeared");
}

/// The set on disk, read as one set: (key, cert chain, CA).
fn files(out: &Path) -> CredentialSet {
    let mut f = FileSet::new(out)
        .read(&[KEY_FILE, CERT_FILE, CA_FILE])
        .unwrap()
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap());
    (f.next().unwrap(), f.next().unwrap(), f.next().unwrap())
}

fn serial(cert_pem: &str) -> String {
    CertInfo::from_pem(cert_pem).unwrap().serial_hex
}

/// Every credential set the SIA has written, by certificate serial: a watcher reads the files (as
/// one set) every millisecond, so each push can be compared with the files of its own issue
/// whatever rotated since.
#[derive(Clone, Default)]
struct FilesLog(Arc<Mutex<HashMap<String, CredentialSet>>>);

/// (key, certificate chain, CA) as read from the files.
type CredentialSet = (String, String, String);

impl FilesLog {
    fn watch(out: &Path) -> (Self, tokio::task::JoinHandle<()>) {
        let log = Self::default();
        let (inner, out) = (log.clone(), out.to_owned());
        let task = tokio::spawn(async move {
            loop {
                let set = files(&out);
                let serial = serial(&set.1);
                inner.0.lock().unwrap().entry(serial).or_insert(set);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        (log, task)
    }

    /// The set of `version` (waiting briefly: a push may beat the watcher to the new files).
    async fn set(&self, version: &str) -> CredentialSet {
        timeout(WAIT, async {
            loop {
                if let Some(set) = self.0.lock().unwrap().get(version) {
                    return set.clone();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("version {version} was never on disk"))
    }

    /// Checks `response` field by field against the files of its issue: `default` carries exactly
    /// the chain and key files, `ROOTCA` the CA file, and nothing else is there.
    async fn assert_matches(&self, response: &DiscoveryResponse, names: &[&str]) {
        let (key, chain, ca) = self.set(&response.version_info).await;
        let decoded = sds_client::decode(response).unwrap();
        let mut got: Vec<&str> = decoded
            .iter()
            .map(|d| match d {
                Decoded::Certificate { name, .. } | Decoded::Validation { name, .. } => {
                    name.as_str()
                }
            })
            .collect();
        got.sort_unstable();
        let mut want = names.to_vec();
        want.sort_unstable();
        assert_eq!(got, want);
        for d in decoded {
            match d {
                Decoded::Certificate {
                    name,
                    chain: c,
                    key: k,
                } => {
                    assert_eq!(name, "default");
                    assert_eq!(c, chain, "certificate_chain differs from {CERT_FILE}");
                    assert_eq!(k, key, "private_key differs from {KEY_FILE}");
                }
                Decoded::Validation { name, trusted_ca } => {
                    assert_eq!(name, "ROOTCA");
                    assert_eq!(trusted_ca, ca, "trusted_ca differs from {CA_FILE}");
                }
            }
        }
    }
}

async fn next(stream: &mut SdsStream) -> DiscoveryResponse {
    timeout(WAIT, stream.next())
        .await
        .expect("no SDS response in time")
        .unwrap()
        .expect("the stream ended")
}

async fn client(socket: &Path) -> SdsClient {
    sds_client::connect(socket).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rotation_is_pushed_to_every_open_stream() {
    let node = node("p256").await;
    let mut sia = start(&node, 1, "2s").await;
    let (log, _watcher) = FilesLog::watch(&sia.out);
    assert_eq!(
        std::fs::metadata(&sia.socket).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // 100 streams over two connections, as many Envoy clusters would open
    let mut clients = [client(&sia.socket).await, client(&sia.socket).await];
    let mut streams = Vec::new();
    for i in 0..100 {
        let names: &[&str] = if i % 2 == 0 {
            &["default", "ROOTCA"]
        } else {
            &["default"]
        };
        let mut stream = SdsStream::open(&mut clients[i % 2], request(names, None, None))
            .await
            .unwrap();
        let first = next(&mut stream).await;
        streams.push((stream, names, first));
    }
    for (stream, names, first) in &streams {
        log.assert_matches(first, names).await;
        stream
            .send(request(names, Some(first), None))
            .await
            .unwrap(); // ACK
    }
    // the next rotation reaches every stream, with the new issue; streams that started from the
    // same version all get the same next one
    let mut next_of: HashMap<String, String> = HashMap::new();
    for (stream, names, first) in &mut streams {
        let push = next(stream).await;
        assert_ne!(push.version_info, first.version_info);
        log.assert_matches(&push, names).await;
        let expected = next_of
            .entry(first.version_info.clone())
            .or_insert_with(|| push.version_info.clone());
        assert_eq!(
            *expected, push.version_info,
            "streams got different rotations"
        );
    }
    let status = athenz_testbed::process::terminate(&mut sia.child, Duration::from_secs(10))
        .await
        .expect("no exit after SIGTERM with 100 streams open");
    assert_eq!(status.code(), Some(0));
    assert!(!sia.socket.exists(), "socket left behind");
    // the streams were closed by the server, not left hanging
    for (stream, _, _) in &mut streams {
        let end = timeout(WAIT, stream.next())
            .await
            .expect("stream left open");
        assert!(!matches!(end, Ok(Some(_))), "a push after SIGTERM");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_nack_unknown_names_bounds_and_reconnect() {
    let node = node("p256").await;
    let mut sia = start(&node, 2, "3s").await;
    let (log, _watcher) = FilesLog::watch(&sia.out);
    let mut envoy = client(&sia.socket).await;

    // initial fetch, then a NACK: logged with Envoy's reason, nothing re-sent
    let mut stream = SdsStream::open(&mut envoy, request(&["default"], None, None))
        .await
        .unwrap();
    let first = next(&mut stream).await;
    log.assert_matches(&first, &["default"]).await;
    let envoy_error = "Failed to load certificate chain from <inline>: test NACK 7f3a";
    stream
        .send(request(&["default"], Some(&first), Some(envoy_error)))
        .await
        .unwrap();
    // nothing is re-sent for the NACK: the next message is the next rotation's push
    let pushed = next(&mut stream).await;
    assert_ne!(
        pushed.version_info, first.version_info,
        "re-sent after a NACK"
    );
    log.assert_matches(&pushed, &["default"]).await;
    // an answer to a nonce never sent is superseded: ignored (again, only a rotation follows)
    let mut stale = request(&["default"], Some(&pushed), None);
    stale.response_nonce = "999".into();
    stream.send(stale).await.unwrap();
    let later = next(&mut stream).await;
    assert_ne!(
        later.version_info, pushed.version_info,
        "answered a stale nonce"
    );
    // ACK it and widen the subscription: both secrets at once (a rotation push with the old
    // subscription may cross the request)
    stream
        .send(request(&["default", "ROOTCA"], Some(&later), None))
        .await
        .unwrap();
    let mut widened = next(&mut stream).await;
    if widened.resources.len() == 1 {
        widened = next(&mut stream).await;
    }
    assert_eq!(widened.resources.len(), 2);
    assert_ne!(widened.nonce, later.nonce);
    log.assert_matches(&widened, &["default", "ROOTCA"]).await;

    // unknown names end the stream with NOT_FOUND naming them
    let mut unknown = SdsStream::open(
        &mut envoy,
        request(&["default", "spiffe://nope"], None, None),
    )
    .await
    .unwrap();
    let err = timeout(WAIT, unknown.next()).await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("spiffe://nope"), "{}", err.message());
    // a first request naming nothing is refused with what can be named
    let mut nothing = SdsStream::open(&mut envoy, request(&[], None, None))
        .await
        .unwrap();
    let err = timeout(WAIT, nothing.next()).await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("ROOTCA"), "{}", err.message());
    // an oversized request is refused, the server keeps serving
    let huge = "d".repeat(100 * 1024);
    let mut big = SdsStream::open(&mut envoy, request(&[huge.as_str()], None, None))
        .await
        .unwrap();
    let err = timeout(WAIT, big.next()).await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    assert!(err.message().contains("too large"), "{err}");

    // FetchSecrets (unary) answers the same way
    let fetched = envoy
        .fetch_secrets(request(&["ROOTCA"], None, None))
        .await
        .unwrap()
        .into_inner();
    let (_, _, ca) = files(&sia.out);
    assert_eq!(
        sds_client::decode(&fetched).unwrap(),
        vec![Decoded::Validation {
            name: "ROOTCA".into(),
            trusted_ca: ca
        }]
    );
    let err = envoy
        .fetch_secrets(request(&["file-cert"], None, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("file-cert"));
    // incremental SDS is not served, and says so
    let (_tx, rx) = tokio::sync::mpsc::channel(1);
    let err = envoy
        .delta_secrets(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    // disconnect (the proxy restarts) and reconnect: served afresh
    drop(stream);
    drop(envoy);
    let mut again = client(&sia.socket).await;
    let mut stream = SdsStream::open(&mut again, request(&["ROOTCA", "default"], None, None))
        .await
        .unwrap();
    let fresh = next(&mut stream).await;
    assert_eq!(fresh.resources.len(), 2);
    drop(stream);

    // the bound on streams: past it RESOURCE_EXHAUSTED; closed streams free their slots
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(client(&sia.socket).await);
    }
    let mut open = Vec::new();
    for i in 0..athenz_sia::sds::MAX_STREAMS {
        let mut s = SdsStream::open(&mut conns[i % 2], request(&["ROOTCA"], None, None))
            .await
            .unwrap();
        next(&mut s).await;
        open.push(s);
    }
    let mut over = SdsStream::open(&mut conns[2], request(&["ROOTCA"], None, None)).await;
    let err = match &mut over {
        Err(e) => e.clone(),
        Ok(s) => timeout(WAIT, s.next()).await.unwrap().unwrap_err(),
    };
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    drop(open);
    let reopened = timeout(WAIT, async {
        loop {
            if let Ok(mut s) =
                SdsStream::open(&mut conns[2], request(&["ROOTCA"], None, None)).await
                && let Ok(Some(r)) = s.next().await
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("slots were not freed");
    assert_eq!(reopened.resources.len(), 1);

    let status = athenz_testbed::process::terminate(&mut sia.child, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    sia.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    let nack = stderr
        .lines()
        .find(|l| l.contains("rejected the SDS secrets"))
        .expect("the NACK was not logged");
    assert!(nack.contains("test NACK 7f3a"), "{nack}");
    assert!(nack.contains(&first.version_info), "{nack}");
    assert!(!stderr.contains("PRIVATE KEY"), "a key was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sds_socket_settings_are_checked_before_serving() {
    let node = node("p256").await;
    let id = pod_with_volume(&node, "envoy-3", &uid(3), "10.7.0.3");
    let out = node.dir.path().join("out-3");
    let init = sia(&node, "init", &id, &out, &[])
        .await
        .output()
        .await
        .unwrap();
    assert!(init.status.success());
    // something that is not a socket at the path: refused and kept
    let taken = node.dir.path().join("taken");
    std::fs::write(&taken, b"not a socket").unwrap();
    let output = sia(
        &node,
        "refresh",
        &id,
        &out,
        &[("SDS_SOCKET", taken.to_str().unwrap())],
    )
    .await
    .output()
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SDS_SOCKET") && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&taken).unwrap(), b"not a socket");
    // with a group: 0660 and that group
    let gid = nix::unistd::getegid().as_raw();
    let socket = node.dir.path().join("grp/sds.sock");
    let mut child = sia(
        &node,
        "refresh",
        &id,
        &out,
        &[
            ("SDS_SOCKET", socket.to_str().unwrap()),
            ("GROUP", &gid.to_string()),
        ],
    )
    .await
    .spawn()
    .unwrap();
    wait_for_socket(&socket).await;
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), gid);
    athenz_testbed::process::terminate(&mut child, Duration::from_secs(10))
        .await
        .unwrap();
}

/// `athenz-sia status --sds-socket` is an SDS client an operator or an init container can run:
/// it reports what the socket serves (the files' principal, verified to the served CA), waits
/// for a socket that is not there yet with `--wait`, and names a socket that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_what_the_sds_socket_serves() {
    let node = node("p256").await;
    let sia = start(&node, 7, "1h").await;
    let (_, cert, _) = files(&sia.out);
    let principal = CertInfo::from_pem(&cert).unwrap().common_name;
    let status = |args: &[&str]| {
        std::process::Command::new(&*SIA)
            .arg("status")
            .args(args)
            .output()
            .unwrap()
    };
    let socket = sia.socket.to_str().unwrap();
    let out = status(&["--sds-socket", socket, "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{report}");
    assert_eq!(report["principal"], principal.as_str());
    assert_eq!(report["chain_verified"], true);
    assert_eq!(report["key_matches"], true);
    assert_eq!(report["out_dir"], format!("sds:{socket}"));

    let missing = node.dir.path().join("not-yet.sock");
    let started = std::time::Instant::now();
    let out = status(&["--sds-socket", missing.to_str().unwrap(), "--wait", "2s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() >= Duration::from_secs(2), "it waited");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("healthy:     NO") && text.contains("not-yet.sock"),
        "{text}"
    );
}
