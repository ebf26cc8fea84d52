//! A volume's records: the identity it holds (`state.json`, what refreshes are checked
//! against) and what its last call was told (`status.json`, what `athenz-identity-agent
//! status` shows). What its mount recorded (`data.json`) is the attestor's to read.

use super::{KeyFor, Manager, Registered};
use crate::failure::{Failure, fail};
use athenz_core::agent_api::IdentityResponse;
use athenz_core::crypto::{CertInfo, PrivateKey};
use athenz_core::issuance::Issued;
use athenz_core::subject::PodSubject;
use athenz_core::volume::{
    VolumeData, VolumeId, VolumePaths, VolumeState, VolumeStatusRecord, read_json_file,
    write_json_record,
};
use athenz_core::zts::InstanceIdentity;
use http::StatusCode;

impl Manager {
    /// Volume `id`'s refresh state: 404 until an identity was issued for it.
    pub fn state(&self, id: &VolumeId) -> Result<VolumeState, Failure> {
        read_json_file(&self.volumes.volume(id).state_json).map_err(|_| {
            fail(
                StatusCode::NOT_FOUND,
                format!("volume {id} has not been initialised"),
            )
        })
    }

    /// A volume's refresh state, once written, names the pod it was first issued for: no other
    /// pod's registration may replace it.
    pub(super) fn check_volume_pod(
        &self,
        paths: &VolumePaths,
        data: &VolumeData,
    ) -> Result<(), Failure> {
        match read_json_file::<VolumeState>(&paths.state_json) {
            Ok(state) if state.pod_uid != data.pod_uid => Err(fail(
                StatusCode::FORBIDDEN,
                "this volume was initialised for another pod",
            )),
            _ => Ok(()),
        }
    }

    /// Records a registration: a new record in ZTS, so no earlier certificate refreshes.
    pub(super) fn write_registered(
        &self,
        paths: &VolumePaths,
        registered: Registered,
    ) -> Result<Issued, Failure> {
        self.write_state(
            paths,
            &registered.subject,
            &registered.key,
            &registered.identity,
            None,
        )
    }

    /// Checks ZTS's answer (a certificate for the key sent), saves the volume's refresh state
    /// and builds the answer.
    pub(super) fn write_state(
        &self,
        paths: &VolumePaths,
        subject: &PodSubject,
        key: &KeyFor,
        identity: &InstanceIdentity,
        previous_serial: Option<String>,
    ) -> Result<Issued, Failure> {
        let leaf = identity
            .x509_certificate
            .as_deref()
            .ok_or_else(|| fail(StatusCode::BAD_GATEWAY, "ZTS sent no certificate"))?;
        let info = CertInfo::from_pem(leaf)
            .map_err(|e| fail(StatusCode::BAD_GATEWAY, format!("ZTS's certificate: {e}")))?;
        if info.public_key_der != key.public_key_der {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                "ZTS's certificate is not for the key sent",
            ));
        }
        let state = VolumeState {
            provider: self.provider.clone(),
            instance_id: subject.uid.clone(),
            domain: subject.domain.clone(),
            service: subject.service.clone(),
            pod_uid: subject.uid.clone(),
            cert_serial: info.serial_hex.clone(),
            previous_cert_serial: previous_serial.filter(|s| *s != info.serial_hex),
            cert_expiry: info.not_after,
            updated_at: time::OffsetDateTime::now_utc(),
            key_source: Some(key.source),
        };
        self.metrics
            .cert_expiry
            .set(info.not_after.unix_timestamp());
        write_json_record(&paths.state_json, &state)
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let key_pem = key
            .made_here
            .as_ref()
            .map(PrivateKey::to_pkcs8_pem)
            .transpose()
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let answer = IdentityResponse::from_instance_identity(identity, leaf, &info, key_pem);
        Ok(Issued { answer, cert: info })
    }

    /// Keeps the volume's `status.json` in step with the last call: the failure the pod was
    /// given, or none after a success. Only an existing volume has a record; writes happen
    /// only when the record changes.
    pub fn record_outcome(&self, id: &VolumeId, failure: Option<&Failure>) {
        let paths = self.volumes.volume(id);
        if !paths.dir.is_dir() {
            return;
        }
        let now = time::OffsetDateTime::now_utc();
        let updated = VolumeStatusRecord::update(&paths.status_json, |r| match failure {
            Some(f) => r.set_error(&format!("{} {}", f.status.as_u16(), f.message), now),
            None => r.last_error = None,
        });
        if let Err(e) = updated {
            tracing::debug!(%id, error = %e, "status record not written");
        }
    }
}
