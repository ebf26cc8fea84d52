//! The wire types of ZTS's authorization routes (docs/design.md §4.11): role certificates, access
//! tokens and role tokens, with Athenz's names.

use crate::secret::Secret;
use serde::{Deserialize, Serialize};

/// `POST /zts/v1/rolecert`: a role certificate for a CSR made by [`crate::names::role_csr_identity`].
/// Athenz's `RoleCertificateRequest`: unknown fields are ignored, as ZTS ignores them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleCertificateRequest {
    /// The CSR, PEM.
    pub csr: String,
    /// Lifetime asked for, minutes (ZTS caps it); 0 for ZTS's default.
    #[serde(default)]
    pub expiry_time: i64,
    /// The principal the caller asks on behalf of (authorized proxy users only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_for_principal: Option<String>,
    /// Validity start of the certificate being replaced (ZTS's signing priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_cert_not_before: Option<String>,
    /// Validity end of the certificate being replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_cert_not_after: Option<String>,
    /// Which of ZTS's signing keys to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x509_cert_signer_key_id: Option<String>,
}

/// The answer of `POST /zts/v1/rolecert`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleCertificate {
    /// The role certificate, PEM.
    pub x509_certificate: String,
}

/// The answer of `POST /zts/v1/oauth2/token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessTokenResponse {
    /// The token (a JWT), a bearer credential.
    pub access_token: Secret,
    /// `Bearer`.
    pub token_type: String,
    /// Seconds it is valid from issue.
    pub expires_in: i64,
    /// The roles granted, `<d>:role.<r>` space-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// The answer of `GET /zts/v1/domain/{d}/token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleTokenResponse {
    /// The role token (`v=Z1;…`), a bearer credential.
    pub token: Secret,
    /// Expiry, Unix seconds.
    pub expiry_time: i64,
}
