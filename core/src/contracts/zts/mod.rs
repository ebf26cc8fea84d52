//! ZTS wire types and client (docs/design.md §4.4 and §4.5).
//!
//! The types follow the Athenz RDL names exactly (camelCase JSON). Optional fields are omitted
//! when empty; unknown fields are accepted on input, so a newer ZTS does not break us. The same
//! types are used by the client here, the callback (InstanceConfirmation) and the dev ZTS.

use crate::client::{ReadError, error_chain, read_limited};
use crate::http::ErrorBody;
use crate::names::{self, NameError};
use crate::secret::Secret;
use crate::tls::{ClientIdentity, ServerCaBundle, TlsError, client_config_with_bundle};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

mod authz;
mod over_stream;
pub use authz::{AccessTokenResponse, RoleCertificate, RoleCertificateRequest, RoleTokenResponse};
pub use over_stream::refresh_instance_over;

/// ZTS's error body.
pub type ResourceError = ErrorBody;

/// Largest ZTS response body read (an identity with a chain is a few KiB).
pub const MAX_RESPONSE_LEN: usize = 1024 * 1024;

/// Default name of the header carrying an ntoken.
pub const PRINCIPAL_AUTH_HEADER: &str = "Athenz-Principal-Auth";

/// `POST /zts/v1/instance`: ask a provider-attested identity for a new instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRegisterInformation {
    /// Provider service name.
    pub provider: String,
    /// Domain of the instance.
    pub domain: String,
    /// Service of the instance.
    pub service: String,
    /// Attestation data for the provider (the identity JWT). Optional in Athenz's schema
    /// (`ZTSSchema`): ZTS itself refuses an X.509 register without it, by name.
    #[serde(default)]
    pub attestation_data: Secret,
    /// PEM CSR (optional in Athenz's schema: without one ZTS issues a JWT SVID instead).
    #[serde(default)]
    pub csr: String,
    /// Whether to return an ntoken too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<bool>,
    /// Requested certificate lifetime, minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_time: Option<i32>,
    /// Host name of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `POST /zts/v1/instance/{provider}/{domain}/{service}/{instanceId}`: refresh with the current
/// certificate as the TLS client certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRefreshInformation {
    /// Fresh attestation data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation_data: Option<Secret>,
    /// PEM CSR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<String>,
    /// Whether to return an ntoken too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<bool>,
    /// Requested certificate lifetime, minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_time: Option<i32>,
    /// Host name of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// What ZTS issues for an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceIdentity {
    /// Provider that confirmed the instance.
    pub provider: String,
    /// Principal `<domain>.<service>`.
    pub name: String,
    /// Instance id.
    pub instance_id: String,
    /// Leaf certificate, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x509_certificate: Option<String>,
    /// CA chain of the certificate, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x509_certificate_signer: Option<String>,
    /// ntoken, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_token: Option<Secret>,
    /// Extra attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// What ZTS sends the provider callback, and what the provider echoes back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceConfirmation {
    /// Provider service name.
    pub provider: String,
    /// Domain of the instance.
    pub domain: String,
    /// Service of the instance.
    pub service: String,
    /// Attestation data from the instance (the identity JWT). Real ZTS sends it as the instance
    /// gave it, so a refresh without any arrives with it null or absent: read as empty (for the
    /// callback to refuse by name), and left out when empty.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Secret::is_empty"
    )]
    pub attestation_data: Secret,
    /// Attributes: `instanceId`, `clientIP`, `sanDNS`, `sanIP`, `sanURI`, `certExpiryTime`, ...
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// A JSON `null` read as an empty secret.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
    Option::<Secret>::deserialize(d).map(Option::unwrap_or_default)
}

