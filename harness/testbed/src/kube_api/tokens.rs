//! Service-account tokens, as the API server mints and reviews them (docs/design.md §5):
//! `TokenRequest` (`POST /api/v1/namespaces/{ns}/serviceaccounts/{sa}/token` with a pod
//! `boundObjectRef`), `TokenReview` (`POST /apis/authentication.k8s.io/v1/tokenreviews`) and the
//! claim and `extra` shapes a real API server uses, so the callback's node checks meet what a
//! cluster sends.
//!
//! Tokens are ES256 JWTs signed by a key the stand-in makes at start. A review authenticates a
//! token only if it verifies, has not expired, is for one of the requested audiences, and the pod
//! it is bound to still exists with the same uid — as the real server's bound-token checks do.

use super::{Cluster, status};
use athenz_core::http::{Body, json_response};
use http::{Response, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The issuer a cluster's tokens carry (kube-apiserver's default `--service-account-issuer`).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Shortest lifetime the API server grants (`expirationSeconds` below it is refused).
pub const MIN_EXPIRATION_SECS: i64 = 600;
/// Lifetime when the request names none.
pub const DEFAULT_EXPIRATION_SECS: i64 = 3600;

/// The stand-in's token signing key.
pub(super) struct TokenKey {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl TokenKey {
    pub(super) fn generate() -> Self {
        use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
        // P-256 generation cannot fail short of a broken OS RNG; the stand-in is for tests
        #[allow(clippy::expect_used)]
        let key = PrivateKey::generate(KeyAlgorithm::P256).expect("P-256 key generation");
        #[allow(clippy::expect_used)]
        let pem = key.to_pkcs8_pem().expect("PKCS#8 encoding");
        #[allow(clippy::expect_used)]
        let encoding = EncodingKey::from_ec_pem(pem.expose().as_bytes()).expect("EC key");
        #[allow(clippy::expect_used)]
        let decoding = DecodingKey::from_ec_pem(key.key_pair().public_key_pem().as_bytes())
            .expect("EC public key");
        Self { encoding, decoding }
    }
}

/// `{name, uid}` of an object a token names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameUid {
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// The `kubernetes.io` claim of a bound service-account token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaim {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub serviceaccount: NameUid,
    /// The pod the token is bound to.
    pub pod: NameUid,
    /// The pod's node (with `ServiceAccountTokenPodNodeInfo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<NameUid>,
}

/// Claims of a projected service-account token, as a real API server writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    /// Audiences.
    pub aud: Vec<String>,
    /// Expiry.
    pub exp: i64,
    /// Issued at.
    pub iat: i64,
    /// Issuer.
    pub iss: String,
    /// Token id (a UUID).
    pub jti: String,
    /// The binding.
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
    /// Not before.
    pub nbf: i64,
    /// `system:serviceaccount:<ns>:<name>`.
    pub sub: String,
}

/// A `TokenRequest` for a token bound to a pod.
#[derive(Debug, Clone, Copy)]
pub struct BoundTokenRequest<'a> {
    /// The service account's namespace (the pod's).
    pub namespace: &'a str,
    /// The service account.
    pub account: &'a str,
    /// The pod the token is bound to.
    pub pod_name: &'a str,
    /// Its uid, when the request names one (a mismatch is refused).
    pub pod_uid: Option<&'a str>,
    /// Audiences; none means the API server's own (its issuer).
    pub audiences: &'a [String],
    /// Lifetime; none means an hour.
    pub expiration_secs: Option<i64>,
}

/// The audiences a token is for: those asked, or the API server's own when none are.
fn audiences_or_issuer(audiences: &[String]) -> Vec<String> {
    if audiences.is_empty() {
        vec![ISSUER.to_owned()]
    } else {
        audiences.to_vec()
    }
}

/// Why a token could not be minted: HTTP status, Kubernetes reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequestRefused(pub StatusCode, pub &'static str, pub String);

