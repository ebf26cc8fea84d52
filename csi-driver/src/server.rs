//! Serves the CSI services on a Unix socket (gRPC over HTTP/2, no TLS: the socket's directory is
//! reachable by kubelet and the registrar only). Bounded: at most [`MAX_CONNECTIONS`] connections,
//! messages of at most [`MAX_MESSAGE`] bytes.

use crate::Issuer;
use crate::service::CsiService;
use athenz_core::csi::v1::{identity_server::IdentityServer, node_server::NodeServer};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::codegen::Service;

/// Largest gRPC message accepted (kubelet's publish requests are under 2 KiB).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most connections served at once (kubelet keeps one; the registrar and probe one each).
pub const MAX_CONNECTIONS: usize = 64;

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
#[error("CSI socket {path}: {source}")]
pub struct ServeError {
    /// The socket path.
    pub path: PathBuf,
    /// What failed.
    pub source: std::io::Error,
}

/// Binds `socket` (a stale one from a crashed run is replaced; the directory is made 0750 if
/// missing; the socket is 0660: kubelet and the registrar run as root).
pub fn bind(socket: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    let err = |source| ServeError {
        path: socket.to_owned(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => tracing::info!(socket = %socket.display(), "removed a stale CSI socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = tokio::net::UnixListener::bind(socket).map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660)).map_err(err)?;
    Ok(listener)
}

/// Serves `service` on `listener` until `stop` completes, then lets open calls finish.
pub async fn serve<I: Issuer>(
    listener: tokio::net::UnixListener,
    service: CsiService<I>,
    stop: impl Future<Output = ()>,
) {
    let identity = IdentityServer::new(service.clone()).max_decoding_message_size(MAX_MESSAGE);
    let node = NodeServer::new(service).max_decoding_message_size(MAX_MESSAGE);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let builder = {
        let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        b.http2()
            .max_concurrent_streams(64)
            .max_header_list_size(16 * 1024);
        b.http2_only()
    };
    tokio::pin!(stop);
    loop {
        // A slot first, then the connection: past the limit, new connections wait in the
        // socket's backlog until one closes (kubelet mounts a whole node's pods at once after a
        // restart; refusing them would cost each its 500 ms retry backoff).
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
                    tracing::warn!(error = %e, "CSI accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let (identity, node) = (identity.clone(), node.clone());
        let route = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let (mut identity, mut node) = (identity.clone(), node.clone());
            async move {
                let path = req.uri().path();
                if path.starts_with("/csi.v1.Identity/") {
                    identity.call(req).await
                } else if path.starts_with("/csi.v1.Node/") {
                    node.call(req).await
                } else {
                    Ok(tonic::Status::unimplemented(format!(
                        "csi.athenz.io serves csi.v1.Identity and csi.v1.Node only (asked {path})"
                    ))
                    .into_http())
                }
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), route)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "CSI connection ended");
            }
            drop(permit);
        });
    }
    if tokio::time::timeout(std::time::Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("CSI calls still open after 10 s; closing");
    }
}