/// Attribute keys of an [`InstanceConfirmation`].
pub mod attr {
    /// Instance id.
    pub const INSTANCE_ID: &str = "instanceId";
    /// IP the request came from.
    pub const CLIENT_IP: &str = "clientIP";
    /// Comma-separated DNS SANs of the CSR.
    pub const SAN_DNS: &str = "sanDNS";
    /// Comma-separated IP SANs of the CSR.
    pub const SAN_IP: &str = "sanIP";
    /// Comma-separated URI SANs of the CSR.
    pub const SAN_URI: &str = "sanURI";
    /// Certificate lifetime granted by the provider, minutes.
    pub const CERT_EXPIRY_TIME: &str = "certExpiryTime";
}

/// `POST /zts/v1/instance/{domain}/{service}/refresh`: key-based refresh (control-plane SIA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRefreshRequest {
    /// PEM CSR made with the registered service key.
    pub csr: String,
    /// Requested lifetime, minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_time: Option<i32>,
    /// Version of the service key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

/// Answer of the key-based refresh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// Principal `<domain>.<service>`.
    pub name: String,
    /// Leaf certificate, PEM.
    pub certificate: String,
    /// CA bundle, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_bundle: Option<String>,
    /// ntoken, if ZTS issued one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_token: Option<Secret>,
}

/// A successful register: the identity and the `Location` of the new instance.
#[derive(Debug, Clone)]
pub struct Registered {
    /// What ZTS issued.
    pub identity: InstanceIdentity,
    /// The `Location` header (the instance's refresh URL path).
    pub location: Option<String>,
}

