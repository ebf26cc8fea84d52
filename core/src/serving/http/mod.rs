//! The small HTTP server layer every daemon uses (docs/design.md §4.8).
//!
//! One accept loop for TCP, TLS-over-TCP and Unix sockets that enforces, for every server alike:
//! a connection bound (accepting pauses at the bound), a TLS handshake timeout, a header read
//! timeout, a body size limit checked before the handler runs (413, chunked bodies included), a
//! body read timeout (408), JSON errors `{code,message}`, per-route request metrics, and a graceful
//! drain on shutdown. Handlers receive the whole body and who is calling ([`ConnInfo`]).
//!
//! A client certificate is trusted no longer than it is valid and its CA trusted (docs/design.md
//! §6): a resumed TLS session is verified again before its connection serves
//! ([`crate::tls::ResumedSessionCheck`]; refused ones are closed unread), and every connection is
//! closed gracefully at its maximum age or its client certificate's notAfter ([`conn_age`]).

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls_accept::TlsServing;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

mod conn_age;
mod metrics;
mod ops;
mod tls_accept;
pub use conn_age::MAX_CONNECTION_AGE;
pub use metrics::{HandshakeLabels, HttpMetrics, RequestLabels, RouteLabels};
pub use ops::{OpsHandler, Readiness, termination_signal, termination_signal_after};

/// The error body of every API in the system (and of ZTS): `{"code": <status>, "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// HTTP status code.
    pub code: i32,
    /// What went wrong, for a person.
    pub message: String,
}

/// Response body type of every handler.
pub type Body = Full<Bytes>;

/// A JSON response.
pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_else(|_| internal_error()),
        Err(_) => internal_error(),
    }
}

/// A JSON error response `{code, message}`.
pub fn error_response(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json_response(
        status,
        &ErrorBody {
            code: i32::from(status.as_u16()),
            message: message.into(),
        },
    )
}

/// A 503 that tells the client when to come back (seconds).
pub fn unavailable_response(message: impl Into<String>, retry_after: Duration) -> Response<Body> {
    let mut resp = error_response(StatusCode::SERVICE_UNAVAILABLE, message);
    let secs = retry_after.as_secs().max(1);
    if let Ok(value) = header::HeaderValue::from_str(&secs.to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, value);
    }
    resp
}

fn internal_error() -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(
        br#"{"code":500,"message":"internal error"}"#,
    )));
    *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    resp
}

/// Limits every server applies.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Time allowed for a request's headers (also bounds how long an idle keep-alive connection
    /// may wait for its next request).
    pub header_timeout: Duration,
    /// Time allowed to receive a request body.
    pub body_timeout: Duration,
    /// Time allowed for a TLS handshake.
    pub handshake_timeout: Duration,
    /// Most connections served at once; accepting pauses at the bound.
    pub max_connections: usize,
    /// How long shutdown waits for in-flight requests.
    pub grace: Duration,
    /// Longest a connection is served before it is closed gracefully ([`MAX_CONNECTION_AGE`]);
    /// a TLS connection is closed sooner when its client certificate expires.
    pub max_connection_age: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_body: 64 * 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
            grace: Duration::from_secs(20),
            max_connection_age: MAX_CONNECTION_AGE,
        }
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A TCP client.
    Tcp(SocketAddr),
    /// A process on the Unix socket, from `SO_PEERCRED`.
    Unix {
        /// Its pid, when the kernel reports it.
        pid: Option<i32>,
        /// Its uid.
        uid: u32,
        /// Its gid.
        gid: u32,
    },
}

/// What the handler knows about the connection a request came on.
#[derive(Debug)]
pub struct ConnInfo {
    /// The peer.
    pub peer: Peer,
    /// The client certificate's principal (CN), on TLS connections.
    pub principal: Option<String>,
    /// The client's leaf certificate (DER), on TLS connections where it presented one.
    pub peer_certificate: Option<rustls_pki_types::CertificateDer<'static>>,
    /// The URI SANs of that certificate (e.g. a node agent's `athenz://instanceid/...`), read
    /// once per connection.
    pub peer_uris: Vec<String>,
    /// On Unix sockets: the connecting process, pinned at accept so its pid cannot be confused
    /// with a later process's (or why it could not be pinned).
    pub peer_process: Option<PinnedPeer>,
}

