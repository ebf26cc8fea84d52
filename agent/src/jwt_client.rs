//! The agent's calls to the jwt-service (docs/design.md §4.3): an identity JWT for one pod,
//! over mutual TLS with the node's own certificate; its refusal is final (403), its trouble
//! "try again" (503).

use crate::failure::{Failure, fail};
use crate::node_identity::NodeIdentity;
use athenz_core::identity_jwt::{JWT_PATH, JwtRequest, JwtResponse};
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use http::StatusCode;
use std::sync::Arc;

/// The jwt-service, called with the node's certificate.
pub struct JwtClient {
    http: reqwest::Client,
    url: String,
    node: Arc<NodeIdentity>,
}

impl JwtClient {
    /// Calls the jwt-service at `base_url` with `http` (whose TLS presents `node`'s certificate).
    pub fn new(http: reqwest::Client, base_url: &str, node: Arc<NodeIdentity>) -> Self {
        Self {
            http,
            url: format!("{}{JWT_PATH}", base_url.trim_end_matches('/')),
            node,
        }
    }

    /// An identity JWT for `subject`: 503 while the node has no valid identity (the
    /// jwt-service would refuse it) or the jwt-service is in trouble, 403 when it refuses.
    pub async fn jwt(&self, subject: &PodSubject) -> Result<Secret, Failure> {
        if !self.node.ensure_valid().await {
            return Err(fail(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the agent has no valid node identity for {} yet (ZTS or the callback unreachable?)",
                    self.node.node_name()
                ),
            ));
        }
        let resp = self
            .http
            .post(&self.url)
            .json(&JwtRequest {
                subject: subject.clone(),
            })
            .send()
            .await
            .map_err(|e| {
                fail(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("jwt-service: {}", athenz_core::client::error_chain(&e)),
                )
            })?;
        let status = resp.status();
        let body = athenz_core::client::read_limited(resp, 64 * 1024)
            .await
            .map_err(|e| fail(StatusCode::SERVICE_UNAVAILABLE, format!("jwt-service: {e}")))?;
        if !status.is_success() {
            let why = String::from_utf8_lossy(&body).into_owned();
            // its refusal is final (403); its trouble is "try again" (503)
            return Err(fail(
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::FORBIDDEN
                },
                format!("jwt-service answered {status}: {why}"),
            ));
        }
        serde_json::from_slice::<JwtResponse>(&body)
            .map(|r| r.jwt)
            .map_err(|e| {
                fail(
                    StatusCode::BAD_GATEWAY,
                    format!("jwt-service answered: {e}"),
                )
            })
    }
}
