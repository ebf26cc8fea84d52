//! The socket calls of pod-made keys (docs/design.md §4.6) besides init: `GET /v1/csr/{id}` (what
//! the pod's CSR must say), `POST /v1/attestation/{id}` (the JWT a pod needs to refresh with ZTS
//! itself) and `POST /v1/certificate/{id}` (the certificate the pod holds now, so the agent's
//! state and `status` stay true). Each is bound to the calling pod like every socket call, and
//! none carries a key: the agent keeps serials and times only.

use super::Agent;
use crate::failure::{Failure, fail};
use athenz_core::agent_api::{AttestationResponse, CertificateReport, CsrTemplate, KeySource};
use athenz_core::http::ConnInfo;
use athenz_core::issuance::Registration;
use athenz_core::volume::VolumeId;
use http::StatusCode;

impl Agent {
    /// 400 naming the setting unless the agent runs with pod-made keys: a pod's SIA and its agent
    /// must agree, and a misconfigured one must not silently fall back.
    fn require_pod_keys(&self, call: &str) -> Result<(), Failure> {
        match self.key_source {
            KeySource::Pod => Ok(()),
            KeySource::Agent => Err(fail(
                StatusCode::BAD_REQUEST,
                format!(
                    "this agent runs with --key-source agent (KEY_SOURCE): {call} is for pods \
                     that make their own key; run the SIA with --key-source agent"
                ),
            )),
        }
    }

    /// `GET /v1/csr/{id}`: what the calling pod's CSR must say.
    pub async fn csr_template(
        &self,
        id: &VolumeId,
        conn: &ConnInfo,
    ) -> Result<CsrTemplate, Failure> {
        let data = self.attestor.caller(id, conn)?;
        self.require_pod_keys("GET /v1/csr")?;
        let subject = self.socket_pod(&data, Registration::First).await?;
        Ok(self.manager.identity_of(&subject).await?.into())
    }

    /// `POST /v1/attestation/{id}`: for a pod that holds a valid certificate of this volume, a
    /// JWT naming it (as for a refresh through the agent), what its new CSR must say, and where
    /// ZTS is.
    pub async fn attestation(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<AttestationResponse, Failure> {
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        recent.0 = None;
        // the caller first: nothing of the request is read for a process that is not the pod
        let data = self.attestor.caller(id, conn)?;
        self.require_pod_keys("POST /v1/attestation")?;
        let report = parse_report(body)?;
        // the pod had its identity, so the kubelet listed it: missing from a new list, it is gone
        let subject = self.socket_pod(&data, Registration::Again).await?;
        let (template, jwt, state) = self
            .manager
            .attestation(id, &report.cert_pem, &subject)
            .await?;
        self.metrics.issued("attestation", KeySource::Pod);
        Ok(AttestationResponse {
            attestation_data: jwt,
            csr: template.into(),
            provider: state.provider,
            domain: state.domain,
            service: state.service,
            instance_id: state.instance_id,
            zts: athenz_core::agent_api::ZtsEndpoint {
                url: self.zts_url.clone(),
                ca_cert_pem: self.zts_ca.pem(),
            },
        })
    }

    /// `POST /v1/certificate/{id}`: the certificate the pod got from ZTS, recorded (serial and
    /// expiry) once it is checked to be this volume's, from Athenz, and not older than the one
    /// recorded.
    pub async fn record_certificate(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<(), Failure> {
        let lock = self.lock_for(id).await;
        let _serialised = lock.lock().await;
        // the caller first: nothing of the request is read for a process that is not the pod
        self.attestor.caller(id, conn)?;
        self.require_pod_keys("POST /v1/certificate")?;
        let report = parse_report(body)?;
        self.manager.record_held(id, &report.cert_pem)
    }
}

/// Reads a `{"certPEM"}` body: strict JSON, 400 naming the fault otherwise.
pub fn parse_report(body: &[u8]) -> Result<CertificateReport, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("invalid certificate report: {e}"),
        )
    })
}
