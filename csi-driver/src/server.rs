//! Serves the CSI services on a Unix socket (gRPC over HTTP/2, no TLS: the socket's directory is
//! reachable by kubelet and the registrar only). Bounded: at most [`MAX_CONNECTIONS`] connections,
//! messages of at most [`MAX_MESSAGE`] bytes.

use crate::Issuer;
use crate::service::CsiService;
use athenz_core::csi::v1::{identity_server::IdentityServer, node_server::NodeServer};
use athenz_core::unix_socket::{self, Access, BindError, Limits};
use std::future::Future;
use std::path::Path;
use tonic::codegen::Service;

/// Largest gRPC message accepted (kubelet's publish requests are under 2 KiB).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most connections served at once (kubelet keeps one; the registrar and probe one each).
pub const MAX_CONNECTIONS: usize = 64;

/// Binds `socket` (a stale one from a crashed run is replaced; the directory is made 0750 if
/// missing; the socket is 0660: kubelet and the registrar run as root).
pub fn bind(socket: &Path) -> Result<tokio::net::UnixListener, BindError> {
    unix_socket::bind(
        socket,
        Access {
            mode: 0o660,
            gid: None,
        },
    )
}

/// Serves `service` on `listener` until `stop` completes, then lets open calls finish.
pub async fn serve<I: Issuer>(
    listener: tokio::net::UnixListener,
    service: CsiService<I>,
    stop: impl Future<Output = ()>,
) {
    let identity = IdentityServer::new(service.clone()).max_decoding_message_size(MAX_MESSAGE);
    let node = NodeServer::new(service).max_decoding_message_size(MAX_MESSAGE);
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
    let limits = Limits {
        connections: MAX_CONNECTIONS,
        streams_per_connection: 64,
        grace: std::time::Duration::from_secs(10),
        name: "CSI",
    };
    unix_socket::serve_http2(listener, route, limits, stop).await;
}
