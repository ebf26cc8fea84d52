//! The socket's `POST /v1/init/{id}` and `POST /v1/refresh/{id}` (docs/design.md §4.2): the
//! volume's lock, then the caller checked to be the volume's pod before anything of its request
//! is read, the pod attested by the kubelet's list, and the manager issues in real time.

use super::Agent;
use super::COALESCE;
use crate::failure::{Failure, fail};
use crate::manager::{KeyRequest, Priority};
use athenz_core::agent_api::{IdentityResponse, InitRequest, KeySource, RefreshRequest};
use athenz_core::crypto::CsrInfo;
use athenz_core::http::ConnInfo;
use athenz_core::issuance::Registration;
use athenz_core::volume::VolumeId;
use http::StatusCode;

impl Agent {
    /// `POST /v1/init/{id}`: with the pod's CSR when the agent runs with pod-made keys, with
    /// none (`{}`) when it makes the key.
    pub async fn init(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<IdentityResponse, Failure> {
        // the caller first: nothing of the request is read for a process that is not the pod
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        let data = self.attestor.caller(id, conn)?;
        // an empty body is `{}`: what clients before pod-made keys could send
        let body = if body.is_empty() { b"{}" } else { body };
        let request: InitRequest = serde_json::from_slice(body).map_err(|e| {
            fail(
                StatusCode::BAD_REQUEST,
                format!("invalid init request: {e}"),
            )
        })?;
        let csr = match (self.key_source, &request.csr) {
            (KeySource::Pod, Some(pem)) => Some(
                CsrInfo::from_pem(pem)
                    .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("the pod's CSR: {e}")))?,
            ),
            (KeySource::Pod, None) => {
                return Err(fail(
                    StatusCode::BAD_REQUEST,
                    "this agent runs with --key-source pod (KEY_SOURCE): an init must carry the \
                     pod's CSR and no key is handed out; run the SIA with --key-source pod",
                ));
            }
            (KeySource::Agent, Some(_)) => {
                return Err(fail(
                    StatusCode::BAD_REQUEST,
                    "this agent runs with --key-source agent (KEY_SOURCE): it makes the pod's \
                     key, so an init carries no CSR; run the SIA with --key-source agent",
                ));
            }
            (KeySource::Agent, None) => None,
        };
        let public_key = csr.as_ref().map(|c| c.public_key_der.clone());
        if let Some((at, answer, key)) = &recent.0
            && at.elapsed() < COALESCE
            && *key == public_key
        {
            return Ok(answer.clone());
        }
        let key = match &csr {
            Some(csr) => KeyRequest::Pod(csr),
            None => KeyRequest::Agent,
        };
        let subject = self.socket_pod(&data, Registration::First).await?;
        let answer = self
            .manager
            .register(id, &data, subject, key, Priority::RealTime)
            .await?
            .answer;
        self.metrics.issued("init", self.key_source);
        recent.0 = Some((std::time::Instant::now(), answer.clone(), public_key));
        Ok(answer)
    }

    /// `POST /v1/refresh/{id}` (agent-made keys): the pair the pod presents is checked to be
    /// the volume's latest before anything leaves the node, then shown to ZTS.
    pub async fn refresh(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<IdentityResponse, Failure> {
        // the caller first: nothing of the request is read for a process that is not the pod
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        // a refresh supersedes any coalesced init answer
        recent.0 = None;
        let data = self.attestor.caller(id, conn)?;
        if self.key_source == KeySource::Pod {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "this agent runs with --key-source pod (KEY_SOURCE): a refresh must not carry \
                 the pod's key; the pod refreshes with ZTS itself (POST /v1/attestation/{id}); \
                 run the SIA with --key-source pod",
            ));
        }
        let request = parse_refresh_request(body)?;
        // the pod had its identity, so the kubelet listed it: missing from a new list, it is gone
        let subject = self.socket_pod(&data, Registration::Again).await?;
        let issued = self
            .manager
            .refresh(
                id,
                &request.key_pem,
                &request.cert_pem,
                subject,
                Priority::RealTime,
            )
            .await?;
        self.metrics.issued("refresh", self.key_source);
        Ok(issued.answer)
    }
}

/// Reads a refresh body (docs/design.md §4.2): strict JSON, 400 naming the fault otherwise.
pub fn parse_refresh_request(body: &[u8]) -> Result<RefreshRequest, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("invalid refresh request: {e}"),
        )
    })
}
