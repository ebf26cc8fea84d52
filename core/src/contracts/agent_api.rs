//! Wire types of the node agent's socket API (docs/design.md §4.2), used by the agent (server) and
//! the SIA (client).
//!
//! `POST /v1/init/{id}` (with [`InitRequest`]) and `POST /v1/refresh/{id}` (with
//! [`RefreshRequest`]) answer with [`IdentityResponse`]; errors are [`crate::http::ErrorBody`].
//!
//! With pod-made keys ([`KeySource::Pod`], docs/design.md §4.6) no key crosses the socket: the SIA
//! asks `GET /v1/csr/{id}` what its CSR must say ([`CsrTemplate`]), sends only the CSR to init, and
//! refreshes with ZTS itself: `POST /v1/attestation/{id}` ([`AttestationRequest`] →
//! [`AttestationResponse`]) gives it the JWT, `CONNECT <zts host:port>` (header
//! [`VOLUME_HEADER`]) a byte tunnel to ZTS, and `POST /v1/certificate/{id}`
//! ([`CertificateReport`]) tells the agent which certificate the pod now holds.
//!
//! Compatibility across versions (README, "Upgrades"): the agent (a DaemonSet, rolled node by
//! node) and the SIA (in every pod, replaced only when a pod is) run different versions for
//! weeks. So both ends ignore fields they do not know, and a minor version only adds optional
//! fields whose absence keeps the old behaviour; it never renames, removes or retypes one. The
//! golden files under `core/tests/golden/socket-api/` hold every call of each version, and
//! `core/tests/socket_api_golden.rs` checks both directions against them.

use crate::names::CsrIdentity;
use crate::secret::Secret;
use crate::volume::{InvalidVolumeId, VolumeId};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Largest request body the agent accepts: 64 KiB.
pub const MAX_REQUEST_BODY: usize = 64 * 1024;
/// Route prefix of init.
pub const INIT_PREFIX: &str = "/v1/init/";
/// Route prefix of refresh.
pub const REFRESH_PREFIX: &str = "/v1/refresh/";
/// Route prefix of the CSR template (`GET`).
pub const CSR_PREFIX: &str = "/v1/csr/";
/// Route prefix of the refresh attestation.
pub const ATTESTATION_PREFIX: &str = "/v1/attestation/";
/// Route prefix of the certificate report.
pub const CERTIFICATE_PREFIX: &str = "/v1/certificate/";
/// Header of a `CONNECT` naming the volume the tunnel is for (the caller must be its pod).
pub const VOLUME_HEADER: &str = "athenz-volume-id";

/// Where a pod's private key is made: recorded in each volume's state, so defined with it.
pub use crate::volume::KeySource;

/// The credentials handed to a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityResponse {
    /// Private key, PKCS#8 PEM: only when the agent made it ([`KeySource::Agent`]).
    #[serde(rename = "keyPEM", default, skip_serializing_if = "Option::is_none")]
    pub key_pem: Option<Secret>,
    /// Leaf certificate followed by the chain, PEM.
    #[serde(rename = "certPEM")]
    pub cert_pem: String,
    /// CA certificates to trust, PEM.
    #[serde(rename = "caCertPEM")]
    pub ca_cert_pem: String,
    /// Athenz principal token.
    pub ntoken: Secret,
    /// Certificate expiry, RFC 3339.
    #[serde(rename = "expiresAt")]
    pub expires_at: String,
}

