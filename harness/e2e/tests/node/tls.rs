//! athenz-core's TLS module over real sockets: a server built with it refuses clients without a
//! certificate and clients from another CA, hands the handler the right principal, and reloads
//! its certificate from disk — skipping a mismatched pair.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::http::{Body, ConnInfo, Handler, Listener, Server, json_response};
use athenz_core::tls::{self, ClientIdentity, ReloadOutcome, ReloadingIdentity, read_certs_file};
use athenz_testbed::pki::{CertAuthority, CertFiles, LeafSpec};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Answers with the caller's principal and counts the requests it saw.
#[derive(Default)]
struct WhoAmI {
    calls: AtomicUsize,
}

impl Handler for WhoAmI {
    async fn handle(&self, _req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        json_response(
            StatusCode::OK,
            &serde_json::json!({ "principal": conn.principal }),
        )
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: CertAuthority,
    inter: CertAuthority,
    server_files: CertFiles,
    identity: Arc<ReloadingIdentity>,
    addr: SocketAddr,
    handler: Arc<WhoAmI>,
}

async fn start() -> Fixture {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let root = CertAuthority::new_root("Test Root").unwrap();
    let inter = root.new_intermediate("Test Intermediate").unwrap();
    let server_files = inter
        .write_service_cert(
            dir.path(),
            "server",
            &LeafSpec::service("k8s.admin.athenz-callback", &["localhost"]),
        )
        .unwrap();
    let identity = ReloadingIdentity::load(&server_files.cert, &server_files.key).unwrap();
    let client_cas = read_certs_file(&server_files.ca).unwrap();
    let config = tls::server_config(identity.clone(), &client_cas).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(WhoAmI::default());
    let server = Server::new(Listener::Tcp(listener), handler.clone()).with_tls(config);
    tokio::spawn(server.serve(std::future::pending()));
    Fixture {
        _dir: dir,
        root,
        inter,
        server_files,
        identity,
        addr,
        handler,
    }
}

fn client(cas_pem: &str, identity: Option<ClientIdentity>) -> reqwest::Client {
    let cas = athenz_core::crypto::pem_certificates(cas_pem).unwrap();
    let config = tls::client_config(&cas, identity).unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .tls_info(true)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn client_identity(ca: &CertAuthority, cn: &str) -> ClientIdentity {
    let issued = ca
        .issue(
            &LeafSpec::service(cn, &[]),
            athenz_core::crypto::KeyAlgorithm::P256,
        )
        .unwrap();
    ClientIdentity::Fixed(
        tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose()).unwrap(),
    )
}

fn url(addr: SocketAddr) -> String {
    format!("https://localhost:{}/whoami", addr.port())
}

/// The serial of the certificate the server presented.
fn server_serial(resp: &reqwest::Response) -> String {
    let info = resp.extensions().get::<reqwest::tls::TlsInfo>().unwrap();
    let der = info.peer_certificate().unwrap();
    athenz_core::crypto::CertInfo::from_der(der)
        .unwrap()
        .serial_hex
}

#[tokio::test]
async fn handler_gets_the_client_principal() {
    let f = start().await;
    let c = client(
        f.root.root_pem(),
        Some(client_identity(&f.inter, "k8s.admin.athenz-zts")),
    );
    let resp = c.get(url(f.addr)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["principal"], "k8s.admin.athenz-zts");
    assert_eq!(f.handler.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn client_without_a_certificate_is_refused() {
    let f = start().await;
    let c = client(f.root.root_pem(), None);
    assert!(c.get(url(f.addr)).send().await.is_err());
    assert_eq!(
        f.handler.calls.load(Ordering::SeqCst),
        0,
        "handler was reached"
    );
}

#[tokio::test]
async fn client_from_another_ca_is_refused() {
    let f = start().await;
    let stranger_ca = CertAuthority::new_root("Stranger Root").unwrap();
    let c = client(
        f.root.root_pem(),
        Some(client_identity(&stranger_ca, "k8s.admin.athenz-zts")),
    );
    assert!(c.get(url(f.addr)).send().await.is_err());
    assert_eq!(
        f.handler.calls.load(Ordering::SeqCst),
        0,
        "handler was reached"
    );
}

#[tokio::test]
async fn client_refuses_a_server_from_another_ca() {
    let f = start().await;
    let other = CertAuthority::new_root("Other Root").unwrap();
    let c = client(
        other.root_pem(),
        Some(client_identity(&f.inter, "k8s.admin.athenz-zts")),
    );
    let err = c.get(url(f.addr)).send().await.unwrap_err();
    let chain = format!("{err:?}");
    assert!(
        chain.contains("UnknownIssuer") || chain.contains("certificate"),
        "{chain}"
    );
    assert_eq!(f.handler.calls.load(Ordering::SeqCst), 0);
}

fn overwrite(files: &CertFiles, cert_pem: &str, key_pem: &str) {
    // write both files in place, as a careless deployment tool would
    std::fs::write(&files.cert, cert_pem).unwrap();
    std::fs::write(&files.key, key_pem).unwrap();
}

#[tokio::test]
async fn reload_picks_up_a_new_pair_and_skips_a_mismatched_one() {
    let f = start().await;
    let c = || {
        client(
            f.root.root_pem(),
            Some(client_identity(&f.inter, "k8s.admin.athenz-zts")),
        )
    };
    let first = server_serial(&c().get(url(f.addr)).send().await.unwrap());
    assert!(matches!(f.identity.reload(), ReloadOutcome::Unchanged));

    // a new matching pair
    let spec = LeafSpec::service("k8s.admin.athenz-callback", &["localhost"]);
    let second = f
        .inter
        .issue(&spec, athenz_core::crypto::KeyAlgorithm::P256)
        .unwrap();
    overwrite(&f.server_files, &second.chain_pem, second.key_pem.expose());
    assert!(matches!(f.identity.reload(), ReloadOutcome::Reloaded));
    let served = server_serial(&c().get(url(f.addr)).send().await.unwrap());
    assert_eq!(served, second.serial_hex);
    assert_ne!(served, first);

    // a half-written pair: new certificate, old key
    let third = f
        .inter
        .issue(&spec, athenz_core::crypto::KeyAlgorithm::P256)
        .unwrap();
    overwrite(&f.server_files, &third.chain_pem, second.key_pem.expose());
    match f.identity.reload() {
        ReloadOutcome::Skipped(e) => assert!(e.to_string().contains("does not match"), "{e}"),
        other => panic!("mismatched pair was not skipped: {other:?}"),
    }
    let still = server_serial(&c().get(url(f.addr)).send().await.unwrap());
    assert_eq!(
        still, second.serial_hex,
        "server stopped serving the good pair"
    );

    // truncated certificate file: skipped too
    overwrite(
        &f.server_files,
        "-----BEGIN CERTIFICATE-----\nAAA",
        third.key_pem.expose(),
    );
    assert!(matches!(f.identity.reload(), ReloadOutcome::Skipped(_)));

    // the key arrives: the pair is complete and is picked up
    overwrite(&f.server_files, &third.chain_pem, third.key_pem.expose());
    assert!(matches!(f.identity.reload(), ReloadOutcome::Reloaded));
    let now = server_serial(&c().get(url(f.addr)).send().await.unwrap());
    assert_eq!(now, third.serial_hex);
}

#[tokio::test]
async fn watcher_reloads_in_the_background() {
    let f = start().await;
    let _watcher = f.identity.spawn_watcher(Duration::from_millis(50));
    let spec = LeafSpec::service("k8s.admin.athenz-callback", &["localhost"]);
    let next = f
        .inter
        .issue(&spec, athenz_core::crypto::KeyAlgorithm::P256)
        .unwrap();
    replace_atomically(&f.server_files.cert, &next.chain_pem);
    replace_atomically(&f.server_files.key, next.key_pem.expose());
    // bounded wait for the watcher to notice
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // a new client each time: a pooled connection would keep the old certificate
        let c = client(
            f.root.root_pem(),
            Some(client_identity(&f.inter, "k8s.admin.athenz-zts")),
        );
        let served = server_serial(&c.get(url(f.addr)).send().await.unwrap());
        if served == next.serial_hex {
            break;
        }
        assert!(Instant::now() < deadline, "watcher never reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn replace_atomically(path: &Path, text: &str) {
    athenz_core::volume::write_file_atomic(path, text.as_bytes(), 0o600).unwrap();
}

#[test]
fn reload_identity_serves_as_client_certificate_too() {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let root = CertAuthority::new_root("Root").unwrap();
    let files = root
        .write_service_cert(
            dir.path(),
            "node",
            &LeafSpec::service("k8s.nodes.node-1", &[]),
        )
        .unwrap();
    let id = ReloadingIdentity::load(&files.cert, &files.key).unwrap();
    let cas = read_certs_file(&files.ca).unwrap();
    let config = tls::client_config(&cas, Some(ClientIdentity::Reloading(id.clone()))).unwrap();
    assert!(config.client_auth_cert_resolver.has_certs());
    let leaf = &id.current().cert[0];
    assert_eq!(tls::principal_of(leaf).as_deref(), Some("k8s.nodes.node-1"));
}

/// A server's client CA bundle read again as its file changes: a CA appended is trusted from the
/// next handshake, the old one removed is refused from then on, and a bundle that does not parse
/// (or is empty) is refused while the last good one keeps serving.
#[tokio::test]
async fn the_client_ca_bundle_follows_its_file() {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let old = CertAuthority::new_root("Athenz Old Root").unwrap();
    let new = CertAuthority::new_root("Athenz New Root").unwrap();
    let server_files = old
        .write_service_cert(
            dir.path(),
            "server",
            &LeafSpec::service("k8s.admin.athenz-callback", &["localhost"]),
        )
        .unwrap();
    let bundle = dir.path().join("client-ca.pem");
    std::fs::write(&bundle, old.root_pem()).unwrap();
    let identity = ReloadingIdentity::load(&server_files.cert, &server_files.key).unwrap();
    let client_ca = tls::ReloadingClientCa::load(&bundle).unwrap();
    let config = tls::server_config_reloading(identity, client_ca.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(Listener::Tcp(listener), Arc::new(WhoAmI::default())).with_tls(config);
    tokio::spawn(server.serve(std::future::pending()));
    let ask = |ca: &CertAuthority| {
        let c = client(old.root_pem(), Some(client_identity(ca, "sys.auth.zts")));
        async move {
            c.get(url(addr))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    };
    assert!(ask(&old).await);
    assert!(!ask(&new).await, "the new CA is not trusted yet");

    replace_atomically(&bundle, &format!("{}{}", old.root_pem(), new.root_pem()));
    assert!(client_ca.reload().unwrap());
    assert_eq!(client_ca.len(), 2);
    assert!(
        ask(&old).await && ask(&new).await,
        "both during the rotation"
    );

    replace_atomically(&bundle, new.root_pem());
    assert!(client_ca.reload().unwrap());
    assert!(ask(&new).await);
    assert!(!ask(&old).await, "the old CA is refused once removed");

    for bad in [
        "",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    ] {
        replace_atomically(&bundle, bad);
        assert!(client_ca.reload().is_err(), "{bad:?}");
        assert!(ask(&new).await, "the last good bundle serves");
    }
    std::fs::remove_file(&bundle).unwrap();
    assert!(client_ca.reload().is_err(), "a missing file");
    assert!(ask(&new).await && !ask(&old).await);
}
