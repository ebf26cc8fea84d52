//! `CONNECT <zts host:port>` on the agent socket (docs/design.md §4.6): a byte tunnel to the
//! configured ZTS only, so a pod that makes its own key can refresh with ZTS itself (ZTS
//! authenticates a refresh by the instance's current certificate and key, which stay in the pod)
//! without a route of its own to ZTS. The agent splices bytes and decrypts nothing.
//!
//! Bound like every socket call: the header [`VOLUME_HEADER`] names the caller's volume and the
//! caller must be that volume's pod; tunnels at once are bounded, and each lives at most
//! [`Tunnel::lifetime`].

use crate::service::{Agent, fail};
use athenz_core::agent_api::{KeySource, VOLUME_HEADER};
use athenz_core::http::{Body, ConnInfo};
use athenz_core::volume::VolumeId;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
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

/// Answers a `CONNECT`: 200 and the spliced connection, or a refusal naming why.
pub async fn open(agent: &Agent, req: &mut Request<Bytes>, conn: &ConnInfo) -> Response<Body> {
    match checked_connect(agent, req, conn).await {
        Ok(zts) => {
            let upgrade = hyper::upgrade::on(req);
            let lifetime = agent.tunnel.lifetime;
            agent.metrics.tunnel("opened");
            tokio::spawn(async move {
                let (mut zts, _slot) = zts;
                let Ok(upgraded) = upgrade.await else {
                    return;
                };
                let mut pod = hyper_util::rt::TokioIo::new(upgraded);
                let spliced = tokio::time::timeout(
                    lifetime,
                    tokio::io::copy_bidirectional(&mut pod, &mut zts),
                )
                .await;
                if spliced.is_err() {
                    tracing::info!(?lifetime, "tunnel closed at its time limit");
                }
            });
            Response::new(Body::new(Bytes::new()))
        }
        Err(failure) => {
            agent
                .metrics
                .tunnel(if failure.status == StatusCode::SERVICE_UNAVAILABLE {
                    "unreachable"
                } else {
                    "refused"
                });
            tracing::info!(status = %failure.status, reason = %failure.message, "tunnel refused");
            failure.into_response()
        }
    }
}

/// The connection to ZTS and the slot it holds, once the caller may have it.
async fn checked_connect(
    agent: &Agent,
    req: &Request<Bytes>,
    conn: &ConnInfo,
) -> Result<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit), crate::service::Failure> {
    let tunnel = &agent.tunnel;
    // the caller first (the volume header names whom to check, as a route's path does); the
    // rest of the request is read only for the pod
    let id = req
        .headers()
        .get(VOLUME_HEADER)
        .ok_or_else(|| {
            fail(
                StatusCode::BAD_REQUEST,
                format!("a tunnel needs the {VOLUME_HEADER} header naming the caller's volume"),
            )
        })?
        .to_str()
        .ok()
        .map(VolumeId::parse)
        .ok_or_else(|| {
            fail(
                StatusCode::BAD_REQUEST,
                format!("{VOLUME_HEADER}: not text"),
            )
        })?
        .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("{VOLUME_HEADER}: {e}")))?;
    let (_, data) = agent.volume(&id)?;
    agent.check_peer(&id, &data, conn)?;
    if agent.key_source != KeySource::Pod {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "this agent runs with --key-source agent (KEY_SOURCE): it refreshes pods itself and \
             opens no tunnels; run the SIA with --key-source agent",
        ));
    }
    if !tunnel.is_target(req.uri().authority()) {
        return Err(fail(
            StatusCode::FORBIDDEN,
            format!(
                "tunnels go to ZTS ({}) only, not {}",
                tunnel.authority(),
                req.uri()
            ),
        ));
    }
    let slot = Arc::clone(&tunnel.slots).try_acquire_owned().map_err(|_| {
        fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many tunnels to ZTS open on this node",
        )
    })?;
    let target = (tunnel.host.as_str(), tunnel.port);
    let zts = tokio::time::timeout(
        tunnel.connect_timeout,
        tokio::net::TcpStream::connect(target),
    )
    .await
    .map_err(|_| {
        fail(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "ZTS ({}) did not accept a connection within {:?}",
                tunnel.authority(),
                tunnel.connect_timeout
            ),
        )
    })?
    .map_err(|e| {
        fail(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("ZTS ({}) unreachable: {e}", tunnel.authority()),
        )
    })?;
    let _ = zts.set_nodelay(true);
    Ok((zts, slot))
}
