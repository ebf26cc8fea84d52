//! gRPC (HTTP/2 without TLS) servers on a Unix socket: the CSI driver the agent serves to kubelet
//! and the SDS server the refresh sidecar serves to Envoy. Who may connect is decided by the
//! socket file's owner, group and mode, so binding sets them before anyone can use it; serving
//! is bounded in connections and streams and stops promptly.

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why a socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("socket {path}: {reason}")]
pub struct BindError {
    /// The socket path.
    pub path: PathBuf,
    /// What failed.
    pub reason: String,
}

/// Who may connect: the socket's mode, and the group it is given (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Permission bits of the socket file (connecting needs write permission).
    pub mode: u32,
    /// The socket's group, if not the process's own.
    pub gid: Option<u32>,
}

/// Binds `socket`: its directory is made (0750) if missing, a stale socket from a crashed run is
/// replaced, anything else at the path is left alone and refused. The socket is bound under a
/// temporary name beside it, given `access`, and only then renamed into place, so a client never
/// finds it at its path with the umask's mode or the wrong group (it would be refused, or worse,
/// let in before the group is set).
pub fn bind(socket: &Path, access: Access) -> Result<tokio::net::UnixListener, BindError> {
    let fail = |reason: String| BindError {
        path: socket.to_owned(),
        reason,
    };
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(|e| fail(format!("creating its directory: {e}")))?;
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            tracing::info!(socket = %socket.display(), "replacing a stale socket");
        }
        Ok(_) => return Err(fail("exists and is not a socket; not replaced".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    // Short, so that a socket path that fits `sun_path` still fits with this name.
    let staging = dir.join(format!(".~{}", std::process::id()));
    match std::fs::remove_file(&staging) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(format!("{}: {e}", staging.display()))),
    }
    let staged = stage(&staging, access).map_err(|reason| {
        // best effort: nothing half-made is left beside the socket
        let _ = std::fs::remove_file(&staging);
        fail(reason)
    })?;
    std::fs::rename(&staging, socket).map_err(|e| {
        let _ = std::fs::remove_file(&staging);
        fail(format!("moving it into place: {e}"))
    })?;
    Ok(staged)
}

/// Binds `staging` and gives it `access`.
fn stage(staging: &Path, access: Access) -> Result<tokio::net::UnixListener, String> {
    let listener = tokio::net::UnixListener::bind(staging)
        .map_err(|e| format!("binding {}: {e}", staging.display()))?;
    if let Some(gid) = access.gid {
        std::os::unix::fs::chown(staging, None, Some(gid))
            .map_err(|e| format!("giving it group {gid}: {e}"))?;
    }
    std::fs::set_permissions(staging, std::fs::Permissions::from_mode(access.mode))
        .map_err(|e| format!("setting mode {:o}: {e}", access.mode))?;
    Ok(listener)
}

/// Bounds of an HTTP/2 server on a Unix socket.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more wait in the socket's backlog until one closes.
    pub connections: usize,
    /// Concurrent streams (calls) on one connection.
    pub streams_per_connection: u32,
    /// How long open calls may run on after the stop.
    pub grace: Duration,
    /// What the log calls this server.
    pub name: &'static str,
}

/// The largest header list (RFC 9113 6.5.2: names, values and 32 per field) these servers
/// accept (the gRPC requests they serve carry a few hundred bytes of headers). The
/// `:authority` normalizer in front of the registration server stops decoding at the same
/// number, so it never decodes what the server would refuse.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;

/// Serves `service` (HTTP/2 only: gRPC) on `listener` within `limits` until `stop` completes, then
/// lets open calls finish for at most `limits.grace`.
pub async fn serve_http2<S, B>(
    listener: tokio::net::UnixListener,
    service: S,
    limits: Limits,
    stop: impl Future<Output = ()>,
) where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_http2_adapted(listener, service, limits, stop, |stream| stream).await;
}

/// [`serve_http2`] for clients that send a socket path as `:authority` (a kubelet's
/// plugin-registration client): each connection goes through
/// [`super::h2_authority::normalize`] first, which decodes header lists only up to the server's
/// own [`MAX_HEADER_LIST_SIZE`].
pub async fn serve_http2_normalizing_authority<S, B>(
    listener: tokio::net::UnixListener,
    service: S,
    limits: Limits,
    stop: impl Future<Output = ()>,
) where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_http2_adapted(listener, service, limits, stop, |stream| {
        super::h2_authority::normalize(
            stream,
            super::h2_authority::Bounds::new(MAX_HEADER_LIST_SIZE),
        )
    })
    .await;
}