impl IdentityResponse {
    /// The credential files' contents this answer gives, when it carries the key (the agent
    /// made it); `None` for a pod-made key, which the answer never carries. The one mapping
    /// from an answer to the files, for the SIA and the CSI driver's files mode alike.
    pub fn credentials_with_key(&self) -> Option<crate::files::Credentials<'_>> {
        Some(crate::files::Credentials {
            key_pem: Some(self.key_pem.as_ref()?),
            cert_pem: &self.cert_pem,
            ca_pem: &self.ca_cert_pem,
            ntoken: &self.ntoken,
        })
    }

    /// The answer for ZTS's `identity` whose leaf (`leaf_pem`, read as `leaf`) was checked to be
    /// for the key: `certPEM` is the leaf then the chain (an unreadable bundle still leaves the
    /// leaf usable), `caCertPEM` ZTS's signer bundle, `expiresAt` the leaf's expiry. Shared by
    /// the agent (what it answers) and the SIA (what it gets from ZTS itself with a pod-made key).
    pub fn from_instance_identity(
        identity: &crate::zts::InstanceIdentity,
        leaf_pem: &str,
        leaf: &crate::crypto::CertInfo,
        key_pem: Option<Secret>,
    ) -> Self {
        let signer = identity.x509_certificate_signer.clone().unwrap_or_default();
        let cert_pem = crate::crypto::leaf_with_chain(leaf_pem, &signer)
            .unwrap_or_else(|_| format!("{}\n", leaf_pem.trim_end()));
        Self {
            key_pem,
            cert_pem,
            ca_cert_pem: signer,
            ntoken: identity.service_token.clone().unwrap_or_default(),
            expires_at: leaf
                .not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        }
    }
}

/// Body of `POST /v1/refresh/{id}`: the pair the pod holds now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefreshRequest {
    /// Current private key, PEM.
    #[serde(rename = "keyPEM")]
    pub key_pem: Secret,
    /// Current certificate: the leaf alone or leaf + chain, PEM.
    #[serde(rename = "certPEM")]
    pub cert_pem: String,
}

/// Body of `POST /v1/init/{id}`: `{}` when the agent makes the key, the pod's CSR otherwise.
/// A `keyPEM` is refused (no version sends a key to init): see [`NoKey`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NoKey<InitRequestFields>")]
pub struct InitRequest {
    /// The pod's CSR, PEM: it must say exactly what [`CsrTemplate`] says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<String>,
}

/// What a pod's CSR must say (`GET /v1/csr/{id}`): the subject and every SAN, as the agent
/// derives them from the kubelet and the volume. Nothing more, nothing less is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsrTemplate {
    /// Subject CN: `<domain>.<service>`.
    #[serde(rename = "commonName")]
    pub common_name: String,
    /// Subject OU: the provider.
    #[serde(
        rename = "organizationalUnit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub organizational_unit: Option<String>,
    /// DNS SANs.
    #[serde(rename = "dnsNames", default)]
    pub dns_names: Vec<String>,
    /// IP SANs.
    #[serde(rename = "ipAddresses", default)]
    pub ip_addresses: Vec<IpAddr>,
    /// URI SANs.
    #[serde(default)]
    pub uris: Vec<String>,
}

impl From<CsrIdentity> for CsrTemplate {
    fn from(identity: CsrIdentity) -> Self {
        Self {
            common_name: identity.common_name,
            organizational_unit: identity.organizational_unit,
            dns_names: identity.dns_names,
            ip_addresses: identity.ip_addresses,
            uris: identity.uris,
        }
    }
}

impl From<CsrTemplate> for CsrIdentity {
    fn from(template: CsrTemplate) -> Self {
        Self {
            common_name: template.common_name,
            organizational_unit: template.organizational_unit,
            dns_names: template.dns_names,
            ip_addresses: template.ip_addresses,
            uris: template.uris,
        }
    }
}

/// Body of `POST /v1/attestation/{id}` and `POST /v1/certificate/{id}`: the certificate the pod
/// holds (public; the key stays in the pod). A `keyPEM` is refused: see [`NoKey`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NoKey<CertificateReportFields>")]
pub struct CertificateReport {
    /// The leaf alone or leaf + chain, PEM.
    #[serde(rename = "certPEM")]
    pub cert_pem: String,
}

/// A request body of a call that takes no key, read with a `keyPEM` beside its fields. Both
/// ends ignore fields they do not know (a newer peer may add some), except this one: a key in
/// such a body is a client that would hand its pod's key to the agent, which pod-made keys
/// exist to prevent (docs/design.md §4.6), so it is refused, naming the field.
#[derive(Deserialize)]
struct NoKey<T> {
    #[serde(flatten)]
    fields: T,
    #[serde(rename = "keyPEM", default)]
    key_pem: Option<serde::de::IgnoredAny>,
}

/// What [`NoKey`] says when a body holds a key.
const NO_KEY_HERE: &str = "keyPEM: no private key crosses the socket on this call";

