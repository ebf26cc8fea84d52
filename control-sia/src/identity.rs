//! The work itself: sign an ntoken with the service key, send ZTS a CSR made with the same key,
//! and write the certificate, CA bundle and a fresh ntoken as one atomic set.

use crate::config::Loaded;
use athenz_core::crypto::{CertInfo, build_csr};
use athenz_core::files::{CA_FILE, CERT_FILE, Credentials, FileSet, FilesError, write_credentials};
use athenz_core::names::CsrIdentity;
use athenz_core::ntoken::{NTokenBuilder, NTokenError};
use athenz_core::secret::Secret;
use athenz_core::zts::{InstanceRefreshRequest, ZtsClient, ZtsClientConfig, ZtsError};
use thiserror::Error;
use time::OffsetDateTime;

/// Why getting or writing an identity failed.
#[derive(Debug, Error)]
pub enum IdentityError {
    /// ZTS refused or could not be reached.
    #[error(transparent)]
    Zts(#[from] ZtsError),
    /// The ntoken could not be signed.
    #[error(transparent)]
    NToken(#[from] NTokenError),
    /// The CSR could not be built, or ZTS's certificate not read.
    #[error("{0}")]
    Crypto(String),
    /// The files could not be written or read.
    #[error(transparent)]
    Files(#[from] FilesError),
}

impl IdentityError {
    /// Whether trying again later may work.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Zts(e) if e.is_transient())
    }
}

/// A certificate as issued, ready to write.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Leaf followed by the intermediates, PEM.
    pub cert_chain_pem: String,
    /// CA bundle, PEM.
    pub ca_pem: String,
    /// What the leaf says.
    pub info: CertInfo,
}

/// A control-plane service's identity source.
pub struct ControlSia {
    loaded: Loaded,
    identity: CsrIdentity,
    zts: ZtsClient,
    out: FileSet,
}

impl ControlSia {
    /// Prepares the ZTS client and the CSR identity.
    pub fn new(loaded: Loaded) -> Result<Self, IdentityError> {
        let s = &loaded.settings;
        let mut identity = CsrIdentity::for_service(&s.domain, &s.service, &s.dns_suffix)
            .map_err(|e| IdentityError::Crypto(e.to_string()))?;
        identity.dns_names.extend(s.dns_names.iter().cloned());
        identity.ip_addresses.extend(s.ip_addresses.iter().copied());
        let zts = ZtsClient::new(ZtsClientConfig {
            url: s.zts_url.clone(),
            ca: std::sync::Arc::clone(&loaded.zts_cas),
            timeout: s.zts_timeout,
            connect_timeout: s.zts_timeout.min(std::time::Duration::from_secs(5)),
        })?;
        let out = FileSet::new(&s.out_dir);
        Ok(Self {
            loaded,
            identity,
            zts,
            out,
        })
    }

    /// The settings.
    pub fn settings(&self) -> &crate::config::Settings {
        &self.loaded.settings
    }

    /// An ntoken for this service issued at `now`, signed with the service key.
    pub fn ntoken(&self, now: OffsetDateTime) -> Result<Secret, IdentityError> {
        let s = &self.loaded.settings;
        let lifetime = time::Duration::try_from(s.ntoken_lifetime)
            .map_err(|e| IdentityError::Crypto(e.to_string()))?;
        Ok(NTokenBuilder {
            domain: s.domain.clone(),
            service: s.service.clone(),
            host: s.host.clone(),
            key_version: self.loaded.key_version.clone(),
            key_service: None,
            lifetime,
        }
        .sign(&self.loaded.key, now)?)
    }

    /// When an ntoken [`Self::ntoken`] issues at `issued` expires (Unix time): what the
    /// ntoken gauge reports, without parsing the secret back.
    pub fn ntoken_expires(&self, issued: OffsetDateTime) -> i64 {
        let lifetime =
            i64::try_from(self.loaded.settings.ntoken_lifetime.as_secs()).unwrap_or(i64::MAX);
        issued.unix_timestamp().saturating_add(lifetime)
    }

    /// Asks ZTS for a certificate, authenticating with an ntoken issued at `now`.
    pub async fn request_certificate(&self, now: OffsetDateTime) -> Result<Issued, IdentityError> {
        let s = &self.loaded.settings;
        let csr = build_csr(&self.identity, &self.loaded.key)
            .map_err(|e| IdentityError::Crypto(e.to_string()))?;
        let request = InstanceRefreshRequest {
            csr,
            expiry_time: s.lifetime_minutes.and_then(|m| i32::try_from(m).ok()),
            key_id: Some(self.loaded.key_version.clone()),
        };
        let token = self.ntoken(now)?;
        let identity = self
            .zts
            .refresh_with_ntoken(&s.domain, &s.service, &request, &token, &s.auth_header)
            .await?;
        let info = CertInfo::from_pem(&identity.certificate)
            .map_err(|e| IdentityError::Crypto(format!("ZTS's certificate: {e}")))?;
        if !athenz_core::crypto::key_matches_cert(&self.loaded.key, &info) {
            return Err(IdentityError::Crypto(
                "ZTS's certificate is not for the service key".into(),
            ));
        }
        let ca_pem = identity.ca_cert_bundle.unwrap_or_default();
        Ok(Issued {
            cert_chain_pem: athenz_core::crypto::leaf_with_chain(&identity.certificate, &ca_pem)
                .map_err(|e| IdentityError::Crypto(format!("ZTS's CA bundle: {e}")))?,
            ca_pem,
            info,
        })
    }

    /// Writes `issued` and `ntoken` as one set.
    pub fn write(&self, issued: &Issued, ntoken: &Secret) -> Result<(), IdentityError> {
        write_credentials(
            &self.out,
            &Credentials {
                key_pem: None,
                cert_pem: &issued.cert_chain_pem,
                ca_pem: &issued.ca_pem,
                ntoken,
            },
            self.loaded.gid.map(|gid| athenz_core::files::Owner {
                uid: None,
                gid: Some(gid),
            }),
        )?;
        Ok(())
    }

    /// The set on disk, if there is a readable one whose certificate belongs to the service key.
    pub fn current(&self) -> Option<Issued> {
        let files = self.out.read(&[CERT_FILE, CA_FILE]).ok()?;
        let cert_chain_pem = String::from_utf8(files[0].clone()).ok()?;
        let ca_pem = String::from_utf8(files[1].clone()).ok()?;
        let info = CertInfo::from_pem(&cert_chain_pem).ok()?;
        let ours = athenz_core::crypto::key_matches_cert(&self.loaded.key, &info)
            && info.common_name == self.identity.common_name;
        ours.then_some(Issued {
            cert_chain_pem,
            ca_pem,
            info,
        })
    }
}
