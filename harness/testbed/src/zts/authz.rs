//! The dev ZTS's authorization (docs/design.md §4.11): roles and their members, and the OAuth2
//! access tokens ZTS issues for them (`POST /zts/v1/oauth2/token`, client credentials over mutual
//! TLS) with the key set that verifies them (`GET /zts/v1/oauth2/keys`).

use athenz_core::crypto::PrivateKey;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::collections::BTreeSet;

/// A role of a domain and who is in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleEntry {
    /// The domain, e.g. `media.sports`.
    pub domain: String,
    /// The role's name in it, e.g. `readers`.
    pub role: String,
    /// Principals (`domain.service`); `*` is everyone, and a trailing `*` a prefix
    /// (`media.sports.*`), as Athenz role members may be written.
    pub members: Vec<String>,
}

impl RoleEntry {
    /// Whether `principal` is a member.
    pub fn has_member(&self, principal: &str) -> bool {
        self.members.iter().any(|m| match m.strip_suffix('*') {
            Some(prefix) => principal.starts_with(prefix),
            None => m == principal,
        })
    }
}

/// The `kid` of the dev ZTS's one token signing key.
pub const TOKEN_KEY_ID: &str = "0";

/// Why an authorization request is refused: HTTP status and ZTS's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzRefusal(pub u16, pub String);

fn bad_request(msg: impl Into<String>) -> AuthzRefusal {
    AuthzRefusal(400, msg.into())
}

/// What an access token request asks for: one domain and, unless the whole domain is asked
/// (`<d>:domain`), some of its roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The domain.
    pub domain: String,
    /// The roles named, or `None` for `<d>:domain` (every role the caller is in).
    pub roles: Option<BTreeSet<String>>,
}

fn valid_role(role: &str) -> bool {
    athenz_core::names::validate_role("role", role).is_ok()
}

/// The scope of a role token request: `domain` and the comma-separated `roles` (all the caller's
/// roles in it when `None` or empty).
pub fn role_scope(domain: &str, roles: Option<&str>) -> Result<Scope, AuthzRefusal> {
    athenz_core::names::validate_domain("domain", domain)
        .map_err(|e| bad_request(format!("invalid domain: {e}")))?;
    let roles = match roles.filter(|r| !r.is_empty()) {
        None => None,
        Some(list) => Some(
            list.split(',')
                .map(|r| {
                    valid_role(r)
                        .then(|| r.to_owned())
                        .ok_or_else(|| bad_request(format!("invalid role {r:?}")))
                })
                .collect::<Result<BTreeSet<_>, _>>()?,
        ),
    };
    Ok(Scope {
        domain: domain.to_owned(),
        roles,
    })
}

/// The roles of `scope` that `principal` is in, from `roles`: 404 for a domain with no roles
/// ("No such domain"), 403 when the caller is in none of them or a named role does not exist,
/// with Athenz's message (`ZTSImpl.tokenErrorMessage`, which names the route `caller`).
pub fn granted_roles(
    caller: &str,
    roles: &[RoleEntry],
    scope: &Scope,
    principal: &str,
) -> Result<Vec<String>, AuthzRefusal> {
    let in_domain: Vec<&RoleEntry> = roles.iter().filter(|r| r.domain == scope.domain).collect();
    if in_domain.is_empty() {
        return Err(AuthzRefusal(
            404,
            format!("No such domain: {}", scope.domain),
        ));
    }
    let granted: Vec<String> = in_domain
        .iter()
        .filter(|r| {
            scope
                .roles
                .as_ref()
                .is_none_or(|want| want.contains(&r.role))
        })
        .filter(|r| r.has_member(principal))
        .map(|r| r.role.clone())
        .collect();
    if granted.is_empty() {
        return Err(not_included(caller, scope, principal));
    }
    Ok(granted)
}

/// A token's lifetime when the request asks for none: ZTS's `athenz.zts.role_token_default_timeout`,
/// two hours by default (ZTSImpl), for role tokens and access tokens alike.
pub const DEFAULT_TOKEN_EXPIRY_SECS: i64 = 2 * 3600;

/// 403 with `ZTSImpl.tokenErrorMessage`: `principal` is in none of the roles `scope` asks for.
pub fn not_included(caller: &str, scope: &Scope, principal: &str) -> AuthzRefusal {
    let asked = if scope.roles.is_some() {
        "the requested role(s)"
    } else {
        "any role"
    };
    AuthzRefusal(
        403,
        format!(
            "{caller}: principal {principal} is not included in {asked} in domain {}",
            scope.domain
        ),
    )
}

/// The claims of an access token as ZTS writes them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccessTokenClaims {
    /// Always 1.
    pub ver: u32,
    /// The issuer (ZTS's URL).
    pub iss: String,
    /// The audience: the domain.
    pub aud: String,
    /// The principal.
    pub sub: String,
    /// The principal.
    pub uid: String,
    /// The principal.
    pub client_id: String,
    /// Issued at.
    pub iat: i64,
    /// When the principal authenticated (the request).
    pub auth_time: i64,
    /// Expiry.
    pub exp: i64,
    /// Unique id.
    pub jti: String,
    /// The roles granted.
    pub scp: Vec<String>,
    /// The client certificate the token is bound to (RFC 8705).
    pub cnf: Confirmation,
}