#[derive(Deserialize)]
struct InitRequestFields {
    #[serde(default)]
    csr: Option<String>,
}

impl TryFrom<NoKey<InitRequestFields>> for InitRequest {
    type Error = &'static str;
    fn try_from(body: NoKey<InitRequestFields>) -> Result<Self, Self::Error> {
        match body.key_pem {
            Some(_) => Err(NO_KEY_HERE),
            None => Ok(Self {
                csr: body.fields.csr,
            }),
        }
    }
}

#[derive(Deserialize)]
struct CertificateReportFields {
    #[serde(rename = "certPEM")]
    cert_pem: String,
}

impl TryFrom<NoKey<CertificateReportFields>> for CertificateReport {
    type Error = &'static str;
    fn try_from(body: NoKey<CertificateReportFields>) -> Result<Self, Self::Error> {
        match body.key_pem {
            Some(_) => Err(NO_KEY_HERE),
            None => Ok(Self {
                cert_pem: body.fields.cert_pem,
            }),
        }
    }
}

/// Body of `POST /v1/attestation/{id}`.
pub type AttestationRequest = CertificateReport;

/// Where ZTS is and how to verify it, for a pod that refreshes through the agent's tunnel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZtsEndpoint {
    /// ZTS's base URL, `https://<host>[:port]/zts/v1`; `CONNECT` to its `host:port`.
    pub url: String,
    /// CA certificates that verify ZTS's server certificate, PEM.
    #[serde(rename = "caCertPEM")]
    pub ca_cert_pem: String,
}

/// Answer of `POST /v1/attestation/{id}`: what a pod needs to refresh with ZTS itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestationResponse {
    /// The identity JWT for ZTS's `attestationData`, for this pod only.
    #[serde(rename = "attestationData")]
    pub attestation_data: Secret,
    /// What the new CSR must say.
    pub csr: CsrTemplate,
    /// The refresh path's provider.
    pub provider: String,
    /// Athenz domain.
    pub domain: String,
    /// Athenz service.
    pub service: String,
    /// Instance id (the pod UID).
    #[serde(rename = "instanceId")]
    pub instance_id: String,
    /// ZTS.
    pub zts: ZtsEndpoint,
}

/// Which agent operation a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentRoute {
    /// `POST /v1/init/{id}`.
    Init(VolumeId),
    /// `POST /v1/refresh/{id}`.
    Refresh(VolumeId),
    /// `GET /v1/csr/{id}`.
    Csr(VolumeId),
    /// `POST /v1/attestation/{id}`.
    Attestation(VolumeId),
    /// `POST /v1/certificate/{id}`.
    Certificate(VolumeId),
}

/// Path of the init call for `id`.
pub fn init_path(id: &VolumeId) -> String {
    format!("{INIT_PREFIX}{id}")
}

/// Path of the refresh call for `id`.
pub fn refresh_path(id: &VolumeId) -> String {
    format!("{REFRESH_PREFIX}{id}")
}

/// Host and port of a ZTS base URL (`https://<host>[:port]/zts/v1`; port 443 when none): where
/// the agent's tunnel goes and what a `CONNECT` names.
pub fn zts_authority(url: &str) -> Result<(String, u16), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("ZTS URL {url:?}: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("ZTS URL {url:?}: must be https"));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("ZTS URL {url:?}: no host"))?;
    Ok(host_and_port(authority, 443))
}

/// An authority's host (lowercase, IPv6 without brackets) and port (`default_port` when none):
/// how the agent compares a `CONNECT` target with ZTS's.
pub fn host_and_port(authority: &http::uri::Authority, default_port: u16) -> (String, u16) {
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    (host, authority.port_u16().unwrap_or(default_port))
}

/// `host:port`, with an IPv6 host in brackets.
pub fn format_authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Path of the CSR template call for `id`.
pub fn csr_path(id: &VolumeId) -> String {
    format!("{CSR_PREFIX}{id}")
}

/// Path of the attestation call for `id`.
pub fn attestation_path(id: &VolumeId) -> String {
    format!("{ATTESTATION_PREFIX}{id}")
}

/// Path of the certificate report for `id`.
pub fn certificate_path(id: &VolumeId) -> String {
    format!("{CERTIFICATE_PREFIX}{id}")
}

