//! The socket calls of pod-made keys (docs/design.md §4.6) besides init: `GET /v1/csr/{id}` (what
//! the pod's CSR must say), `POST /v1/attestation/{id}` (the JWT a pod needs to refresh with ZTS
//! itself) and `POST /v1/certificate/{id}` (the certificate the pod holds now, so the agent's
//! state and `status` stay true). Each is bound to the calling pod like every socket call, and
//! none carries a key: the agent keeps serials and times only.

use crate::failure::{Failure, fail};
use crate::kubelet::Absent;
use crate::manager::queue::Priority;
use crate::refresh::check_volume_identity;
use crate::service::{Agent, PodIp};
use athenz_core::agent_api::{AttestationResponse, CertificateReport, CsrTemplate, KeySource};
use athenz_core::crypto::{CertInfo, pem_certificates};
use athenz_core::http::ConnInfo;
use athenz_core::volume::{VolumeId, VolumePaths, VolumeState, write_json_record};
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
        let (_, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        self.require_pod_keys("GET /v1/csr")?;
        let (subject, service_ip) = self
            .pod_subject(&data, PodIp::Required, Absent::MayAppear)
            .await?;
        Ok(self.expected_identity(&subject, service_ip)?.into())
    }

    /// `POST /v1/attestation/{id}`: for a pod that holds a valid certificate of this volume, a
    /// JWT naming it (as for a refresh through the agent), what its new CSR must say, and where
    /// ZTS is.
    pub async fn attest(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<AttestationResponse, Failure> {
        // the caller first: nothing of the request is read for a process that is not the pod
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        recent.0 = None;
        let (paths, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        self.require_pod_keys("POST /v1/attestation")?;
        let report = parse_report(body)?;
        let state = self.state(id, &paths)?;
        let info = self.check_held_certificate(&report.cert_pem, &state)?;
        // the pod had its identity, so the kubelet listed it: missing from a new list, it is gone
        let (subject, service_ip) = self
            .pod_subject(&data, PodIp::Required, Absent::Gone)
            .await?;
        if subject.uid != state.pod_uid {
            return Err(fail(StatusCode::FORBIDDEN, "the pod was replaced"));
        }
        let template = self.expected_identity(&subject, service_ip)?.into();
        let jwt = {
            let _slot = self.issuance_slot(Priority::RealTime).await;
            self.identity_jwt(&subject).await?
        };
        self.save_held(&paths, state.clone(), &info)?;
        self.metrics.issued("attestation", KeySource::Pod);
        Ok(AttestationResponse {
            attestation_data: jwt,
            csr: template,
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
        // the caller first: nothing of the request is read for a process that is not the pod
        let lock = self.lock_for(id).await;
        let _serialised = lock.lock().await;
        let (paths, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        self.require_pod_keys("POST /v1/certificate")?;
        let report = parse_report(body)?;
        let state = self.state(id, &paths)?;
        let info = self.check_held_certificate(&report.cert_pem, &state)?;
        self.save_held(&paths, state, &info)
    }

    /// A certificate a pod says it holds: this volume's identity (400), valid now and from the
    /// Athenz CA (403), and the latest the agent knows of, the one before it, or one that
    /// expires no earlier than the latest (403 otherwise). Newer ones are accepted: the pod got them
    /// from ZTS itself, and its report of the last may have been lost.
    fn check_held_certificate(
        &self,
        cert_pem: &str,
        state: &VolumeState,
    ) -> Result<CertInfo, Failure> {
        let info = CertInfo::from_pem(cert_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("the certificate: {e}")))?;
        check_volume_identity(&info, state)?;
        let chain = pem_certificates(cert_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("the certificate: {e}")))?;
        self.check_issued_by_athenz(&chain, &info)?;
        let known = info.serial_hex == state.cert_serial
            || state.previous_cert_serial.as_deref() == Some(info.serial_hex.as_str());
        if !known && info.not_after < state.cert_expiry {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!(
                    "the certificate (serial {}) has been superseded: the latest this volume holds is {}",
                    info.serial_hex, state.cert_serial
                ),
            ));
        }
        Ok(info)
    }

    /// Records `info` as the volume's current certificate, when it is a new one.
    fn save_held(
        &self,
        paths: &VolumePaths,
        state: VolumeState,
        info: &CertInfo,
    ) -> Result<(), Failure> {
        if info.serial_hex == state.cert_serial {
            return Ok(());
        }
        let updated = VolumeState {
            previous_cert_serial: Some(state.cert_serial.clone()),
            cert_serial: info.serial_hex.clone(),
            cert_expiry: info.not_after,
            updated_at: time::OffsetDateTime::now_utc(),
            key_source: Some(KeySource::Pod),
            ..state
        };
        self.metrics
            .cert_expiry
            .set(info.not_after.unix_timestamp());
        write_json_record(&paths.state_json, &updated)
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
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
