//! Refresh through the agent (`POST /v1/refresh/{id}` with agent-made keys, and CSI files-mode
//! rotation), its pod attested again: the presented pair is checked to be the volume's latest
//! identity before anything leaves the node, then shown to ZTS as the TLS client certificate.

use super::{KeyRequest, Manager, Priority};
use crate::failure::{Failure, fail, zts_failure};
use athenz_core::crypto::{CertInfo, PrivateKey, key_matches_cert};
use athenz_core::issuance::Issued;
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::volume::{VolumeId, VolumeState};
use athenz_core::zts::{InstanceRef, InstanceRefreshInformation};
use http::StatusCode;
use std::sync::Arc;

/// The certificate names the volume's principal and instance (400 otherwise): a pod cannot
/// present another identity's certificate.
pub fn check_volume_identity(info: &CertInfo, state: &VolumeState) -> Result<(), Failure> {
    let principal = athenz_core::names::principal(&state.domain, &state.service);
    let instance_uri = athenz_core::names::instance_id_uri(&state.provider, &state.instance_id);
    if info.common_name != principal || !info.uris.contains(&instance_uri) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "the certificate is not this volume's identity",
        ));
    }
    Ok(())
}

/// A pair presented for refresh, checked to be the volume's latest identity.
struct Presented {
    state: VolumeState,
    pair: PresentedPair,
}

impl Manager {
    /// The pair volume `id` presents, checked before anything leaves the node: it parses, the
    /// key is the certificate's, and the certificate is this volume's latest identity
    /// (issued by Athenz, and a serial the volume recorded).
    fn check_presented(
        &self,
        id: &VolumeId,
        key_pem: &Secret,
        cert_pem: &str,
    ) -> Result<Presented, Failure> {
        let state = self.state(id)?;
        let pair = PresentedPair::parse(key_pem.expose(), cert_pem)?;
        check_volume_identity(&pair.info, &state)?;
        self.check_issued_by_athenz(&pair.presented.cert, &pair.info)?;
        if pair.info.serial_hex != state.cert_serial
            && state.previous_cert_serial.as_deref() != Some(pair.info.serial_hex.as_str())
        {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!(
                    "the certificate (serial {}) has been superseded: the latest issued for this volume is {}",
                    pair.info.serial_hex, state.cert_serial
                ),
            ));
        }
        Ok(Presented { state, pair })
    }

    /// The certificate is valid now and chains to the Athenz CA (403 otherwise): one this agent
    /// got from Athenz and may still use (docs/design.md §6), so a pod cannot use the agent to
    /// show ZTS a certificate it made itself, and a refusal is final (403), not "try again".
    pub fn check_issued_by_athenz(
        &self,
        chain: &[rustls_pki_types::CertificateDer<'static>],
        info: &CertInfo,
    ) -> Result<(), Failure> {
        let now = time::OffsetDateTime::now_utc();
        if info.not_after <= now {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!("the certificate expired at {}", info.not_after),
            ));
        }
        if info.not_before > now {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!("the certificate is not valid before {}", info.not_before),
            ));
        }
        self.athenz_ca.check(chain).map_err(|e| {
            fail(
                StatusCode::FORBIDDEN,
                format!("the certificate was not issued by the Athenz CA: {e}"),
            )
        })
    }

    /// Refreshes volume `id` for `subject` (its pod attested again) with the pair it presents,
    /// checked to be the volume's latest before anything leaves the node, then shown to ZTS; the
    /// pair just presented stays usable once, as ZTS keeps it (its answer may be lost).
    pub async fn refresh(
        &self,
        id: &VolumeId,
        key_pem: &Secret,
        cert_pem: &str,
        subject: PodSubject,
        priority: Priority,
    ) -> Result<Issued, Failure> {
        let Presented { state, pair } = self.check_presented(id, key_pem, cert_pem)?;
        if subject.uid != state.pod_uid {
            return Err(fail(StatusCode::FORBIDDEN, "the pod was replaced"));
        }
        let identity = self.identity_of(&subject).await?;
        let _slot = self.slot(priority).await;
        let jwt = self.identity_jwt(&subject).await?;
        let (new_key, csr) = self.csr(&identity, KeyRequest::Agent).await?;
        let started = std::time::Instant::now();
        let identity = self
            .zts
            .refresh_instance(
                &InstanceRef {
                    provider: &state.provider,
                    domain: &state.domain,
                    service: &state.service,
                    instance_id: &state.instance_id,
                },
                &InstanceRefreshInformation {
                    attestation_data: Some(jwt),
                    csr: Some(csr),
                    token: Some(true),
                    ..Default::default()
                },
                ClientIdentity::Fixed(pair.presented),
            )
            .await;
        self.metrics.observe("zts_refresh", started);
        let identity = identity.map_err(zts_failure)?;
        let paths = self.volumes.volume(id);
        self.write_state(
            &paths,
            &subject,
            &new_key,
            &identity,
            Some(pair.info.serial_hex),
        )
    }
}

/// The key and certificate a pod presents for refresh, parsed: what the socket API reads from a
/// pod before anything else is looked at. Pure, so the fuzz target `agent_request` drives it.
pub struct PresentedPair {
    /// The leaf certificate's fields.
    pub info: CertInfo,
    /// The pair in the form ZTS will be shown it (leaf + chain, with the key).
    pub presented: Arc<tls::CertifiedKey>,
}

impl PresentedPair {
    /// Parses `cert_pem` (leaf alone or leaf + chain) and `key_pem`; 400 unless both parse and
    /// the key is the certificate's.
    pub fn parse(key_pem: &str, cert_pem: &str) -> Result<Self, Failure> {
        let info = CertInfo::from_pem(cert_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, e.to_string()))?;
        let key = PrivateKey::from_pem(key_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, e.to_string()))?;
        if !key_matches_cert(&key, &info) {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "the key does not belong to the certificate",
            ));
        }
        let presented = tls::certified_key_from_pem(cert_pem, key_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, e.to_string()))?;
        Ok(Self { info, presented })
    }
}