impl AgentRoute {
    /// Parses a request path. `None` means "not a volume route"; `Some(Err)` means the route is
    /// right but the id is not a valid id (the empty id included), which is a 400.
    pub fn parse(path: &str) -> Option<Result<Self, InvalidVolumeId>> {
        type Make = fn(VolumeId) -> AgentRoute;
        let routes: [(&str, Make); 5] = [
            (INIT_PREFIX, Self::Init),
            (REFRESH_PREFIX, Self::Refresh),
            (CSR_PREFIX, Self::Csr),
            (ATTESTATION_PREFIX, Self::Attestation),
            (CERTIFICATE_PREFIX, Self::Certificate),
        ];
        routes.iter().find_map(|(prefix, make)| {
            path.strip_prefix(prefix)
                .map(|id| VolumeId::parse(id).map(make))
        })
    }

    /// The volume the route is for.
    pub fn volume(&self) -> &VolumeId {
        match self {
            Self::Init(id)
            | Self::Refresh(id)
            | Self::Csr(id)
            | Self::Attestation(id)
            | Self::Certificate(id) => id,
        }
    }

    /// The route's name, as metrics and logs show it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Init(_) => "init",
            Self::Refresh(_) => "refresh",
            Self::Csr(_) => "csr",
            Self::Attestation(_) => "attestation",
            Self::Certificate(_) => "certificate",
        }
    }

    /// The method the route takes.
    pub fn method(&self) -> http::Method {
        match self {
            Self::Csr(_) => http::Method::GET,
            _ => http::Method::POST,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_response_field_names() {
        let r = IdentityResponse {
            key_pem: Some(Secret::new("K")),
            cert_pem: "C".into(),
            ca_cert_pem: "A".into(),
            ntoken: Secret::new("N"),
            expires_at: "2026-11-22T00:00:00Z".into(),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"keyPEM":"K","certPEM":"C","caCertPEM":"A","ntoken":"N","expiresAt":"2026-11-22T00:00:00Z"}"#
        );
        assert_eq!(serde_json::from_str::<IdentityResponse>(&json).unwrap(), r);
        let shown = format!("{r:?}");
        assert!(
            !shown.contains("\"K\"") && !shown.contains("\"N\""),
            "{shown}"
        );
        // a pod-made key: the answer carries none, not even an empty field
        let keyless = IdentityResponse { key_pem: None, ..r };
        let json = serde_json::to_string(&keyless).unwrap();
        assert!(!json.contains("keyPEM"), "{json}");
        assert_eq!(
            serde_json::from_str::<IdentityResponse>(&json).unwrap(),
            keyless
        );
    }

    #[test]
    fn pod_key_bodies_refuse_keys_and_wrong_types_and_ignore_unknown_fields() {
        assert_eq!(
            serde_json::from_str::<InitRequest>("{}").unwrap(),
            InitRequest::default()
        );
        let with_csr: InitRequest = serde_json::from_str(r#"{"csr":"C"}"#).unwrap();
        assert_eq!(with_csr.csr.as_deref(), Some("C"));
        // a later version's field is ignored
        let newer: InitRequest = serde_json::from_str(r#"{"csr":"a","x":{"y":1}}"#).unwrap();
        assert_eq!(newer.csr.as_deref(), Some("a"));
        for bad in [r#"{"csr":1}"#, "", "[]", r#"{"csr":"a","csr":"b"}"#] {
            assert!(serde_json::from_str::<InitRequest>(bad).is_err(), "{bad}");
        }
        for with_key in [r#"{"keyPEM":"k"}"#, r#"{"csr":"a","keyPEM":{"pem":"k"}}"#] {
            let err = serde_json::from_str::<InitRequest>(with_key).unwrap_err();
            assert!(err.to_string().contains("keyPEM"), "{with_key}: {err}");
        }
        for bad in [r#"{}"#, r#"{"certPEM":null}"#] {
            assert!(
                serde_json::from_str::<CertificateReport>(bad).is_err(),
                "{bad}"
            );
        }
        let err = serde_json::from_str::<CertificateReport>(r#"{"certPEM":"c","keyPEM":"k"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("keyPEM"), "{err}");
        let newer: CertificateReport =
            serde_json::from_str(r#"{"certPEM":"c","chainOnly":true}"#).unwrap();
        assert_eq!(newer.cert_pem, "c");
        let template = CsrTemplate {
            common_name: "d.s".into(),
            organizational_unit: Some("p".into()),
            dns_names: vec!["s.d.example".into()],
            ip_addresses: vec!["10.0.0.1".parse().unwrap()],
            uris: vec!["spiffe://x".into()],
        };
        assert_eq!(
            serde_json::to_string(&template).unwrap(),
            r#"{"commonName":"d.s","organizationalUnit":"p","dnsNames":["s.d.example"],"ipAddresses":["10.0.0.1"],"uris":["spiffe://x"]}"#
        );
        let back: CsrIdentity = template.clone().into();
        assert_eq!(CsrTemplate::from(back), template);
    }

    #[test]
    fn zts_authorities() {
        assert_eq!(
            zts_authority("https://ZTS.example:4443/zts/v1").unwrap(),
            ("zts.example".to_owned(), 4443)
        );
        assert_eq!(
            zts_authority("https://zts.example/zts/v1").unwrap(),
            ("zts.example".to_owned(), 443)
        );
        let (host, port) = zts_authority("https://[::1]:8443/zts/v1").unwrap();
        assert_eq!(format_authority(&host, port), "[::1]:8443");
        for bad in ["http://zts/zts/v1", "zts:443", "", "https:///zts/v1"] {
            assert!(zts_authority(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_source_names() {
        assert_eq!(KeySource::default(), KeySource::Pod);
        assert_eq!(KeySource::Agent.to_string(), "agent");
        assert_eq!(serde_json::to_string(&KeySource::Pod).unwrap(), r#""pod""#);
    }

    #[test]
    fn refresh_request_needs_its_fields_and_ignores_unknown_ones() {
        let ok: RefreshRequest = serde_json::from_str(r#"{"keyPEM":"k","certPEM":"c"}"#).unwrap();
        assert_eq!(ok.cert_pem, "c");
        let newer: RefreshRequest =
            serde_json::from_str(r#"{"keyPEM":"k","certPEM":"c","x":1}"#).unwrap();
        assert_eq!(newer, ok);
        for bad in [
            r#"{"keyPEM":"k"}"#,
            r#"{"keyPEM":1,"certPEM":"c"}"#,
            r#"[]"#,
            "",
        ] {
            assert!(
                serde_json::from_str::<RefreshRequest>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn routes() {
        let id = "ab".repeat(32);
        assert_eq!(
            AgentRoute::parse(&format!("/v1/init/{id}")),
            Some(Ok(AgentRoute::Init(VolumeId::parse(&id).unwrap())))
        );
        assert_eq!(
            AgentRoute::parse(&format!("/v1/refresh/{id}")),
            Some(Ok(AgentRoute::Refresh(VolumeId::parse(&id).unwrap())))
        );
        assert_eq!(
            init_path(&VolumeId::parse(&id).unwrap()),
            format!("/v1/init/{id}")
        );
        for bad in [
            "/v1/init/".to_owned(),
            format!("/v1/init/{id}/"),
            format!("/v1/init/../{id}"),
            format!("/v1/refresh/{}", id.to_uppercase()),
        ] {
            assert!(matches!(AgentRoute::parse(&bad), Some(Err(_))), "{bad}");
        }
        for (path, name) in [
            (format!("/v1/csr/{id}"), "csr"),
            (format!("/v1/attestation/{id}"), "attestation"),
            (format!("/v1/certificate/{id}"), "certificate"),
        ] {
            let route = AgentRoute::parse(&path).unwrap().unwrap();
            assert_eq!(route.name(), name);
            assert_eq!(route.volume().to_string(), id);
        }
        assert_eq!(
            AgentRoute::parse(&format!("/v1/csr/{id}"))
                .unwrap()
                .unwrap()
                .method(),
            http::Method::GET
        );
        assert!(matches!(
            AgentRoute::parse("/v1/attestation/x"),
            Some(Err(_))
        ));
        assert_eq!(AgentRoute::parse("/healthz"), None);
        assert_eq!(AgentRoute::parse("/v1/other/x"), None);
    }
}
