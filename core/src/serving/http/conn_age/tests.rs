//! Connections closed at their maximum age and at their client certificate's notAfter, and
//! resumed sessions refused before any request, on the real server with rustls clients over
//! loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::super::*;
use super::max_age;
use crate::tls::clock::ManualClock;
use crate::tls::test_pki::{TestCa, client_config, secs, server_identity};
use crate::tls::{ClientAuth, ClientCas, server_config_on_clock};
use prometheus_client::registry::Registry;
use rustls::version::{TLS12, TLS13};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long `/slow` takes.
const SLOW: Duration = Duration::from_millis(800);

/// Answers at once, or after [`SLOW`] on `/slow`; counts the requests it saw.
#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
}

impl Handler for Counting {
    async fn handle(&self, req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if req.uri().path() == "/slow" {
            tokio::time::sleep(SLOW).await;
        }
        json_response(StatusCode::OK, &serde_json::json!({}))
    }
}

struct Running {
    addr: SocketAddr,
    handler: Arc<Counting>,
    registry: Registry,
}

async fn serve(config: crate::tls::ServerTls, limits: ServerLimits) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut registry = Registry::default();
    let metrics = HttpMetrics::register_tls(&mut registry);
    let handler = Arc::new(Counting::default());
    let server = Server::new(Listener::Tcp(listener), Arc::clone(&handler))
        .with_tls(config)
        .with_limits(limits)
        .with_metrics(metrics);
    tokio::spawn(server.serve(std::future::pending()));
    Running {
        addr,
        handler,
        registry,
    }
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn connect(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, alpn: &[u8]) -> Tls {
    let mut config = (**config).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// An HTTP/2 client on `tls`, its connection driven by the returned task (which ends when the
/// server closes the connection).
async fn h2_client(
    tls: Tls,
) -> (
    hyper::client::conn::http2::SendRequest<Body>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    (sender, tokio::spawn(conn))
}

async fn get(
    sender: &mut hyper::client::conn::http2::SendRequest<Body>,
    path: &str,
) -> hyper::Result<StatusCode> {
    let req = Request::builder()
        .uri(format!("https://localhost{path}"))
        .body(Body::default())
        .unwrap();
    sender.send_request(req).await.map(|resp| resp.status())
}

fn limits(max_connection_age: Duration) -> ServerLimits {
    ServerLimits {
        // idle connections are not what closes these
        header_timeout: Duration::from_secs(60),
        max_connection_age,
        ..ServerLimits::default()
    }
}

/// An HTTP/2 connection kept busy is closed gracefully at its maximum age: the request in flight
/// then is answered, the connection ends (GOAWAY), and a new one is needed.
#[tokio::test]
async fn a_kept_alive_h2_connection_is_closed_gracefully_at_its_max_age() {
    let ca = TestCa::new("Athenz Root");
    let config =
        crate::tls::server_config(server_identity(&ca), std::slice::from_ref(&ca.cert)).unwrap();
    let server = serve(config, limits(Duration::from_millis(600))).await;
    let client = client_config(&ca, ca.leaf("k8s.nodes.node-1", &[]), &[&TLS13]);
    let (mut sender, conn) = h2_client(connect(server.addr, &client, b"h2").await).await;
    // sent at once, answered after the maximum age: in flight then, so answered all the same
    assert_eq!(get(&mut sender, "/slow").await.unwrap(), StatusCode::OK);
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "the connection was not closed gracefully: {ended:?}"
    );
    assert!(get(&mut sender, "/").await.is_err(), "served after closing");
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 1);
    // a new connection is served
    let (mut sender, _conn) = h2_client(connect(server.addr, &client, b"h2").await).await;
    assert_eq!(get(&mut sender, "/").await.unwrap(), StatusCode::OK);
}