/// Why a ZTS call failed.
#[derive(Debug, Error)]
pub enum ZtsError {
    /// ZTS answered with an error; its code and message are kept.
    #[error("ZTS refused ({status}): {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// `code` from the body (the status if the body had none).
        code: i32,
        /// `message` from the body (or the raw body, truncated).
        message: String,
    },
    /// ZTS could not be reached, or did not answer in time.
    #[error("ZTS unreachable: {0}")]
    Unreachable(String),
    /// ZTS ended the TLS handshake refusing the client certificate presented (a refresh with a
    /// certificate it does not accept): a refusal, not unavailability.
    #[error("ZTS refused the client certificate in the TLS handshake: {0}")]
    CertificateRefused(String),
    /// ZTS answered something that is not the expected JSON.
    #[error("ZTS answered an unreadable {context}: {reason}")]
    BadResponse {
        /// Which response.
        context: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A request parameter is not a valid name (nothing was sent).
    #[error("ZTS request: {0}")]
    BadRequest(#[from] NameError),
    /// The TLS configuration could not be built.
    #[error("ZTS client TLS: {0}")]
    Tls(#[from] TlsError),
}

impl ZtsError {
    /// Whether retrying later may succeed: no answer (unreachable, a timeout) and the statuses
    /// real ZTS answers when it cannot decide now: 504 (a provider that did not answer, or
    /// answered 504: Athenz `ZTSImpl.validateConfirmationData`), 503 and 429 (overload), 500
    /// and 502. Every other answer (400, 401, 403, 404, ...) is ZTS's verdict: final.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable(_) => true,
            Self::Rejected { status, .. } => matches!(status, 429 | 500 | 502 | 503 | 504),
            _ => false,
        }
    }

    /// The HTTP status ZTS answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Rejected { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How to reach ZTS.
#[derive(Debug, Clone)]
pub struct ZtsClientConfig {
    /// Base URL ending in `/zts/v1`, e.g. `https://zts.example:4443/zts/v1`.
    pub url: String,
    /// The CA bundle that verifies ZTS (never the system roots), as it is at each connection:
    /// [`ServerCaBundle::from_file`] follows a CA rotation (docs/design.md §6).
    pub ca: Arc<ServerCaBundle>,
    /// Overall time allowed for one call.
    pub timeout: Duration,
    /// Time allowed to connect.
    pub connect_timeout: Duration,
}

/// An async ZTS client.
#[derive(Debug, Clone)]
pub struct ZtsClient {
    base: String,
    config: ZtsClientConfig,
    anonymous: reqwest::Client,
}

impl ZtsClient {
    /// A client for `config`; fails on a bad URL or CA bundle.
    pub fn new(config: ZtsClientConfig) -> Result<Self, ZtsError> {
        let base = config.url.trim_end_matches('/').to_owned();
        if !base.starts_with("https://") || !base.ends_with("/zts/v1") {
            return Err(ZtsError::BadRequest(NameError::new(
                "ZTS URL",
                &config.url,
                "must be https://<host>[:port]/zts/v1",
            )));
        }
        let anonymous = build_http_client(&config, None)?;
        Ok(Self {
            base,
            config,
            anonymous,
        })
    }

    /// Registers a new instance (`POST /instance`; no client certificate).
    pub async fn register(
        &self,
        info: &InstanceRegisterInformation,
    ) -> Result<Registered, ZtsError> {
        names::validate_provider("provider", &info.provider)?;
        names::validate_domain("domain", &info.domain)?;
        names::validate_service("service", &info.service)?;
        let url = format!("{}/instance", self.base);
        let resp = send(self.anonymous.post(url).json(info)).await?;
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let identity = read_json(resp, 201, "instance identity").await?;
        Ok(Registered { identity, location })
    }

    /// Refreshes an instance, presenting `current` (the instance's certificate and key) as the
    /// TLS client certificate.
    pub async fn refresh_instance(
        &self,
        target: &InstanceRef<'_>,
        info: &InstanceRefreshInformation,
        current: ClientIdentity,
    ) -> Result<InstanceIdentity, ZtsError> {
        target.validate()?;
        let client = build_http_client(&self.config, Some(current))?;
        let url = format!("{}{}", self.base, target.refresh_path());
        let resp = send(client.post(url).json(info)).await?;
        read_json(resp, 200, "instance identity").await
    }

    /// Key-based refresh for a control-plane service: the ntoken signed with the service key goes
    /// in `auth_header` (usually [`PRINCIPAL_AUTH_HEADER`]).
    pub async fn refresh_with_ntoken(
        &self,
        domain: &str,
        service: &str,
        request: &InstanceRefreshRequest,
        ntoken: &Secret,
        auth_header: &str,
    ) -> Result<Identity, ZtsError> {
        names::validate_domain("domain", domain)?;
        names::validate_service("service", service)?;
        let url = format!("{}/instance/{domain}/{service}/refresh", self.base);
        let resp = send(
            self.anonymous
                .post(url)
                .header(auth_header, ntoken.expose())
                .json(request),
        )
        .await?;
        read_json(resp, 200, "service identity").await
    }
}

/// Calls made as a service, with its certificate as the TLS client certificate
/// (docs/design.md §4.11): access tokens, role tokens and role certificates. Build one per
/// certificate: after a rotation, build a new one with the new pair.
#[derive(Debug, Clone)]
pub struct ServiceZtsClient {
    base: String,
    http: reqwest::Client,
}

impl ZtsClient {
    /// A client presenting `identity` (the service's certificate and key).
    pub fn as_service(&self, identity: ClientIdentity) -> Result<ServiceZtsClient, ZtsError> {
        Ok(ServiceZtsClient {
            base: self.base.clone(),
            http: build_http_client(&self.config, Some(identity))?,
        })
    }
}

/// The names of a token request, checked before anything is sent.
fn validate_domain_and_roles(domain: &str, roles: &[String]) -> Result<(), NameError> {
    names::validate_domain("domain", domain)?;
    roles
        .iter()
        .try_for_each(|role| names::validate_role("role", role))
}

/// `application/x-www-form-urlencoded` value encoding (RFC 3986 unreserved kept).
fn form_value(value: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(value, SET).to_string()
}

impl ServiceZtsClient {
    /// `POST /oauth2/token` (client credentials) for `roles` of `domain` (scope
    /// `<d>:role.<r> …`, or `<d>:domain` when empty), optionally on behalf of
    /// `proxy_for_principal` (ZTS's `proxy_for_principal` field).
    pub async fn access_token(
        &self,
        domain: &str,
        roles: &[String],
        expires_in: Option<u64>,
        proxy_for_principal: Option<&str>,
    ) -> Result<AccessTokenResponse, ZtsError> {
        validate_domain_and_roles(domain, roles)?;
        let scope = if roles.is_empty() {
            format!("{domain}:domain")
        } else {
            let scopes: Vec<String> = roles.iter().map(|r| format!("{domain}:role.{r}")).collect();
            scopes.join(" ")
        };
        let mut form = format!("grant_type=client_credentials&scope={}", form_value(&scope));
        if let Some(seconds) = expires_in {
            form.push_str(&format!("&expires_in={seconds}"));
        }
        if let Some(principal) = proxy_for_principal {
            names::split_service_name("proxy_for_principal", principal)?;
            form.push_str(&format!("&proxy_for_principal={}", form_value(principal)));
        }
        let resp = send(
            self.http
                .post(format!("{}/oauth2/token", self.base))
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(form),
        )
        .await?;
        read_json(resp, 200, "access token").await
    }

    /// `GET /domain/{domain}/token?role=…`: a role token for `roles` (all the caller's roles in
    /// `domain` when empty), valid at least `min_expiry` and at most `max_expiry` seconds,
    /// optionally on behalf of `proxy_for_principal` (ZTS's `proxyForPrincipal` parameter).
    pub async fn role_token(
        &self,
        domain: &str,
        roles: &[String],
        min_expiry: Option<u64>,
        max_expiry: Option<u64>,
        proxy_for_principal: Option<&str>,
    ) -> Result<RoleTokenResponse, ZtsError> {
        validate_domain_and_roles(domain, roles)?;
        let mut query = Vec::new();
        if !roles.is_empty() {
            query.push(format!("role={}", form_value(&roles.join(","))));
        }
        if let Some(s) = min_expiry {
            query.push(format!("minExpiryTime={s}"));
        }
        if let Some(s) = max_expiry {
            query.push(format!("maxExpiryTime={s}"));
        }
        if let Some(principal) = proxy_for_principal {
            names::split_service_name("proxy_for_principal", principal)?;
            query.push(format!("proxyForPrincipal={}", form_value(principal)));
        }
        let mut url = format!("{}/domain/{domain}/token", self.base);
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        let resp = send(self.http.get(url)).await?;
        read_json(resp, 200, "role token").await
    }

    /// `POST /rolecert`: a role certificate for `csr` (see [`names::role_csr_identity`]).
    pub async fn role_certificate(
        &self,
        request: &RoleCertificateRequest,
    ) -> Result<RoleCertificate, ZtsError> {
        let resp = send(
            self.http
                .post(format!("{}/rolecert", self.base))
                .json(request),
        )
        .await?;
        read_json(resp, 200, "role certificate").await
    }
}

/// The instance a refresh is for.
#[derive(Debug, Clone, Copy)]
pub struct InstanceRef<'a> {
    /// Provider.
    pub provider: &'a str,
    /// Domain.
    pub domain: &'a str,
    /// Service.
    pub service: &'a str,
    /// Instance id.
    pub instance_id: &'a str,
}

