//! `CONNECT <zts host:port>` on the agent socket (docs/design.md §4.6): a byte tunnel to the
//! configured ZTS only, so a pod that makes its own key can refresh with ZTS itself (ZTS
//! authenticates a refresh by the instance's current certificate and key, which stay in the pod)
//! without a route of its own to ZTS. The agent splices bytes and decrypts nothing.
//!
//! Bound like every socket call: the caller is checked first, by the route
//! (`routes::open_tunnel`); tunnels at once are bounded, and each lives at most
//! [`Tunnel::lifetime`]. This module knows only where tunnels go and how bytes cross.

use crate::failure::{Failure, fail};
use http::StatusCode;
use hyper::upgrade::OnUpgrade;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Where tunnels go and how many may be open.
pub struct Tunnel {
    host: String,
    port: u16,
    slots: Arc<Semaphore>,
    /// The longest a tunnel stays open (a refresh takes one request).
    pub lifetime: Duration,
    /// Time allowed to connect to ZTS.
    pub connect_timeout: Duration,
}

impl Tunnel {
    /// Tunnels to the host and port of `zts_url` (`https://<host>[:port]/zts/v1`), at most
    /// `max_open` at once.
    pub fn new(
        zts_url: &str,
        max_open: usize,
        lifetime: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        let (host, port) = athenz_core::agent_api::zts_authority(zts_url)?;
        Ok(Self {
            host,
            port,
            slots: Arc::new(Semaphore::new(max_open.max(1))),
            lifetime,
            connect_timeout,
        })
    }

    /// `host:port`, as a `CONNECT` must name it.
    pub fn authority(&self) -> String {
        athenz_core::agent_api::format_authority(&self.host, self.port)
    }

    fn is_target(&self, authority: Option<&http::uri::Authority>) -> bool {
        authority.is_some_and(|a| {
            a.host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .eq_ignore_ascii_case(&self.host)
                && a.port_u16() == Some(self.port)
        })
    }
}

/// A connection to ZTS and the tunnel slot it holds.
pub struct ZtsConnection {
    stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Tunnel {
    /// Connects to ZTS for a `CONNECT` of `uri`, once its caller was authorized:
    /// refused unless it names ZTS, unavailable when every slot is taken or ZTS does not answer
    /// within [`Tunnel::connect_timeout`].
    pub async fn connect(&self, uri: &http::Uri) -> Result<ZtsConnection, Failure> {
        if !self.is_target(uri.authority()) {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!("tunnels go to ZTS ({}) only, not {}", self.authority(), uri),
            ));
        }
        let slot = Arc::clone(&self.slots).try_acquire_owned().map_err(|_| {
            fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many tunnels to ZTS open on this node",
            )
        })?;
        let target = (self.host.as_str(), self.port);
        let stream =
            tokio::time::timeout(self.connect_timeout, tokio::net::TcpStream::connect(target))
                .await
                .map_err(|_| {
                    fail(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "ZTS ({}) did not accept a connection within {:?}",
                            self.authority(),
                            self.connect_timeout
                        ),
                    )
                })?
                .map_err(|e| {
                    fail(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("ZTS ({}) unreachable: {e}", self.authority()),
                    )
                })?;
        let _ = stream.set_nodelay(true);
        Ok(ZtsConnection {
            stream,
            _slot: slot,
        })
    }

    /// Splices the caller's upgraded connection to `zts` in the background, for at most
    /// [`Tunnel::lifetime`]; the slot is released when either side closes.
    pub fn splice(&self, upgrade: OnUpgrade, zts: ZtsConnection) {
        let lifetime = self.lifetime;
        tokio::spawn(async move {
            let ZtsConnection {
                stream: mut zts,
                _slot,
            } = zts;
            let Ok(upgraded) = upgrade.await else {
                return;
            };
            let mut pod = hyper_util::rt::TokioIo::new(upgraded);
            let spliced =
                tokio::time::timeout(lifetime, tokio::io::copy_bidirectional(&mut pod, &mut zts))
                    .await;
            if spliced.is_err() {
                tracing::info!(?lifetime, "tunnel closed at its time limit");
            }
        });
    }
}