/// A minted token and its expiry (Unix seconds).
#[derive(Debug, Clone)]
pub struct MintedToken {
    /// The JWT.
    pub token: String,
    /// Expiry.
    pub expires: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenRequestBody {
    spec: TokenRequestSpecBody,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenRequestSpecBody {
    #[serde(default)]
    audiences: Vec<String>,
    expiration_seconds: Option<i64>,
    bound_object_ref: Option<BoundObjectRef>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BoundObjectRef {
    kind: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

/// A random (version 4) UUID, as the API server gives objects and tokens.
pub(super) fn uuid_v4() -> String {
    let h = athenz_core::random::hex_name::<16>();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

impl Cluster {
    /// Mints a token as `TokenRequest` does.
    pub fn mint_token(
        &self,
        request: &BoundTokenRequest<'_>,
    ) -> Result<MintedToken, TokenRequestRefused> {
        self.mint_token_at(time::OffsetDateTime::now_utc().unix_timestamp(), request)
    }

    /// [`Self::mint_token`] as if it were `issued_at` (Unix seconds): a test's way to hold a token
    /// that has already expired.
    pub fn mint_token_at(
        &self,
        issued_at: i64,
        request: &BoundTokenRequest<'_>,
    ) -> Result<MintedToken, TokenRequestRefused> {
        let BoundTokenRequest {
            namespace,
            account,
            pod_name,
            pod_uid,
            audiences,
            expiration_secs,
        } = *request;
        let expiration = expiration_secs.unwrap_or(DEFAULT_EXPIRATION_SECS);
        if expiration < MIN_EXPIRATION_SECS {
            return Err(TokenRequestRefused(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!(
                    "TokenRequest.authentication.k8s.io \"{account}\" is invalid: spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration less than 10 minutes"
                ),
            ));
        }
        let pod = self.pod(namespace, pod_name).ok_or_else(|| {
            TokenRequestRefused(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("pods \"{pod_name}\" not found"),
            )
        })?;
        let actual_uid = pod.metadata.uid.clone().unwrap_or_default();
        if pod_uid.is_some_and(|u| u != actual_uid) {
            return Err(TokenRequestRefused(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                    pod_uid.unwrap_or_default()
                ),
            ));
        }
        let pod_account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .unwrap_or("default");
        if pod_account != account {
            return Err(TokenRequestRefused(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "cannot bind token for serviceaccount \"{account}\" to pod running with different serviceaccount name."
                ),
            ));
        }
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
            .map(|name| NameUid {
                uid: self.node_uid(&name).unwrap_or_default(),
                name,
            });
        let now = issued_at;
        let claims = TokenClaims {
            aud: audiences_or_issuer(audiences),
            exp: now + expiration,
            iat: now,
            iss: ISSUER.to_owned(),
            jti: uuid_v4(),
            kubernetes: KubernetesClaim {
                namespace: namespace.to_owned(),
                serviceaccount: NameUid {
                    name: account.to_owned(),
                    uid: self.service_account_uid(namespace, account),
                },
                pod: NameUid {
                    name: pod_name.to_owned(),
                    uid: actual_uid,
                },
                node,
            },
            nbf: now,
            sub: format!("system:serviceaccount:{namespace}:{account}"),
        };
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::ES256),
            &claims,
            &self.tokens.encoding,
        )
        .map_err(|e| {
            TokenRequestRefused(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            )
        })?;
        Ok(MintedToken {
            token,
            expires: claims.exp,
        })
    }

    /// Reviews a token for `audiences` (empty: the issuer's), as `TokenReview` does: the claims on
    /// success, the error text a real API server gives otherwise.
    pub fn review_token(&self, token: &str, audiences: &[String]) -> Result<TokenClaims, String> {
        let mut validation = Validation::new(Algorithm::ES256);
        validation.leeway = 0;
        validation.set_issuer(&[ISSUER]);
        validation.validate_aud = false;
        let claims = jsonwebtoken::decode::<TokenClaims>(token, &self.tokens.decoding, &validation)
            .map_err(|e| format!("[invalid bearer token, {e}]"))?
            .claims;
        let wanted = audiences_or_issuer(audiences);
        if !claims.aud.iter().any(|a| wanted.contains(a)) {
            return Err(
                "[invalid bearer token, token audiences [..] is invalid for the target audiences]"
                    .replace("[..]", &format!("{:?}", claims.aud)),
            );
        }
        let bound = &claims.kubernetes.pod;
        match self.pod(&claims.kubernetes.namespace, &bound.name) {
            Some(pod) if pod.metadata.uid.as_deref() == Some(bound.uid.as_str()) => {
                if pod.metadata.deletion_timestamp.is_some() {
                    return Err(format!(
                        "[invalid bearer token, pod \"{}\" is being deleted]",
                        bound.name
                    ));
                }
            }
            Some(_) => {
                return Err(format!(
                    "[invalid bearer token, pod \"{}\" (uid {}) is not valid anymore: the UID does not match]",
                    bound.name, bound.uid
                ));
            }
            None => {
                return Err(format!(
                    "[invalid bearer token, pod \"{}\" not found]",
                    bound.name
                ));
            }
        }
        Ok(claims)
    }

    fn service_account_uid(&self, namespace: &str, account: &str) -> String {
        // stable per account, as an API object's uid is
        let digest =
            athenz_core::volume::hex(&sha2_of(format!("{namespace}/{account}").as_bytes()));
        format!(
            "{}-{}-5{}-8{}-{}",
            &digest[0..8],
            &digest[8..12],
            &digest[13..16],
            &digest[17..20],
            &digest[20..32]
        )
    }
}

fn sha2_of(bytes: &[u8]) -> [u8; 32] {
    use aws_lc_rs::digest::{SHA256, digest};
    let d = digest(&SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// `POST /api/v1/namespaces/{ns}/serviceaccounts/{sa}/token`.
pub(super) fn token_request(
    cluster: &Cluster,
    namespace: &str,
    account: &str,
    body: &[u8],
) -> Response<Body> {
    let request: TokenRequestBody = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is not a valid TokenRequest: {e}"),
            );
        }
    };
    let Some(bound) = request.spec.bound_object_ref else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "this stand-in mints only pod-bound tokens: spec.boundObjectRef is required".into(),
        );
    };
    if bound.kind.as_deref() != Some("Pod") {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("cannot bind token to object of type {:?}", bound.kind),
        );
    }
    let name = bound.name.unwrap_or_default();
    match cluster.mint_token(&BoundTokenRequest {
        namespace,
        account,
        pod_name: &name,
        pod_uid: bound.uid.as_deref(),
        audiences: &request.spec.audiences,
        expiration_secs: request.spec.expiration_seconds,
    }) {
        Ok(minted) => {
            let expiry = time::OffsetDateTime::from_unix_timestamp(minted.expires)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_default();
            json_response(
                StatusCode::CREATED,
                &serde_json::json!({
                    "kind": "TokenRequest",
                    "apiVersion": "authentication.k8s.io/v1",
                    "metadata": {"name": account, "namespace": namespace, "creationTimestamp": null},
                    "spec": {
                        "audiences": audiences_or_issuer(&request.spec.audiences),
                        "expirationSeconds": request.spec.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECS),
                        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": bound.uid},
                    },
                    "status": {"token": minted.token, "expirationTimestamp": expiry},
                }),
            )
        }
        Err(TokenRequestRefused(code, reason, message)) => status(code, reason, message),
    }
}