/// A connection whose client certificate expires before the maximum age is closed at its
/// notAfter (here 1 s after the server's clock reads at the handshake).
#[tokio::test]
async fn a_connection_is_closed_when_its_client_certificate_expires() {
    let clock = ManualClock::starting_now();
    let now = clock.now().as_secs();
    let ca = TestCa::new("Athenz Root");
    let config = server_config_on_clock(
        server_identity(&ca),
        ClientCas::Fixed(std::slice::from_ref(&ca.cert), ClientAuth::Required),
        clock,
    )
    .unwrap();
    let server = serve(
        config,
        ServerLimits {
            header_timeout: Duration::from_secs(60),
            ..ServerLimits::default()
        },
    )
    .await;
    let leaf = ca.leaf_between("k8s.nodes.node-1", &[], secs(now - 60), secs(now + 1));
    let client = client_config(&ca, leaf, &[&TLS13]);
    let (mut sender, conn) = h2_client(connect(server.addr, &client, b"h2").await).await;
    assert_eq!(get(&mut sender, "/").await.unwrap(), StatusCode::OK);
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "the connection outlived its client certificate: {ended:?}"
    );
}

/// An HTTP/1.1 keep-alive connection is closed at its maximum age too.
#[tokio::test]
async fn a_kept_alive_http1_connection_is_closed_at_its_max_age() {
    let ca = TestCa::new("Athenz Root");
    let config =
        crate::tls::server_config(server_identity(&ca), std::slice::from_ref(&ca.cert)).unwrap();
    let server = serve(config, limits(Duration::from_millis(300))).await;
    let client = client_config(&ca, ca.leaf("k8s.nodes.node-1", &[]), &[&TLS13]);
    let mut tls = connect(server.addr, &client, b"http/1.1").await;
    tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tls.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let rest = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf)).await;
    assert!(rest.is_ok(), "the keep-alive connection was never closed");
}

/// A TLS 1.2 session resumed after its client certificate expired is refused: the connection is
/// closed before any request reaches the handler, and counted as a refused handshake.
#[tokio::test]
async fn a_resumed_session_past_its_certificate_is_closed_before_any_request() {
    let clock = ManualClock::starting_now();
    let start = clock.now().as_secs();
    let ca = TestCa::new("Athenz Root");
    let config = server_config_on_clock(
        server_identity(&ca),
        ClientCas::Fixed(std::slice::from_ref(&ca.cert), ClientAuth::Required),
        clock.clone(),
    )
    .unwrap();
    let server = serve(config, ServerLimits::default()).await;
    let leaf = ca.leaf_between("sys.auth.zts", &[], secs(start - 60), secs(start + 100));
    let client = client_config(&ca, leaf, &[&TLS12]);
    let request = b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
    let mut out = Vec::new();
    let mut tls = connect(server.addr, &client, b"http/1.1").await;
    tls.write_all(request).await.unwrap();
    tls.read_to_end(&mut out).await.unwrap();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));

    clock.advance(Duration::from_secs(200));
    let mut tls = connect(server.addr, &client, b"http/1.1").await;
    assert_eq!(
        tls.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed)
    );
    let _ = tls.write_all(request).await;
    out.clear();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 1);
    let metrics = crate::telemetry::encode_metrics(&server.registry).unwrap();
    assert!(
        metrics.contains(r#"tls_handshakes_total{version="1.2",kind="refused"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tls_handshakes_total{version="1.2",kind="full"} 1"#),
        "{metrics}"
    );
}

#[test]
fn the_age_is_the_lesser_of_the_limit_and_the_certificate() {
    let limit = MAX_CONNECTION_AGE;
    assert_eq!(max_age(limit, None), limit);
    assert_eq!(
        max_age(limit, Some(Duration::from_secs(30))),
        Duration::from_secs(30)
    );
    assert_eq!(max_age(limit, Some(Duration::from_secs(3600))), limit);
    assert_eq!(max_age(limit, Some(Duration::ZERO)), Duration::ZERO);
}
