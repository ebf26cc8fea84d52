//! Wire types of the identity JWT (docs/design.md §4.3), shared by the jwt-service (which signs),
//! the agent (which asks) and the callback (which verifies).

use crate::secret::Secret;
use crate::subject::PodSubject;
use serde::{Deserialize, Serialize};

/// Route of the jwt-service.
pub const JWT_PATH: &str = "/v1/jwt";
/// Default `aud` of identity JWTs.
pub const DEFAULT_AUDIENCE: &str = "k8s-athenz-identity";
/// Default `iss` of identity JWTs.
pub const DEFAULT_ISSUER: &str = "athenz-k8s-identity/jwt-service";

/// `POST /v1/jwt` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtRequest {
    /// The pod to vouch for (validated on deserialisation).
    pub subject: PodSubject,
}

/// `POST /v1/jwt` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwtResponse {
    /// The signed JWT.
    pub jwt: Secret,
}

/// Claims of an identity JWT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityClaims {
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// The subject URI `pod:<ns>/<name>?d=..&n=..&i=..&u=..`.
    pub sub: String,
    /// Issued at (Unix seconds).
    pub iat: i64,
    /// Not before (Unix seconds).
    pub nbf: i64,
    /// Expires (Unix seconds).
    pub exp: i64,
    /// Unique token id, for replay detection.
    pub jti: String,
    /// The node whose agent asked: taken by the jwt-service from the caller's certificate
    /// (its `athenz://instanceid/<provider>/<node>` URI), never from the request; the callback
    /// requires the pod to be scheduled there (docs/design.md §4.3, §4.4).
    pub node: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_is_strict() {
        let ok = r#"{"subject":{"namespace":"a","name":"b","uid":"0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c","domain":"a","service":"s","ip":"10.0.0.1"}}"#;
        serde_json::from_str::<JwtRequest>(ok).unwrap();
        for bad in [
            r#"{}"#,
            r#"{"subject":{}}"#,
            &ok.replace("}}", "},\"x\":1}"),
            &ok.replace("\"s\"", "\"s/../x\""),
            "[]",
        ] {
            assert!(serde_json::from_str::<JwtRequest>(bad).is_err(), "{bad}");
        }
    }
}
