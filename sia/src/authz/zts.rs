//! The SIA's calls to ZTS as its own service identity (docs/design.md §4.11): mutual TLS with the
//! pod's current certificate, which also binds every access token to it (`cnf`). The identity is
//! replaced on every rotation; tokens fetched under an older one are known by their generation.

use super::targets::DomainRole;
use athenz_core::crypto::{CertInfo, PrivateKey, build_csr};
use athenz_core::names;
use athenz_core::secret::Secret;
use athenz_core::tls::{ClientIdentity, ServerCaBundle, certified_key_from_pem};
use athenz_core::zts::{
    RoleCertificateRequest, ServiceZtsClient, ZtsClient, ZtsClientConfig, ZtsError,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Why ZTS gave no token or certificate.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// ZTS refused for good (not a member, unknown domain or role, a malformed request): `status`
    /// is ZTS's.
    #[error("ZTS refused ({status}): {message}")]
    Refused {
        /// ZTS's HTTP status.
        status: u16,
        /// ZTS's reason.
        message: String,
    },
    /// ZTS could not be reached or answered "try later"; it may pass.
    #[error("ZTS unavailable: {0}")]
    Unavailable(String),
    /// The request names something that is not a valid Athenz name (ZTS was not asked).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The SIA has no service certificate to present yet.
    #[error("no service identity yet to present to ZTS")]
    NoIdentity,
}

impl FetchError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::NoIdentity)
    }
}

impl From<ZtsError> for FetchError {
    fn from(e: ZtsError) -> Self {
        match e {
            ZtsError::Rejected {
                status, message, ..
            } if !status_is_transient(status) => Self::Refused { status, message },
            ZtsError::BadRequest(name) => Self::BadRequest(name.to_string()),
            ZtsError::CertificateRefused(reason) => Self::Refused {
                status: 401,
                message: format!("the service certificate was refused: {reason}"),
            },
            other => Self::Unavailable(other.to_string()),
        }
    }
}

fn status_is_transient(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

/// A token as ZTS issued it.
#[derive(Debug, Clone)]
pub struct Token {
    /// The token, a bearer credential.
    pub raw: Arc<Secret>,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
    /// When it was fetched, Unix seconds.
    pub fetched_at: i64,
    /// Access tokens: the roles granted, as ZTS's `scope`.
    pub scope: Option<Arc<str>>,
    /// The identity generation it was fetched with.
    pub generation: u64,
}

/// The pod's current identity as a ZTS client.
struct Current {
    client: ServiceZtsClient,
    principal: String,
    key: PrivateKey,
    cert_not_after: i64,
    generation: u64,
}

/// ZTS, called as the pod's service.
pub struct ZtsAccess {
    zts: ZtsClient,
    current: RwLock<Option<Arc<Current>>>,
    generation: AtomicU64,
}

impl std::fmt::Debug for ZtsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZtsAccess(generation {})", self.generation())
    }
}

/// Now, Unix seconds.
pub fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

impl ZtsAccess {
    /// ZTS at `url` (ending in `/zts/v1`), verified with the CA certificates in `ca_file`;
    /// `timeout` bounds each call.
    pub fn new(url: &str, ca_file: &Path, timeout: Duration) -> Result<Self, String> {
        // followed as the file changes: a ZTS CA rotation reaches role and token fetches with
        // no restart (docs/design.md §6)
        let ca = ServerCaBundle::from_file(ca_file).map_err(|e| e.to_string())?;
        let zts = ZtsClient::new(ZtsClientConfig {
            url: url.to_owned(),
            ca,
            timeout,
            connect_timeout: timeout.min(Duration::from_secs(5)),
        })
        .map_err(|e| e.to_string())?;
        Ok(Self {
            zts,
            current: RwLock::new(None),
            generation: AtomicU64::new(0),
        })
    }

    /// The generation of the current identity (0 before the first).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Presents `cert_pem` (leaf then chain) and `key_pem` from now on; tokens fetched before
    /// become of an older generation.
    pub fn set_identity(&self, key_pem: &Secret, cert_pem: &str) -> Result<(), String> {
        let pair = certified_key_from_pem(cert_pem, key_pem.expose())
            .map_err(|e| format!("the service certificate and key: {e}"))?;
        let info = CertInfo::from_pem(cert_pem).map_err(|e| e.to_string())?;
        names::split_service_name("certificate CN", &info.common_name)
            .map_err(|e| e.to_string())?;
        let key = PrivateKey::from_pem(key_pem.expose()).map_err(|e| e.to_string())?;
        let client = self
            .zts
            .as_service(ClientIdentity::Fixed(pair))
            .map_err(|e| e.to_string())?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        *current = Some(Arc::new(Current {
            client,
            principal: info.common_name,
            key,
            cert_not_after: info.not_after.unix_timestamp(),
            generation,
        }));
        Ok(())
    }

    fn current(&self) -> Result<Arc<Current>, FetchError> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(FetchError::NoIdentity)
    }

    /// An access token for `roles` of `domain` (the whole domain when empty).
    pub async fn access_token(
        &self,
        domain: &str,
        roles: &[String],
        expires_in: Option<u64>,
        proxy_for_principal: Option<&str>,
    ) -> Result<Token, FetchError> {
        let current = self.current()?;
        let fetched_at = unix_now();
        let answer = current
            .client
            .access_token(domain, roles, expires_in, proxy_for_principal)
            .await?;
        Ok(Token {
            raw: Arc::new(answer.access_token),
            expires_at: fetched_at + answer.expires_in,
            fetched_at,
            scope: answer.scope.filter(|s| !s.is_empty()).map(Arc::from),
            generation: current.generation,
        })
    }

    /// A role token for `roles` of `domain` (all the caller's when empty).
    pub async fn role_token(
        &self,
        domain: &str,
        roles: &[String],
        min_expiry: Option<u64>,
        max_expiry: Option<u64>,
        proxy_for_principal: Option<&str>,
    ) -> Result<Token, FetchError> {
        let current = self.current()?;
        let fetched_at = unix_now();
        let answer = current
            .client
            .role_token(domain, roles, min_expiry, max_expiry, proxy_for_principal)
            .await?;
        Ok(Token {
            raw: Arc::new(answer.token),
            expires_at: answer.expiry_time,
            fetched_at,
            scope: None,
            generation: current.generation,
        })
    }

    /// A role certificate for `target` over the service key, asked to last as long as the
    /// service certificate (so it is renewed with it). PEM.
    pub async fn role_certificate(&self, target: &DomainRole) -> Result<String, FetchError> {
        let current = self.current()?;
        let identity = names::role_csr_identity(&target.domain, &target.role, &current.principal)
            .map_err(|e| FetchError::BadRequest(e.to_string()))?;
        let csr = build_csr(&identity, &current.key)
            .map_err(|e| FetchError::BadRequest(e.to_string()))?;
        let minutes = (current.cert_not_after - unix_now()).max(60) / 60;
        let answer = current
            .client
            .role_certificate(&RoleCertificateRequest {
                csr,
                expiry_time: minutes,
                ..RoleCertificateRequest::default()
            })
            .await?;
        CertInfo::from_pem(&answer.x509_certificate).map_err(|e| {
            FetchError::Unavailable(format!("ZTS answered an unreadable role certificate: {e}"))
        })?;
        Ok(answer.x509_certificate)
    }
}
