//! A TLS connection's acceptance: the handshake within its time limit, the check of a resumed
//! session against the server's verifier now (docs/design.md §6), the handshake metrics, who is
//! calling, and how long the connection may live on its client certificate.

use super::Peer;
use super::{ConnInfo, HttpMetrics, PinnedPeer, ServerLimits, conn_age};
use crate::tls::ResumedSessionCheck;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A TLS server's acceptor, and the check of its resumed sessions.
#[derive(Clone)]
pub(super) struct TlsServing {
    pub(super) acceptor: TlsAcceptor,
    pub(super) check: Arc<ResumedSessionCheck>,
}

/// A TLS connection ready to serve.
pub(super) struct Accepted {
    pub(super) stream: TlsStream<TcpStream>,
    /// Whether ALPN chose HTTP/2.
    pub(super) h2: bool,
    pub(super) conn: ConnInfo,
    /// How long it may be served: the lesser of the limit and its client certificate's life.
    pub(super) max_age: Duration,
}

impl TlsServing {
    /// The connection's handshake and checks; `None` when it is refused (logged, and counted
    /// when it is a resumed session refused), timed out or failed.
    pub(super) async fn accept(
        &self,
        tcp: TcpStream,
        peer: Peer,
        peer_process: Option<PinnedPeer>,
        limits: &ServerLimits,
        metrics: Option<&HttpMetrics>,
    ) -> Option<Accepted> {
        let stream =
            match tokio::time::timeout(limits.handshake_timeout, self.acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::info!(?peer, error = %e, "TLS handshake refused");
                    return None;
                }
                Err(_) => {
                    tracing::info!(?peer, "TLS handshake timed out");
                    return None;
                }
            };
        let session = stream.get_ref().1;
        let verdict = self.check.check(session);
        if let Some(metrics) = metrics {
            metrics.record_handshake(session, verdict.is_err());
        }
        if let Err(e) = verdict {
            tracing::warn!(?peer, error = %e, "resumed TLS session refused");
            refuse(stream, limits.handshake_timeout).await;
            return None;
        }
        let leaf = crate::tls::peer_leaf(session);
        let max_age = conn_age::max_age(
            limits.max_connection_age,
            leaf.as_ref()
                .map(|info| self.check.time_left(info.not_after)),
        );
        let principal = leaf
            .as_ref()
            .map(|info| info.common_name.clone())
            .filter(|cn| !cn.is_empty());
        let peer_uris = leaf.map(|info| info.uris).unwrap_or_default();
        let peer_certificate = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|c| c.clone().into_owned());
        let h2 = session.alpn_protocol() == Some(b"h2");
        Some(Accepted {
            stream,
            h2,
            conn: ConnInfo {
                peer,
                principal,
                peer_certificate,
                peer_uris,
                peer_process,
            },
            max_age,
        })
    }
}

/// Closes a connection whose resumed session was refused, before reading anything from it: a
/// TLS close_notify, within `limit`.
async fn refuse(mut stream: TlsStream<TcpStream>, limit: Duration) {
    let _ = tokio::time::timeout(limit, stream.shutdown()).await;
}
