//! Wire types of the node agent's socket API (DESIGN.md 4.2), used by the agent (server) and the
//! SIA (client).
//!
//! `POST /v1/init/{id}` and `POST /v1/refresh/{id}` (with [`RefreshRequest`]) answer with
//! [`IdentityResponse`]; errors are [`crate::http::ErrorBody`].

use crate::secret::Secret;
use crate::volume::{InvalidVolumeId, VolumeId};
use serde::{Deserialize, Serialize};

/// Largest request body the agent accepts: 64 KiB.
pub const MAX_REQUEST_BODY: usize = 64 * 1024;
/// Route prefix of init.
pub const INIT_PREFIX: &str = "/v1/init/";
/// Route prefix of refresh.
pub const REFRESH_PREFIX: &str = "/v1/refresh/";

/// The credentials handed to a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityResponse {
    /// Private key, PKCS#8 PEM.
    #[serde(rename = "keyPEM")]
    pub key_pem: Secret,
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

/// Body of `POST /v1/refresh/{id}`: the pair the pod holds now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    /// Current private key, PEM.
    #[serde(rename = "keyPEM")]
    pub key_pem: Secret,
    /// Current certificate: the leaf alone or leaf + chain, PEM.
    #[serde(rename = "certPEM")]
    pub cert_pem: String,
}

/// Which agent operation a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentRoute {
    /// `POST /v1/init/{id}`.
    Init(VolumeId),
    /// `POST /v1/refresh/{id}`.
    Refresh(VolumeId),
}

/// Path of the init call for `id`.
pub fn init_path(id: &VolumeId) -> String {
    format!("{INIT_PREFIX}{id}")
}

/// Path of the refresh call for `id`.
pub fn refresh_path(id: &VolumeId) -> String {
    format!("{REFRESH_PREFIX}{id}")
}

impl AgentRoute {
    /// Parses a request path. `None` means "not an init or refresh path"; `Some(Err)` means the
    /// route is right but the id is not a valid id (the empty id included), which is a 400.
    pub fn parse(path: &str) -> Option<Result<Self, InvalidVolumeId>> {
        if let Some(id) = path.strip_prefix(INIT_PREFIX) {
            Some(VolumeId::parse(id).map(Self::Init))
        } else {
            path.strip_prefix(REFRESH_PREFIX)
                .map(|id| VolumeId::parse(id).map(Self::Refresh))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_response_field_names() {
        let r = IdentityResponse {
            key_pem: Secret::new("K"),
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
    }

    #[test]
    fn refresh_request_is_strict() {
        let ok: RefreshRequest = serde_json::from_str(r#"{"keyPEM":"k","certPEM":"c"}"#).unwrap();
        assert_eq!(ok.cert_pem, "c");
        for bad in [
            r#"{"keyPEM":"k"}"#,
            r#"{"keyPEM":"k","certPEM":"c","x":1}"#,
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
        assert_eq!(AgentRoute::parse("/healthz"), None);
        assert_eq!(AgentRoute::parse("/v1/other/x"), None);
    }
}