/// `cnf`: the SHA-256 thumbprint of the client certificate (base64url, no padding).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Confirmation {
    /// `x5t#S256`.
    #[serde(rename = "x5t#S256")]
    pub x5t_s256: String,
}

/// `x5t#S256` of a certificate (DER).
pub fn thumbprint(cert_der: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(cert_der))
}

/// Signs `claims` as a JWT of type `typ` (`at+jwt` for access tokens, `JWT` for ID tokens) with
/// the token key (ES256, `kid` [`TOKEN_KEY_ID`]).
pub fn sign_jwt(key: &PrivateKey, typ: &str, claims: &impl Serialize) -> Result<String, String> {
    let pem = key.to_pkcs8_pem().map_err(|e| e.to_string())?;
    let encoding = jsonwebtoken::EncodingKey::from_ec_pem(pem.expose().as_bytes())
        .map_err(|e| e.to_string())?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.typ = Some(typ.into());
    header.kid = Some(TOKEN_KEY_ID.into());
    jsonwebtoken::encode(&header, claims, &encoding).map_err(|e| e.to_string())
}

/// The JWKS of the token key: one P-256 key (`kty` EC, `crv` P-256, `x`, `y`, `kid`, `alg`, `use`).
pub fn jwks(key: &PrivateKey) -> Result<serde_json::Value, String> {
    let spki = key.public_key_der();
    // a P-256 SubjectPublicKeyInfo ends with the uncompressed point 04 || x || y
    let point = spki
        .len()
        .checked_sub(65)
        .map(|start| &spki[start..])
        .filter(|p| p[0] == 4)
        .ok_or("the token key is not P-256")?;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    Ok(serde_json::json!({
        "keys": [{
            "kty": "EC",
            "crv": "P-256",
            "x": b64(&point[1..33]),
            "y": b64(&point[33..65]),
            "kid": TOKEN_KEY_ID,
            "alg": "ES256",
            "use": "sig",
        }]
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn roles() -> Vec<RoleEntry> {
        let role = |r: &str, m: &[&str]| RoleEntry {
            domain: "media.sports".into(),
            role: r.into(),
            members: m.iter().map(|s| (*s).to_owned()).collect(),
        };
        vec![
            role("readers", &["media.sports.web", "finance.*"]),
            role("writers", &["media.sports.api"]),
            role("public", &["*"]),
        ]
    }

    #[test]
    fn members_exact_prefix_and_everyone() {
        let r = roles();
        let scope = role_scope("media.sports", None).unwrap();
        assert_eq!(
            granted_roles("t", &r, &scope, "media.sports.web").unwrap(),
            ["readers", "public"]
        );
        assert_eq!(
            granted_roles("t", &r, &scope, "finance.ledger").unwrap(),
            ["readers", "public"]
        );
        let writers = role_scope("media.sports", Some("writers")).unwrap();
        let err = granted_roles("getroletoken", &r, &writers, "media.sports.web").unwrap_err();
        assert_eq!(err.0, 403);
        assert_eq!(
            err.1,
            "getroletoken: principal media.sports.web is not included in the requested role(s) \
             in domain media.sports"
        );
        let unknown_role = role_scope("media.sports", Some("nope")).unwrap();
        assert_eq!(
            granted_roles("t", &r, &unknown_role, "x.y").unwrap_err().0,
            403
        );
        let unknown_domain = role_scope("weather", None).unwrap();
        let err = granted_roles("t", &r, &unknown_domain, "x.y").unwrap_err();
        assert_eq!((err.0, err.1.as_str()), (404, "No such domain: weather"));
    }

    #[test]
    fn the_jwks_holds_the_token_keys_point() {
        let key = PrivateKey::generate(athenz_core::crypto::KeyAlgorithm::P256).unwrap();
        let jwks = jwks(&key).unwrap();
        let k = &jwks["keys"][0];
        assert_eq!(k["kty"], "EC");
        assert_eq!(k["kid"], TOKEN_KEY_ID);
        let decoded = jsonwebtoken::DecodingKey::from_ec_components(
            k["x"].as_str().unwrap(),
            k["y"].as_str().unwrap(),
        )
        .unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let claims = AccessTokenClaims {
            ver: 1,
            iss: "https://zts.test/zts/v1".into(),
            aud: "media.sports".into(),
            sub: "a.b".into(),
            uid: "a.b".into(),
            client_id: "a.b".into(),
            iat: now,
            auth_time: now,
            exp: now + 60,
            jti: "1".into(),
            scp: vec!["readers".into()],
            cnf: Confirmation {
                x5t_s256: thumbprint(b"cert"),
            },
        };
        let token = sign_jwt(&key, "at+jwt", &claims).unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_audience(&["media.sports"]);
        let data =
            jsonwebtoken::decode::<AccessTokenClaims>(&token, &decoded, &validation).unwrap();
        assert_eq!(data.header.typ.as_deref(), Some("at+jwt"));
        assert_eq!(data.claims.scp, ["readers"]);
    }
}