/// A request handler: takes the whole request, answers a response.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(
        &self,
        req: Request<Bytes>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Response<Body>> + Send;

    /// The metrics label of a request's route (a fixed set, never raw paths).
    fn route(&self, _req: &http::request::Parts) -> &'static str {
        "other"
    }
}

/// Where a server listens.
#[derive(Debug)]
pub enum Listener {
    /// Plain TCP, or TLS over TCP when the server has an acceptor.
    Tcp(TcpListener),
    /// A Unix socket (the agent).
    Unix(UnixListener),
}

/// A configured server, ready to run.
pub struct Server<H> {
    listener: Listener,
    tls: Option<TlsServing>,
    handler: Arc<H>,
    limits: ServerLimits,
    metrics: Option<HttpMetrics>,
}

impl<H: Handler> Server<H> {
    /// A server on `listener` with `handler`.
    pub fn new(listener: Listener, handler: Arc<H>) -> Self {
        Self {
            listener,
            tls: None,
            handler,
            limits: ServerLimits::default(),
            metrics: None,
        }
    }

    /// Serves TLS (only on TCP listeners) with `tls`, from [`crate::tls::server_config`] or its
    /// siblings: its config accepts, and its check, made with the config's own verifier, refuses
    /// a resumed session whose client the verifier refuses now ([`crate::tls::ServerTls`],
    /// docs/design.md §6).
    pub fn with_tls(mut self, tls: crate::tls::ServerTls) -> Self {
        self.tls = Some(TlsServing {
            acceptor: TlsAcceptor::from(Arc::clone(tls.config())),
            check: Arc::clone(tls.resumed_sessions()),
        });
        self
    }

    /// Sets the limits.
    pub fn with_limits(mut self, limits: ServerLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Records request metrics.
    pub fn with_metrics(mut self, metrics: HttpMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Serves until `shutdown` completes, then stops accepting and waits up to the grace period
    /// for in-flight connections.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let max_connections = self.limits.max_connections.max(1);
        let slots = Arc::new(Semaphore::new(max_connections));
        // Shutdown is told to every connection through this channel; each drains its in-flight
        // request and closes. A connection holds a slot until it ends, so "every slot free" is
        // "every connection drained".
        let (stop_connections, stopping) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            handler: self.handler,
            limits: self.limits,
            metrics: self.metrics,
        });
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                accepted = accept(&self.listener) => accepted,
            };
            let (stream, peer, peer_process) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let watcher = stopping.clone();
            let shared = Arc::clone(&shared);
            let tls = self.tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match (stream, tls) {
                    (Stream::Tcp(tcp), Some(tls)) => {
                        let limits = &shared.limits;
                        let accepted = tls
                            .accept(tcp, peer, peer_process, limits, shared.metrics.as_ref())
                            .await;
                        if let Some(a) = accepted {
                            serve_connection(a.stream, a.h2, a.conn, a.max_age, shared, watcher)
                                .await;
                        }
                    }
                    (Stream::Tcp(tcp), None) => {
                        let conn = ConnInfo {
                            peer,
                            principal: None,
                            peer_certificate: None,
                            peer_uris: Vec::new(),
                            peer_process,
                        };
                        let max_age = shared.limits.max_connection_age;
                        serve_connection(tcp, false, conn, max_age, shared, watcher).await;
                    }
                    (Stream::Unix(unix), _) => {
                        let conn = ConnInfo {
                            peer,
                            principal: None,
                            peer_certificate: None,
                            peer_uris: Vec::new(),
                            peer_process,
                        };
                        let max_age = shared.limits.max_connection_age;
                        serve_connection(unix, false, conn, max_age, shared, watcher).await;
                    }
                }
            });
        }
        let _ = stop_connections.send(true);
        let drained = u32::try_from(max_connections).unwrap_or(u32::MAX);
        if tokio::time::timeout(self.limits.grace, slots.acquire_many(drained))
            .await
            .is_err()
        {
            tracing::warn!(
                grace = ?self.limits.grace,
                "connections still open after the grace period; closing them"
            );
        }
    }
}

