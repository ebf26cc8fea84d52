//! Refresh with a pod-made key (docs/architecture.md, where keys are made): ZTS authenticates a
//! refresh by the instance's current certificate and key, which never leave the pod, so the SIA
//! calls ZTS itself — through the agent's `CONNECT` tunnel (the default: pods need no route to
//! ZTS) or directly with `--refresh-route direct`. The attestation JWT comes from the agent, for
//! this pod only. A new key per refresh, made here.

use crate::client::{AgentClient, AgentError};
use crate::pod_key::PodKey;
use athenz_core::agent_api::IdentityResponse;
use athenz_core::crypto::{KeyAlgorithm, pem_certificates};
use athenz_core::secret::Secret;
use athenz_core::tls::{ClientIdentity, certified_key_from_pem};
use athenz_core::zts::{
    InstanceIdentity, InstanceRef, InstanceRefreshInformation, ZtsClient, ZtsError,
    refresh_instance_over,
};
use rustls_pki_types::CertificateDer;
use std::time::Duration;

/// How the SIA reaches ZTS for its refreshes.
pub enum ZtsRoute {
    /// Through the agent's tunnel, to the ZTS the agent names; `ca` overrides the CA bundle the
    /// agent sends.
    Tunnel {
        /// CA certificates that verify ZTS, when not the agent's.
        ca: Option<Vec<CertificateDer<'static>>>,
    },
    /// Directly (`--refresh-route direct`, to `--zts-url`).
    Direct(ZtsClient),
}

/// Why a pod-made-key refresh failed.
#[derive(Debug, thiserror::Error)]
pub enum PodRefreshError {
    /// The agent refused the attestation or the tunnel, or could not be reached.
    #[error("{0}")]
    Agent(#[from] AgentError),
    /// ZTS refused or could not be reached.
    #[error("ZTS: {0}")]
    Zts(#[from] ZtsError),
    /// Something here: the key, the files, an answer that does not fit.
    #[error("{0}")]
    Local(String),
}

/// Refreshes the identity whose current pair is `key_pem` + `cert_pem`: the agent's attestation,
/// a new key and CSR, and ZTS's answer, shaped as the socket API's identity answer (with the new
/// key, which never left this process).
pub async fn refresh(
    client: &AgentClient,
    route: &ZtsRoute,
    algorithm: KeyAlgorithm,
    key_pem: &Secret,
    cert_pem: &str,
    timeout: Duration,
) -> Result<IdentityResponse, PodRefreshError> {
    let attestation = client.attestation(cert_pem).await?;
    let key = PodKey::generate(algorithm).map_err(PodRefreshError::Local)?;
    let csr = key
        .csr(attestation.csr.clone())
        .map_err(PodRefreshError::Local)?;
    let current = certified_key_from_pem(cert_pem, key_pem.expose())
        .map_err(|e| PodRefreshError::Local(format!("the current pair: {e}")))?;
    let target = InstanceRef {
        provider: &attestation.provider,
        domain: &attestation.domain,
        service: &attestation.service,
        instance_id: &attestation.instance_id,
    };
    let info = InstanceRefreshInformation {
        attestation_data: Some(attestation.attestation_data.clone()),
        csr: Some(csr),
        token: Some(true),
        ..Default::default()
    };
    let identity: InstanceIdentity = match route {
        ZtsRoute::Direct(zts) => {
            zts.refresh_instance(&target, &info, ClientIdentity::Fixed(current))
                .await?
        }
        ZtsRoute::Tunnel { ca } => {
            let ca = match ca {
                Some(ca) => ca.clone(),
                None => pem_certificates(&attestation.zts.ca_cert_pem).map_err(|e| {
                    PodRefreshError::Local(format!("the agent's ZTS CA bundle: {e}"))
                })?,
            };
            let (host, port) = athenz_core::agent_api::zts_authority(&attestation.zts.url)
                .map_err(PodRefreshError::Local)?;
            let authority = athenz_core::agent_api::format_authority(&host, port);
            let stream = client.tunnel(&authority).await?;
            refresh_instance_over(
                stream,
                &attestation.zts.url,
                &ca,
                ClientIdentity::Fixed(current),
                &target,
                &info,
                timeout,
            )
            .await?
        }
    };
    let leaf = identity
        .x509_certificate
        .as_deref()
        .ok_or_else(|| PodRefreshError::Local("ZTS sent no certificate".into()))?;
    let info = key
        .check_certificate(leaf)
        .map_err(PodRefreshError::Local)?;
    Ok(IdentityResponse::from_instance_identity(
        &identity,
        leaf,
        &info,
        Some(key.pem().clone()),
    ))
}