#[derive(Deserialize)]
struct TokenReviewBody {
    spec: TokenReviewSpecBody,
}

#[derive(Deserialize)]
struct TokenReviewSpecBody {
    token: Option<String>,
    #[serde(default)]
    audiences: Vec<String>,
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`: always 201 for a well-formed review; a
/// token that does not authenticate is `authenticated: false` with `error`.
pub(super) fn token_review(cluster: &Cluster, body: &[u8]) -> Response<Body> {
    let review: TokenReviewBody = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is not a valid TokenReview: {e}"),
            );
        }
    };
    let token = review.spec.token.clone().unwrap_or_default();
    let spec = serde_json::json!({"token": token, "audiences": review.spec.audiences});
    let status_json = match cluster.review_token(&token, &review.spec.audiences) {
        Ok(claims) => {
            let k = &claims.kubernetes;
            let mut extra = serde_json::Map::new();
            extra.insert(
                "authentication.kubernetes.io/credential-id".into(),
                serde_json::json!([format!("JTI={}", claims.jti)]),
            );
            if let Some(node) = &k.node {
                extra.insert(
                    "authentication.kubernetes.io/node-name".into(),
                    serde_json::json!([node.name]),
                );
                extra.insert(
                    "authentication.kubernetes.io/node-uid".into(),
                    serde_json::json!([node.uid]),
                );
            }
            extra.insert(
                "authentication.kubernetes.io/pod-name".into(),
                serde_json::json!([k.pod.name]),
            );
            extra.insert(
                "authentication.kubernetes.io/pod-uid".into(),
                serde_json::json!([k.pod.uid]),
            );
            let wanted = audiences_or_issuer(&review.spec.audiences);
            let audiences: Vec<&String> =
                claims.aud.iter().filter(|a| wanted.contains(a)).collect();
            serde_json::json!({
                "authenticated": true,
                "user": {
                    "username": claims.sub,
                    "uid": k.serviceaccount.uid,
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", k.namespace), "system:authenticated"],
                    "extra": extra,
                },
                "audiences": audiences,
            })
        }
        Err(error) => serde_json::json!({"user": {}, "error": error}),
    };
    json_response(
        StatusCode::CREATED,
        &serde_json::json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status_json,
        }),
    )
}
