//! The socket's routes (docs/design.md §4.2): which call a request is, who is calling, and the
//! answer it gets. The work of each call lives beside it (`socket`, `pod_keys`, `tunnel`).

use super::Agent;
use crate::failure::{Failure, fail};
use athenz_core::agent_api::{AgentRoute, KeySource, VOLUME_HEADER};
use athenz_core::http::{Body, ConnInfo, Handler, Peer, error_response, json_response};
use athenz_core::volume::VolumeId;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use serde::Serialize;
use std::sync::Arc;

/// The socket handler.
pub struct AgentHandler {
    /// The agent.
    pub agent: Arc<Agent>,
}

/// A successful call's answer, logged with what it says.
fn answered<T: Serialize>(verb: &'static str, id: &str, who: &Who, answer: &T) -> Response<Body> {
    tracing::info!(verb, %id, pid = ?who.pid, uid = ?who.uid, "answered");
    json_response(StatusCode::OK, answer)
}

/// The caller, for the log.
struct Who {
    pid: Option<i32>,
    uid: Option<u32>,
}

impl Handler for AgentHandler {
    async fn handle(&self, mut req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        if req.method() == Method::CONNECT {
            return open_tunnel(&self.agent, &mut req, &conn).await;
        }
        let path = req.uri().path().to_owned();
        if path == "/healthz" {
            return json_response(StatusCode::OK, &"ok");
        }
        let route = match AgentRoute::parse(&path) {
            None => return error_response(StatusCode::NOT_FOUND, "no such route"),
            Some(Err(e)) => return error_response(StatusCode::BAD_REQUEST, e.to_string()),
            Some(Ok(r)) => r,
        };
        if *req.method() != route.method() {
            return error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("use {}", route.method()),
            );
        }
        let who = match conn.peer {
            Peer::Unix { pid, uid, .. } => Who {
                pid,
                uid: Some(uid),
            },
            Peer::Tcp(_) => Who {
                pid: None,
                uid: None,
            },
        };
        let agent = &self.agent;
        let id = route.volume().to_string();
        let verb = route.name();
        let body = req.body();
        let result: Result<Response<Body>, Failure> = match &route {
            AgentRoute::Init(v) => agent.init(v, body, &conn).await.map(|answer| {
                tracing::info!(verb, %id, pid = ?who.pid, uid = ?who.uid, expires = %answer.expires_at, "identity issued");
                json_response(StatusCode::OK, &answer)
            }),
            AgentRoute::Refresh(v) => agent.refresh(v, body, &conn).await.map(|answer| {
                tracing::info!(verb, %id, pid = ?who.pid, uid = ?who.uid, expires = %answer.expires_at, "identity issued");
                json_response(StatusCode::OK, &answer)
            }),
            AgentRoute::Csr(v) => agent
                .csr_template(v, &conn)
                .await
                .map(|t| answered(verb, &id, &who, &t)),
            AgentRoute::Attestation(v) => agent
                .attestation(v, body, &conn)
                .await
                .map(|a| answered(verb, &id, &who, &a)),
            AgentRoute::Certificate(v) => agent
                .record_certificate(v, body, &conn)
                .await
                .map(|()| answered(verb, &id, &who, &serde_json::json!({}))),
        };
        agent
            .manager
            .record_outcome(route.volume(), result.as_ref().err());
        match result {
            Ok(response) => response,
            Err(failure) => {
                tracing::info!(verb, %id, pid = ?who.pid, uid = ?who.uid, status = %failure.status, reason = %failure.message, "refused");
                failure.into_response()
            }
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        if req.method == Method::CONNECT {
            return "tunnel";
        }
        match AgentRoute::parse(req.uri.path()) {
            Some(Ok(route)) => route.name(),
            _ if req.uri.path() == "/healthz" => "healthz",
            _ => "other",
        }
    }
}

/// Answers a `CONNECT` (docs/design.md §4.6): the caller is checked first (the volume header
/// names whom to check, as a route's path does), then the tunnel to ZTS is opened: 200 and the
/// spliced connection, or a refusal naming why.
async fn open_tunnel(agent: &Agent, req: &mut Request<Bytes>, conn: &ConnInfo) -> Response<Body> {
    let opened = match authorize_tunnel(agent, req, conn) {
        Ok(()) => agent.tunnel.connect(req.uri()).await,
        Err(refused) => Err(refused),
    };
    match opened {
        Ok(zts) => {
            agent.metrics.tunnel("opened");
            agent.tunnel.splice(hyper::upgrade::on(req), zts);
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

/// The caller of a `CONNECT` is its volume's pod, and this agent lets pods refresh themselves.
fn authorize_tunnel(agent: &Agent, req: &Request<Bytes>, conn: &ConnInfo) -> Result<(), Failure> {
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
    agent.attestor.caller(&id, conn)?;
    if agent.key_source != KeySource::Pod {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "this agent runs with --key-source agent (KEY_SOURCE): it refreshes pods itself and \
             opens no tunnels; run the SIA with --key-source agent",
        ));
    }
    Ok(())
}