struct Shared<H> {
    handler: Arc<H>,
    limits: ServerLimits,
    metrics: Option<HttpMetrics>,
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// A Unix socket peer's process, pinned at accept (see [`crate::peer`]).
pub type PinnedPeer = Result<crate::peer::PeerProcess, Arc<crate::peer::PeerError>>;

async fn accept(listener: &Listener) -> std::io::Result<(Stream, Peer, Option<PinnedPeer>)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            let _ = s.set_nodelay(true);
            Ok((Stream::Tcp(s), Peer::Tcp(addr), None))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let cred = s.peer_cred()?;
            let peer = Peer::Unix {
                pid: cred.pid(),
                uid: cred.uid(),
                gid: cred.gid(),
            };
            let pinned =
                crate::peer::PeerProcess::of_socket(&s, cred.pid().unwrap_or(0)).map_err(Arc::new);
            Ok((Stream::Unix(s), peer, Some(pinned)))
        }
    }
}

async fn serve_connection<H, I>(
    io: I,
    h2: bool,
    conn: ConnInfo,
    max_age: Duration,
    shared: Arc<Shared<H>>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(conn);
    let service = {
        let shared = Arc::clone(&shared);
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let shared = Arc::clone(&shared);
            let conn = Arc::clone(&conn);
            async move { Ok::<_, Infallible>(handle_request(req, conn, &shared).await) }
        })
    };
    // HTTP/2 only when TLS negotiated it (ALPN); otherwise HTTP/1.1. Choosing up front (rather
    // than hyper-util's `auto`, which sniffs the first bytes with no timeout) means the header
    // read timeout runs from the moment the connection is served, so idle connections cannot
    // hold the connection slots.
    let io = TokioIo::new(io);
    // Drives a connection until it ends; once shutdown is signalled or the connection reaches
    // its maximum age, asks it to finish its in-flight requests and close (an HTTP/2 GOAWAY, or
    // HTTP/1.1 `connection: close`): no new request is read, and the ones in flight finish.
    macro_rules! until_stopped {
        ($conn:expr) => {{
            let conn = $conn;
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => result,
                why = conn_age::closing(&mut stopping, max_age) => {
                    tracing::debug!(?why, "closing the connection gracefully");
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }};
    }
    let result = if h2 {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_header_list_size(64 * 1024)
            .max_concurrent_streams(128)
            .keep_alive_interval(Some(shared.limits.header_timeout))
            .keep_alive_timeout(shared.limits.header_timeout);
        until_stopped!(builder.serve_connection(io, service))
    } else {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(shared.limits.header_timeout)
            .max_buf_size(64 * 1024);
        // with upgrades: a handler may take the connection over (the agent's CONNECT tunnel);
        // the connection's slot is released once it has
        until_stopped!(builder.serve_connection(io, service).with_upgrades())
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

async fn handle_request<H: Handler>(
    req: Request<Incoming>,
    conn: Arc<ConnInfo>,
    shared: &Shared<H>,
) -> Response<Body> {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let route = shared.handler.route(&parts);
    let resp = match read_body(&parts, body, &shared.limits).await {
        Ok(bytes) => {
            shared
                .handler
                .handle(Request::from_parts(parts, bytes), conn)
                .await
        }
        Err(resp) => resp,
    };
    if let Some(m) = &shared.metrics {
        m.record(route, resp.status(), started.elapsed());
    }
    resp
}

/// Most bytes of an oversized body read and thrown away so its sender sees the 413: a client
/// still sending when the server closes gets a reset ("broken pipe"), not the answer. Beyond
/// this the connection is closed unread.
const MAX_DRAIN: u64 = 16 * 1024 * 1024;

/// Reads the whole body within the size and time limits, or answers 413 / 408 / 400.
///
/// An oversized body is answered 413 after reading and discarding the rest of it (up to
/// [`MAX_DRAIN`], within the body timeout), with `Connection: close`; a client that asked
/// `Expect: 100-continue` has sent nothing yet and gets the 413 at once.
async fn read_body(
    parts: &http::request::Parts,
    mut body: Incoming,
    limits: &ServerLimits,
) -> Result<Bytes, Response<Body>> {
    let too_large = || {
        let mut resp = error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {} bytes", limits.max_body),
        );
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        resp
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let expects_continue = parts
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    if declared.is_some_and(|len| len > limits.max_body as u64) {
        if !expects_continue && declared.is_some_and(|len| len <= MAX_DRAIN) {
            drain(&mut body, 0, deadline).await;
        }
        return Err(too_large());
    }
    let mut collected = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(error_response(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body did not arrive in time",
                ));
            }
            Ok(None) => return Ok(collected.freeze()),
            Ok(Some(Err(e))) => {
                return Err(error_response(
                    StatusCode::BAD_REQUEST,
                    format!("could not read the request body: {e}"),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limits.max_body {
                let seen = (collected.len() + data.len()) as u64;
                drain(&mut body, seen, deadline).await;
                return Err(too_large());
            }
            collected.extend_from_slice(&data);
        }
    }
}

/// Reads and discards the rest of `body` until it ends, [`MAX_DRAIN`] bytes were seen in all,
/// or `deadline`.
async fn drain(body: &mut Incoming, mut seen: u64, deadline: tokio::time::Instant) {
    while seen <= MAX_DRAIN {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    seen += data.len() as u64;
                }
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Echoes the body length and the peer kind.
    struct Echo;

    impl Handler for Echo {
        async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
            let kind = match conn.peer {
                Peer::Tcp(_) => "tcp".to_owned(),
                Peer::Unix { uid, pid, .. } => format!("unix uid={uid} pid={}", pid.is_some()),
            };
            json_response(
                StatusCode::OK,
                &serde_json::json!({"len": req.body().len(), "peer": kind}),
            )
        }

        fn route(&self, _req: &http::request::Parts) -> &'static str {
            "echo"
        }
    }

    async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    async fn start(limits: ServerLimits) -> (SocketAddr, Arc<Registry>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut registry = Registry::default();
        let metrics = HttpMetrics::register(&mut registry);
        let server = Server::new(Listener::Tcp(listener), Arc::new(Echo))
            .with_limits(limits)
            .with_metrics(metrics);
        tokio::spawn(server.serve(std::future::pending()));
        (addr, Arc::new(registry))
    }

    fn small() -> ServerLimits {
        ServerLimits {
            max_body: 100,
            header_timeout: Duration::from_millis(300),
            body_timeout: Duration::from_millis(300),
            ..ServerLimits::default()
        }
    }

    #[tokio::test]
    async fn bodies_within_the_limit_reach_the_handler() {
        let (addr, registry) = start(small()).await;
        let body = "x".repeat(100);
        let resp = raw_exchange(
            addr,
            format!("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{body}").as_bytes(),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.contains(r#""len":100"#), "{resp}");
        let metrics = crate::telemetry::encode_metrics(&registry).unwrap();
        assert!(
            metrics.contains(r#"http_requests_total{route="echo",status="200"} 1"#),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn declared_and_chunked_oversize_bodies_are_413() {
        let (addr, _) = start(small()).await;
        let resp = raw_exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 101\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
        assert!(resp.contains(r#""code":413"#), "{resp}");
        // chunked: 60 + 60 bytes, no content-length
        let chunk = "x".repeat(60);
        let req = format!(
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3c\r\n{chunk}\r\n3c\r\n{chunk}\r\n0\r\n\r\n"
        );
        let resp = raw_exchange(addr, req.as_bytes()).await;
        assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    }

    /// A client still sending an oversized body reads the 413 (the server read and discarded
    /// the rest) instead of a reset; one that waits on `Expect: 100-continue` gets it at once.
    #[tokio::test]
    async fn a_client_sending_an_oversized_body_reads_the_413() {
        let limits = ServerLimits {
            max_body: 64 * 1024,
            body_timeout: Duration::from_secs(10),
            ..ServerLimits::default()
        };
        let (addr, _) = start(limits).await;
        let body = vec![b'x'; 3 * 1024 * 1024];
        for framing in ["declared", "chunked"] {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = match framing {
                "declared" => format!(
                    "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                ),
                _ => "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".into(),
            };
            s.write_all(head.as_bytes()).await.unwrap();
            for piece in body.chunks(256 * 1024) {
                if framing == "chunked" {
                    s.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                        .await
                        .unwrap();
                    s.write_all(piece).await.unwrap();
                    s.write_all(b"\r\n").await.unwrap();
                } else {
                    s.write_all(piece).await.unwrap();
                }
            }
            if framing == "chunked" {
                s.write_all(b"0\r\n\r\n").await.unwrap();
            }
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
            let resp = String::from_utf8_lossy(&out);
            assert!(resp.starts_with("HTTP/1.1 413"), "{framing}: {resp}");
            assert!(resp.contains("connection: close"), "{framing}: {resp}");
        }
        let resp = raw_exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3145728\r\nexpect: 100-continue\r\n\r\n",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    }

    #[tokio::test]
    async fn slow_bodies_are_408_and_slow_headers_are_dropped() {
        let (addr, _) = start(small()).await;
        let resp = raw_exchange(
            addr,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\nconnection: close\r\n\r\nonly-part",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
        // headers never finished: the server closes the connection (no response or a 408)
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "connection with unfinished headers was kept open"
        );
        assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));
    }

    #[tokio::test]
    async fn idle_keep_alive_connections_are_closed() {
        let (addr, _) = start(small()).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // keep-alive: the server now waits for the next request, but not forever (300 ms limit)
        let rest = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        assert!(rest.is_ok(), "idle keep-alive connection was never closed");
    }

    #[tokio::test]
    async fn garbage_requests_get_no_handler_call() {
        let (addr, registry) = start(small()).await;
        let resp = raw_exchange(addr, b"\x16\x03\x01garbage\r\n\r\n").await;
        assert!(!resp.contains("200"), "{resp}");
        let metrics = crate::telemetry::encode_metrics(&registry).unwrap();
        assert!(!metrics.contains("status=\"200\""), "{metrics}");
    }

    #[tokio::test]
    async fn unix_socket_reports_peer_credentials() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = Server::new(Listener::Unix(listener), Arc::new(Echo));
        tokio::spawn(server.serve(std::future::pending()));
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let uid = nix_uid();
        assert!(out.contains(&format!("unix uid={uid} pid=true")), "{out}");
    }

    fn nix_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    }

    #[tokio::test]
    async fn connection_bound_pauses_accepting() {
        let limits = ServerLimits {
            max_connections: 1,
            ..small()
        };
        let (addr, _) = start(limits).await;
        // hold the only slot with an idle connection that has sent nothing
        let _held = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // the second connection is accepted by the kernel but served only after the first is
        // dropped by the header timeout (300 ms)
        let started = Instant::now();
        let resp = raw_exchange(
            addr,
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "served while the bound was reached"
        );
    }

    #[tokio::test]
    async fn ops_endpoints() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        registry.register("widgets", "test counter", counter.clone());
        counter.inc();
        let readiness = Readiness::default();
        let ops = OpsHandler::new(Arc::new(registry), readiness.clone());
        tokio::spawn(
            Server::new(Listener::Tcp(listener), Arc::new(ops)).serve(std::future::pending()),
        );
        let get = |path: &str| {
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").into_bytes()
        };
        assert!(
            raw_exchange(addr, &get("/healthz"))
                .await
                .starts_with("HTTP/1.1 200")
        );
        assert!(
            raw_exchange(addr, &get("/readyz"))
                .await
                .starts_with("HTTP/1.1 503")
        );
        readiness.set(true);
        assert!(
            raw_exchange(addr, &get("/readyz"))
                .await
                .starts_with("HTTP/1.1 200")
        );
        let metrics = raw_exchange(addr, &get("/metrics")).await;
        assert!(metrics.contains("widgets_total 1"), "{metrics}");
        assert!(
            raw_exchange(addr, &get("/nope"))
                .await
                .starts_with("HTTP/1.1 404")
        );
    }

    #[tokio::test]
    async fn shutdown_stops_accepting() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(Server::new(Listener::Tcp(listener), Arc::new(Echo)).serve(
            async {
                let _ = rx.await;
            },
        ));
        assert!(
            raw_exchange(
                addr,
                b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            )
            .await
            .starts_with("HTTP/1.1 200")
        );
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn error_and_retry_after_shapes() {
        let resp = unavailable_response("pod has no IP yet", Duration::from_millis(1500));
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let body: ErrorBody = serde_json::from_slice(&futures_body(resp.into_body())).unwrap();
        assert_eq!(
            body,
            ErrorBody {
                code: 503,
                message: "pod has no IP yet".into()
            }
        );
    }

    fn futures_body(body: Body) -> Bytes {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async { body.collect().await.unwrap().to_bytes() })
    }
}