impl InstanceRef<'_> {
    /// The refresh route under the base URL: `/instance/{provider}/{domain}/{service}/{id}`
    /// (call [`Self::validate`] first).
    pub fn refresh_path(&self) -> String {
        format!(
            "/instance/{}/{}/{}/{}",
            self.provider, self.domain, self.service, self.instance_id
        )
    }

    /// Validates every path segment before it is put in a URL.
    pub fn validate(&self) -> Result<(), NameError> {
        names::validate_provider("provider", self.provider)?;
        names::validate_domain("domain", self.domain)?;
        names::validate_service("service", self.service)?;
        names::validate_instance_id("instance id", self.instance_id)
    }
}

fn build_http_client(
    config: &ZtsClientConfig,
    identity: Option<ClientIdentity>,
) -> Result<reqwest::Client, ZtsError> {
    let tls = client_config_with_bundle(&config.ca, identity)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(config.timeout)
        .connect_timeout(config.connect_timeout)
        .https_only(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| ZtsError::Unreachable(format!("building the HTTP client: {e}")))
}

async fn send(req: reqwest::RequestBuilder) -> Result<reqwest::Response, ZtsError> {
    req.send().await.map_err(|e| {
        if certificate_alert(&e).is_some() {
            ZtsError::CertificateRefused(error_chain(&e))
        } else {
            ZtsError::Unreachable(error_chain(&e))
        }
    })
}