async fn serve_http2_adapted<S, B, A, IO>(
    listener: tokio::net::UnixListener,
    service: S,
    limits: Limits,
    stop: impl Future<Output = ()>,
    adapt: A,
) where
    A: Fn(tokio::net::UnixStream) -> IO,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let graceful = GracefulShutdown::new();
    let builder = {
        let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        b.http2()
            .max_concurrent_streams(limits.streams_per_connection)
            .max_header_list_size(MAX_HEADER_LIST_SIZE);
        b.http2_only()
    };
    tokio::pin!(stop);
    loop {
        // A slot first, then the connection: past the limit, new connections wait in the
        // socket's backlog until one closes (kubelet mounts a whole node's pods at once after a
        // restart; refusing them would cost each its retry backoff).
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(server = limits.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let conn = builder
            .serve_connection(TokioIo::new(adapt(stream)), service.clone())
            .into_owned();
        let conn = graceful.watch(conn);
        let name = limits.name;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(server = name, error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    if tokio::time::timeout(limits.grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            server = limits.name,
            grace = ?limits.grace,
            "calls still open after the grace period; closing"
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const PRIVATE: Access = Access {
        mode: 0o600,
        gid: None,
    };

    /// Past the connection bound a new connection is neither refused nor served: it waits in the
    /// socket's backlog and is served as soon as an earlier one closes; the stop ends the loop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_past_the_bound_wait_and_are_served_in_turn() {
        use http_body_util::{BodyExt, Full};
        use hyper_util::rt::TokioIo;
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("h2.sock");
        let listener = bind(&socket, PRIVATE).unwrap();
        let service = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                bytes::Bytes::from_static(b"served"),
            )))
        });
        let stop = crate::daemon::Shutdown::new();
        let limits = Limits {
            connections: 1,
            streams_per_connection: 4,
            grace: Duration::from_secs(1),
            name: "test",
        };
        let server = tokio::spawn(serve_http2(listener, service, limits, stop.wait()));

        // an HTTP/2 client connection; the returned task drives it until it is dropped
        let connect = |path: PathBuf| async move {
            let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
            let (sender, conn) = hyper::client::conn::http2::handshake::<_, _, Full<bytes::Bytes>>(
                hyper_util::rt::TokioExecutor::new(),
                TokioIo::new(stream),
            )
            .await
            .unwrap();
            (sender, tokio::spawn(conn))
        };
        let get = |mut sender: hyper::client::conn::http2::SendRequest<Full<bytes::Bytes>>| async move {
            let req = http::Request::get("http://x/")
                .body(Full::default())
                .unwrap();
            let res = sender.send_request(req).await.unwrap();
            res.into_body().collect().await.unwrap().to_bytes()
        };
        let (first, first_conn) = connect(socket.clone()).await;
        assert_eq!(get(first.clone()).await, "served");
        // the second connects (the kernel's backlog accepts it) but is not answered while the
        // first holds the only slot
        let (second, _second_conn) = connect(socket.clone()).await;
        let waiting = tokio::spawn(get(second));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "served past the connection bound");
        drop(first);
        first_conn.abort();
        let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting connection was never served")
            .unwrap();
        assert_eq!(answer, "served");
        stop.trigger();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server did not stop")
            .unwrap();
    }

    /// A client watching the path never finds the socket with any mode but the final one (it
    /// used to appear with the umask's mode until the chmod), and nothing is left beside it.
    #[tokio::test]
    async fn the_socket_appears_only_with_its_final_mode() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("watched.sock");
        let done = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicU32::new(0));
        let watcher = {
            let (socket, done, seen) = (socket.clone(), Arc::clone(&done), Arc::clone(&seen));
            std::thread::spawn(move || {
                let mut wrong = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    if let Ok(meta) = std::fs::symlink_metadata(&socket) {
                        seen.fetch_add(1, Ordering::Relaxed);
                        if meta.mode() & 0o777 != 0o600 {
                            wrong.push(meta.mode() & 0o777);
                        }
                    }
                }
                wrong
            })
        };
        // On a loaded machine the watcher thread may not run at all during a fixed number of
        // binds, so bind until it has looked often enough to have caught a wrong mode, within a
        // deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut binds = 0u32;
        while binds < 300
            || (seen.load(Ordering::Relaxed) < 100 && std::time::Instant::now() < deadline)
        {
            let listener = bind(&socket, PRIVATE).unwrap();
            drop(listener);
            std::fs::remove_file(&socket).unwrap();
            binds += 1;
        }
        done.store(true, Ordering::Relaxed);
        let wrong = watcher.join().unwrap();
        let seen = seen.load(Ordering::Relaxed);
        assert!(seen > 0, "the watcher never saw the socket");
        assert!(
            wrong.is_empty(),
            "seen {} times with another mode, first {:o}",
            wrong.len(),
            wrong.first().copied().unwrap_or_default()
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        // and the socket bound this way is served at its final path
        let listener = bind(&socket, PRIVATE).unwrap();
        let client = tokio::net::UnixStream::connect(&socket);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        accepted.unwrap();
        connected.unwrap();
    }

    #[tokio::test]
    async fn binds_with_the_mode_and_replaces_only_a_stale_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("made/on/demand/s.sock");
        let first = bind(&socket, PRIVATE).unwrap();
        let meta = std::fs::metadata(&socket).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(socket.parent().unwrap()).unwrap().mode() & 0o777,
            0o750
        );
        drop(first);
        // the socket of a crashed run is replaced
        let again = bind(
            &socket,
            Access {
                mode: 0o660,
                gid: Some(nix::unistd::getegid().as_raw()),
            },
        )
        .unwrap();
        assert_eq!(std::fs::metadata(&socket).unwrap().mode() & 0o777, 0o660);
        drop(again);

        // a regular file at the path is somebody's data: refused and kept
        let file = tmp.path().join("data");
        std::fs::write(&file, b"keep me").unwrap();
        let err = bind(&file, PRIVATE).unwrap_err();
        assert!(err.to_string().contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    }
}
