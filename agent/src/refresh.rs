//! Refresh through the agent (`POST /v1/refresh/{id}` with agent-made keys, and CSI files-mode
//! rotation): the presented pair is checked to be the volume's latest identity before anything
//! leaves the node, then shown to ZTS as the TLS client certificate.

use crate::failure::{Failure, fail, zts_failure};
use crate::kubelet::Absent;
use crate::manager::queue::Priority;
use crate::service::{Agent, KeyRequest, PodIp};
use athenz_core::agent_api::{IdentityResponse, KeySource, RefreshRequest};
use athenz_core::crypto::{CertInfo, PrivateKey, key_matches_cert};
use athenz_core::http::ConnInfo;
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::volume::{VolumeData, VolumeId, VolumePaths, VolumeState, read_json_file};
use athenz_core::zts::{InstanceRef, InstanceRefreshInformation};
use athenz_csi_driver::Issued;
use http::StatusCode;
use std::sync::Arc;

/// The certificate names the volume's principal and instance (400 otherwise): a pod cannot
/// present another identity's certificate.
pub(crate) fn check_volume_identity(info: &CertInfo, state: &VolumeState) -> Result<(), Failure> {
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

impl Agent {
    /// A certificate presented for refresh is one this agent got from Athenz for this volume and
    /// may still use (docs/design.md §6): valid now, chaining to the Athenz CA, and the latest
    /// issued for the volume or the one presented for the last refresh. Checked before anything
    /// leaves the node, so a pod cannot use the agent to show ZTS a certificate it made itself, or
    /// one it was issued long ago, and a refusal is final (403), not "try again".
    fn check_presented(
        &self,
        chain: &[rustls_pki_types::CertificateDer<'static>],
        info: &CertInfo,
        state: &VolumeState,
    ) -> Result<(), Failure> {
        self.check_issued_by_athenz(chain, info)?;
        if info.serial_hex != state.cert_serial
            && state.previous_cert_serial.as_deref() != Some(info.serial_hex.as_str())
        {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!(
                    "the certificate (serial {}) has been superseded: the latest issued for this volume is {}",
                    info.serial_hex, state.cert_serial
                ),
            ));
        }
        Ok(())
    }

    /// The certificate is valid now and chains to the Athenz CA (403 otherwise).
    pub(crate) fn check_issued_by_athenz(
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

    /// The volume's refresh state: 404 until an init succeeded.
    pub(crate) fn state(&self, id: &VolumeId, paths: &VolumePaths) -> Result<VolumeState, Failure> {
        read_json_file(&paths.state_json).map_err(|_| {
            fail(
                StatusCode::NOT_FOUND,
                format!("volume {id} has not been initialised"),
            )
        })
    }

    /// `POST /v1/refresh/{id}`.
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
        let (_, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        if self.key_source == KeySource::Pod {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "this agent runs with --key-source pod (KEY_SOURCE): a refresh must not carry \
                 the pod's key; the pod refreshes with ZTS itself (POST /v1/attestation/{id}); \
                 run the SIA with --key-source pod",
            ));
        }
        let request = parse_refresh_request(body)?;
        self.refresh_pair(
            id,
            &data,
            &request.key_pem,
            &request.cert_pem,
            PodIp::Required,
            Priority::RealTime,
        )
        .await
        .map(|issued| issued.answer)
    }

    /// Refreshes volume `id` with the pair it presents: checked to be this volume's latest
    /// identity before anything leaves the node, then shown to ZTS. The work of a refresh once
    /// the caller is known to be the pod (and of a CSI files-mode rotation).
    pub(crate) async fn refresh_pair(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        key_pem: &Secret,
        cert_pem: &str,
        ip: PodIp,
        priority: Priority,
    ) -> Result<Issued, Failure> {
        let paths = &self.volumes.volume(id);
        let state = self.state(id, paths)?;
        // the presented pair must be this volume's identity, before anything leaves the node
        let PresentedPair { info, presented } = PresentedPair::parse(key_pem.expose(), cert_pem)?;
        check_volume_identity(&info, &state)?;
        self.check_presented(&presented.cert, &info, &state)?;
        // the pod had its identity, so the kubelet listed it: missing from a new list, it is gone
        let (subject, service_ip) = self.pod_subject(data, ip, Absent::Gone).await?;
        if subject.uid != state.pod_uid {
            return Err(fail(StatusCode::FORBIDDEN, "the pod was replaced"));
        }
        let _slot = self.issuance_slot(priority).await;
        let identity = self.expected_identity(&subject, service_ip)?;
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
                ClientIdentity::Fixed(presented),
            )
            .await;
        self.metrics.observe("zts_refresh", started);
        let identity = identity.map_err(zts_failure)?;
        // as ZTS does: the certificate just presented stays usable once (its answer may be lost)
        self.finish(paths, &subject, &new_key, &identity, Some(info.serial_hex))
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

/// Reads a refresh body (docs/design.md §4.2): strict JSON, 400 naming the fault otherwise.
pub fn parse_refresh_request(body: &[u8]) -> Result<RefreshRequest, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("invalid refresh request: {e}"),
        )
    })
}
