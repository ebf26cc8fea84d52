//! The agent's calls to the jwt-service (docs/design.md §4.3): an identity JWT for one pod,
//! over mutual TLS with the node's own certificate; its refusal is final (403), its trouble
//! "try again" (503).

use crate::service::{Agent, Failure, fail};
use athenz_core::identity_jwt::{JwtRequest, JwtResponse};
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use http::StatusCode;

impl Agent {
    pub(crate) async fn jwt(&self, subject: &PodSubject) -> Result<Secret, Failure> {
        let started = std::time::Instant::now();
        let result = self.jwt_call(subject).await;
        self.metrics.observe("jwt_service", started);
        result
    }

    async fn jwt_call(&self, subject: &PodSubject) -> Result<Secret, Failure> {
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
            .jwt_client
            .post(&self.jwt_url)
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