/// The TLS alert in an error's chain by which a server refused the client's certificate.
pub(crate) fn certificate_alert(
    error: &(dyn std::error::Error + 'static),
) -> Option<rustls::AlertDescription> {
    use rustls::AlertDescription as A;
    crate::client::causes(error).find_map(|cause| match cause.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::AlertReceived(
            alert @ (A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied
            | A::CertificateRequired),
        )) => Some(*alert),
        _ => None,
    })
}

async fn read_json<T: DeserializeOwned>(
    resp: reqwest::Response,
    expected: u16,
    context: &'static str,
) -> Result<T, ZtsError> {
    let status = resp.status().as_u16();
    let body = read_limited(resp, MAX_RESPONSE_LEN)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge(_) => ZtsError::BadResponse {
                context,
                reason: e.to_string(),
            },
            ReadError::Transport(t) => ZtsError::Unreachable(t),
        })?;
    decode_answer(status, &body, expected, context)
}

/// ZTS's answer `body` with `status`: the `expected` type when the status is `expected`, else
/// ZTS's error (its `{code,message}`, or the body quoted when it is not one).
pub(crate) fn decode_answer<T: DeserializeOwned>(
    status: u16,
    body: &[u8],
    expected: u16,
    context: &'static str,
) -> Result<T, ZtsError> {
    if status != expected {
        return Err(match serde_json::from_slice::<ErrorBody>(body) {
            Ok(err) => ZtsError::Rejected {
                status,
                code: err.code,
                message: err.message,
            },
            Err(_) => ZtsError::Rejected {
                status,
                code: i32::from(status),
                message: crate::names::Quoted::new(&String::from_utf8_lossy(body)).to_string(),
            },
        });
    }
    serde_json::from_slice(body).map_err(|e| ZtsError::BadResponse {
        context,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_information_omits_empty_optionals() {
        let info = InstanceRegisterInformation {
            provider: "k8s.admin.athenz-callback".into(),
            domain: "media.sports".into(),
            service: "web".into(),
            attestation_data: Secret::new("jwt"),
            csr: "CSR".into(),
            token: Some(true),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&info).unwrap(),
            r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attestationData":"jwt","csr":"CSR","token":true}"#
        );
        assert!(!format!("{info:?}").contains("jwt"));
    }

    #[test]
    fn identity_tolerates_unknown_fields() {
        let json = r#"{"provider":"p.q","name":"a.b","instanceId":"i","x509Certificate":"C",
            "x509CertificateSigner":"S","serviceToken":"T","sshCertificate":"ssh","attributes":{"k":"v"},"future":1}"#;
        let id: InstanceIdentity = serde_json::from_str(json).unwrap();
        assert_eq!(id.x509_certificate.as_deref(), Some("C"));
        assert_eq!(id.service_token.as_ref().map(Secret::expose), Some("T"));
        assert_eq!(id.attributes.unwrap()["k"], "v");
        let minimal: InstanceIdentity =
            serde_json::from_str(r#"{"provider":"p.q","name":"a.b","instanceId":"i"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&minimal).unwrap(),
            r#"{"provider":"p.q","name":"a.b","instanceId":"i"}"#
        );
    }

    #[test]
    fn confirmation_round_trip() {
        let json = r#"{"provider":"k8s.admin.athenz-callback","domain":"media.sports","service":"web","attestationData":"jwt","attributes":{"instanceId":"u","sanDNS":"a,b"}}"#;
        let c: InstanceConfirmation = serde_json::from_str(json).unwrap();
        assert_eq!(c.attributes[attr::SAN_DNS], "a,b");
        assert_eq!(serde_json::to_string(&c).unwrap(), json);
        // ZTS forwards a refresh without attestation data with none (absent or null): read as
        // empty, for the callback to refuse by name, and left out when written
        for missing in [
            r#"{"provider":"p","domain":"d","service":"s"}"#,
            r#"{"provider":"p","domain":"d","service":"s","attestationData":null}"#,
        ] {
            let c: InstanceConfirmation = serde_json::from_str(missing).unwrap();
            assert!(c.attestation_data.is_empty());
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                r#"{"provider":"p","domain":"d","service":"s"}"#
            );
        }
        for bad in [
            r#"{"provider":1}"#,
            r#"{"provider":"p","domain":"d","service":"s","attestationData":"x","attributes":{"a":1}}"#,
            "[]",
        ] {
            assert!(
                serde_json::from_str::<InstanceConfirmation>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn key_based_types() {
        let req = InstanceRefreshRequest {
            csr: "CSR".into(),
            expiry_time: Some(60),
            key_id: Some("v1".into()),
        };
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"csr":"CSR","expiryTime":60,"keyId":"v1"}"#
        );
        let id: Identity =
            serde_json::from_str(r#"{"name":"a.b","certificate":"C","caCertBundle":"B"}"#).unwrap();
        assert_eq!(id.ca_cert_bundle.as_deref(), Some("B"));
        assert!(id.service_token.is_none());
    }

    #[test]
    fn transient_errors() {
        let rejected = |status| ZtsError::Rejected {
            status,
            code: i32::from(status),
            message: String::new(),
        };
        assert!(rejected(503).is_transient());
        assert!(rejected(504).is_transient());
        assert!(rejected(500).is_transient());
        assert!(rejected(429).is_transient());
        assert!(!rejected(404).is_transient());
        assert!(!rejected(401).is_transient());
        assert!(!rejected(403).is_transient());
        assert!(!rejected(400).is_transient());
        assert!(ZtsError::Unreachable("x".into()).is_transient());
    }

    #[test]
    fn instance_refs_are_validated() {
        let ok = InstanceRef {
            provider: "k8s.admin.athenz-callback",
            domain: "media.sports",
            service: "web",
            instance_id: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
        };
        ok.validate().unwrap();
        for bad in [
            InstanceRef {
                instance_id: "../x",
                ..ok
            },
            InstanceRef {
                instance_id: "a/b",
                ..ok
            },
            InstanceRef {
                domain: "a/b",
                ..ok
            },
            InstanceRef {
                service: "x?y",
                ..ok
            },
            InstanceRef {
                provider: "p",
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn config_url_is_checked() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem();
        let ca = ServerCaBundle::fixed(crate::crypto::pem_certificates(&ca_pem).unwrap()).unwrap();
        let config = |url: &str| ZtsClientConfig {
            url: url.into(),
            ca: Arc::clone(&ca),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        };
        let err = ZtsClient::new(config("http://zts/zts/v1")).unwrap_err();
        assert!(err.to_string().contains("ZTS URL"), "{err}");
        assert!(ZtsClient::new(config("https://zts/other")).is_err());
        assert!(ZtsClient::new(config("https://zts:4443/zts/v1")).is_ok());
        // an empty CA bundle is refused rather than trusting nothing (or everything)
        let err = ServerCaBundle::fixed(Vec::new()).unwrap_err();
        assert!(err.to_string().contains("CA bundle"), "{err}");
    }
}
