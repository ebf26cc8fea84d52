//! `POST /v1/jwt`: the allow-listed caller (a node agent) names a pod; the answer is a signed
//! identity JWT vouching for it (docs/design.md §4.3).

use crate::keys::KeyDir;
use athenz_core::http::{Body, ConnInfo, Handler, error_response, json_response};
use athenz_core::identity_jwt::{IdentityClaims, JWT_PATH, JwtRequest, JwtResponse};
use athenz_core::names::{instance_id_in_uris, validate_node_name};
use athenz_core::secret::Secret;
use athenz_core::tls::PrincipalAllowList;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Labels of the issued-token counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuedLabels {
    /// `ES256` or `RS256`.
    pub alg: &'static str,
}

/// Labels of the refusal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Why: `principal`, `node`, `subject`.
    pub reason: &'static str,
}

/// What the service counts.
#[derive(Clone, Debug, Default)]
pub struct JwtMetrics {
    issued: Family<IssuedLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
}

impl JwtMetrics {
    /// Registers the counters.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "jwts_issued",
            "Identity JWTs signed, by algorithm",
            m.issued.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests refused, by reason",
            m.refused.clone(),
        );
        m
    }
}

/// The handler.
pub struct JwtHandler {
    /// Signing keys.
    pub keys: Arc<KeyDir>,
    /// Who may ask.
    pub allowed: PrincipalAllowList,
    /// The provider whose instance-id URI in the caller's certificate names its node.
    pub provider: String,
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audience: String,
    /// `exp - iat`.
    pub lifetime: Duration,
    /// Counters.
    pub metrics: JwtMetrics,
}

impl JwtHandler {
    /// The node named by the caller's certificate: its one `athenz://instanceid/<provider>/<node>`
    /// URI, a valid node name. Nothing in the request can change it.
    pub fn caller_node(&self, conn: &ConnInfo) -> Result<String, String> {
        if conn.peer_certificate.is_none() {
            return Err("the caller presented no certificate".into());
        }
        let node = instance_id_in_uris(&conn.peer_uris, &self.provider).ok_or_else(|| {
            format!(
                "the caller's certificate names no node (no single athenz://instanceid/{}/<node> URI): only node agents' identities may ask",
                self.provider
            )
        })?;
        validate_node_name("node", node).map_err(|e| format!("the caller's certificate: {e}"))?;
        Ok(node.to_owned())
    }

    /// Signs a JWT for `request`, asked by the agent of `node`, now.
    pub fn issue(&self, request: &JwtRequest, node: &str) -> Result<Secret, String> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let claims = IdentityClaims {
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            sub: request.subject.to_uri(),
            iat: now,
            nbf: now,
            exp: now + i64::try_from(self.lifetime.as_secs()).unwrap_or(300),
            jti: athenz_core::random::hex_name::<16>(),
            node: node.to_owned(),
        };
        let key = self.keys.active();
        let jwt = key.signer.sign(&key.kid, &claims)?;
        self.metrics
            .issued
            .get_or_create(&IssuedLabels {
                alg: key.signer.alg(),
            })
            .inc();
        Ok(Secret::new(jwt))
    }
}

impl Handler for JwtHandler {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        if req.uri().path() != JWT_PATH {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        }
        if req.method() != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        }
        let principal = conn.principal.as_deref().unwrap_or("");
        if !self.allowed.allows(principal) {
            tracing::warn!(%principal, peer = ?conn.peer, "refused a caller that is not allowed");
            self.metrics
                .refused
                .get_or_create(&RefusedLabels {
                    reason: "principal",
                })
                .inc();
            return error_response(
                StatusCode::FORBIDDEN,
                format!("principal {principal:?} may not request identity JWTs"),
            );
        }
        let node = match self.caller_node(&conn) {
            Ok(node) => node,
            Err(why) => {
                tracing::warn!(%principal, peer = ?conn.peer, reason = %why, "refused a caller without a node identity");
                self.metrics
                    .refused
                    .get_or_create(&RefusedLabels { reason: "node" })
                    .inc();
                return error_response(StatusCode::FORBIDDEN, why);
            }
        };
        let request: JwtRequest = match serde_json::from_slice(req.body()) {
            Ok(r) => r,
            Err(e) => {
                self.metrics
                    .refused
                    .get_or_create(&RefusedLabels { reason: "subject" })
                    .inc();
                return error_response(StatusCode::BAD_REQUEST, format!("invalid request: {e}"));
            }
        };
        match self.issue(&request, &node) {
            Ok(jwt) => {
                tracing::debug!(subject = %request.subject, %principal, %node, "identity JWT issued");
                json_response(StatusCode::OK, &JwtResponse { jwt })
            }
            Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, e),
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        if req.uri.path() == JWT_PATH {
            "jwt"
        } else {
            "other"
        }
    }
}
