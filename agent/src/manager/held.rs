//! Certificates a pod got from ZTS itself (pod-made keys, docs/design.md §4.6): what the pod
//! says it holds is checked to be this volume's, from Athenz and not older than the one
//! recorded, then recorded (serial and expiry only: no key reaches the agent), and the JWT for
//! its next refresh is signed.

use super::{Manager, Priority, check_volume_identity};
use crate::failure::{Failure, fail};
use athenz_core::agent_api::KeySource;
use athenz_core::crypto::{CertInfo, pem_certificates};
use athenz_core::names::CsrIdentity;
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::volume::{VolumeId, VolumePaths, VolumeState, write_json_record};
use http::StatusCode;

impl Manager {
    /// For `subject` (its pod attested again), holding `cert_pem` of volume `id`: what its new
    /// CSR must say and a JWT naming it; the certificate is recorded as the volume's latest.
    /// The volume's state before the call, for the answer.
    pub async fn attestation(
        &self,
        id: &VolumeId,
        cert_pem: &str,
        subject: &PodSubject,
    ) -> Result<(CsrIdentity, Secret, VolumeState), Failure> {
        let state = self.state(id)?;
        let info = self.check_held(cert_pem, &state)?;
        if subject.uid != state.pod_uid {
            return Err(fail(StatusCode::FORBIDDEN, "the pod was replaced"));
        }
        let identity = self.identity_of(subject).await?;
        let jwt = {
            let _slot = self.slot(Priority::RealTime).await;
            self.identity_jwt(subject).await?
        };
        self.save_held(&self.volumes.volume(id), state.clone(), &info)?;
        Ok((identity, jwt, state))
    }

    /// Records `cert_pem` as volume `id`'s current certificate once it is checked.
    pub fn record_held(&self, id: &VolumeId, cert_pem: &str) -> Result<(), Failure> {
        let state = self.state(id)?;
        let info = self.check_held(cert_pem, &state)?;
        self.save_held(&self.volumes.volume(id), state, &info)
    }

    /// A certificate a pod says it holds: this volume's identity (400), valid now and from the
    /// Athenz CA (403), and the latest the agent knows of, the one before it, or one that
    /// expires no earlier than the latest (403 otherwise). Newer ones are accepted: the pod got them
    /// from ZTS itself, and its report of the last may have been lost.
    fn check_held(&self, cert_pem: &str, state: &VolumeState) -> Result<CertInfo, Failure> {
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
