//! `POST /zts/v1/oauth2/token` with `grant_type=client_credentials`, as Athenz reads it
//! (`servers/zts/.../token/AccessTokenRequest.java`, `OAuthTokenScope.java`,
//! `AccessTokenScope.java`; `ZTSImpl.postAccessTokenRequest` and
//! `processAccessTokenStandardRequest`):
//!
//! - the body must be `application/x-www-form-urlencoded` (the resource's `@Consumes`; anything
//!   else is 415 from the JAX-RS layer) and not empty ("Empty request body");
//! - fields: `grant_type` and `scope` are lowercased; `expires_in` that is not a number counts as
//!   0, ZTS's default lifetime; unknown fields and components without `=` are skipped;
//! - scope items: `openid`, `<d>:service.<s>` (the ID token's audience), `<d>:domain` (every role
//!   the caller is in), `<d>:role.<r>`, `<d>:group.<g>`; anything else is skipped; one domain only
//!   ("Multiple domains in scope"), at least one ("No domains in scope"); `openid` needs a service
//!   ("No audience service name for openid scope");
//! - an ID token comes back for `openid` only when ZTS is configured with
//!   `athenz.zts.oauth_openid_scope=true` (default false); the request is accepted either way;
//! - the answer's `scope` is sent only for `<d>:domain` or when fewer roles were granted than
//!   asked (`generateScopeResponse`), followed by `openid` when the ID token is on.

use super::authz::DEFAULT_TOKEN_EXPIRY_SECS;
use super::authz::{self, Scope};
use super::refusal::{Refusal, parse_form};
use super::server::ZtsHandler;
use athenz_core::http::{Body, ConnInfo, json_response};
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use std::collections::BTreeSet;
use time::OffsetDateTime;

/// What an access token scope asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenScope {
    /// The domain and roles.
    pub scope: Scope,
    /// `openid` was asked for.
    pub openid: bool,
    /// The service of `<d>:service.<s>`: an ID token's audience.
    pub service: Option<String>,
    /// `<d>:domain` was asked for: the answer names the roles granted.
    pub whole_domain: bool,
}

/// Parses a (lowercased) scope as `OAuthTokenScope` and `AccessTokenScope` do.
pub fn parse_scope(scope: &str) -> Result<TokenScope, Refusal> {
    let mut domain: Option<String> = None;
    let mut add_domain = |d: &str| -> Result<(), Refusal> {
        if d.is_empty() {
            return Err(Refusal::bad_request("empty domain name"));
        }
        match &domain {
            Some(seen) if seen != d => Err(Refusal::bad_request("Multiple domains in scope")),
            _ => {
                domain = Some(d.to_owned());
                Ok(())
            }
        }
    };
    let (mut openid, mut whole_domain) = (false, false);
    let mut service: Option<String> = None;
    let mut roles = BTreeSet::new();
    for item in scope.split(' ') {
        if item.eq_ignore_ascii_case("openid") {
            openid = true;
        } else if item.eq_ignore_ascii_case("groups") || item.eq_ignore_ascii_case("roles") {
            // group and role claims of an ID token: not served here, and not an error
        } else if let Some((d, s)) = item.split_once(":service.") {
            add_domain(d)?;
            if service.as_deref().is_some_and(|seen| seen != s) {
                return Err(Refusal::bad_request("Multiple services in scope"));
            }
            service = Some(s.to_owned());
        } else if let Some(d) = item.strip_suffix(":domain") {
            add_domain(d)?;
            whole_domain = true;
        } else if let Some((d, r)) = item.split_once(":role.") {
            add_domain(d)?;
            roles.insert(r.to_owned());
        } else if let Some((d, _group)) = item.split_once(":group.") {
            add_domain(d)?;
        }
        // anything else: "Skipping unknown scope"
    }
    let domain = domain.ok_or_else(|| Refusal::bad_request("No domains in scope"))?;
    if openid && service.is_none() {
        return Err(Refusal::bad_request(
            "No audience service name for openid scope",
        ));
    }
    athenz_core::names::validate_domain("domain", &domain)
        .map_err(|e| Refusal::bad_request(format!("Invalid domain name {domain:?}: {e}")))?;
    for role in &roles {
        athenz_core::names::validate_role("role", role)
            .map_err(|e| Refusal::bad_request(format!("Invalid role name {role:?}: {e}")))?;
    }
    Ok(TokenScope {
        scope: Scope {
            domain,
            roles: (!whole_domain).then_some(roles),
        },
        openid,
        service,
        whole_domain,
    })
}

/// The claims of an ID token (Athenz `IdToken`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IdTokenClaims {
    /// Always 1.
    pub ver: u32,
    /// `<domain>.<service>` of the scope.
    pub aud: String,
    /// The principal.
    pub sub: String,
    /// The issuer.
    pub iss: String,
    /// Issued at.
    pub iat: i64,
    /// Authenticated at.
    pub auth_time: i64,
    /// Expiry.
    pub exp: i64,
}

impl ZtsHandler {
    /// `POST /zts/v1/oauth2/token`: client credentials over mutual TLS; an ES256 `at+jwt` for the
    /// roles of the scope the caller is in, bound to its certificate (`cnf`); an ID token too for
    /// `openid` when the dev ZTS is configured as ZTS with `oauth_openid_scope`.
    pub(super) fn access_token(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
    ) -> Result<Response<Body>, Refusal> {
        // ZTS's caller name: its ResourceContext's api name, lower case
        const CALLER: &str = "postaccesstokenrequest";
        let form_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        if !form_type {
            return Err(Refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "HTTP 415 Unsupported Media Type".into(),
            ));
        }
        let (Some(principal), Some(cert)) = (&conn.principal, &conn.peer_certificate) else {
            return Err(Refusal::unauthorized("Unauthenticated request"));
        };
        if req.body().is_empty() {
            return Err(Refusal::bad_request("Empty request body"));
        }
        let form = parse_form(req.body())?;
        let field = |name: &str| {
            form.iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        match field("grant_type").map(str::to_ascii_lowercase).as_deref() {
            None | Some("") => {
                return Err(Refusal::bad_request(
                    "Invalid request: no grant type provided",
                ));
            }
            Some("client_credentials") => {}
            Some(other) => {
                return Err(Refusal::bad_request(format!(
                    "Invalid grant request: {other}"
                )));
            }
        }
        let scope_text = field("scope").unwrap_or_default().to_lowercase();
        if scope_text.is_empty() {
            return Err(Refusal::bad_request("Invalid request: no scope provided"));
        }
        let scope = parse_scope(&scope_text)?;
        let proxy_for = field("proxy_for_principal").map(str::to_lowercase);
        let roles = self.roles_for(CALLER, &scope.scope, principal, proxy_for.as_deref())?;
        // `ZTSUtils.parseInt(value, 0)`: not a number is 0, the default
        let requested = field("expires_in")
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0);
        let max = self.state.settings.max_token_expiry.whole_seconds();
        let expires_in = if requested > 0 {
            requested.min(max)
        } else {
            DEFAULT_TOKEN_EXPIRY_SECS.min(max)
        };
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost");
        let issuer = format!("https://{host}/zts/v1");
        let claims = authz::AccessTokenClaims {
            ver: 1,
            iss: issuer.clone(),
            aud: scope.scope.domain.clone(),
            sub: principal.clone(),
            uid: principal.clone(),
            client_id: principal.clone(),
            iat: now,
            auth_time: now,
            exp: now + expires_in,
            jti: athenz_core::random::hex_name::<16>(),
            scp: roles.clone(),
            cnf: authz::Confirmation {
                x5t_s256: authz::thumbprint(cert),
            },
        };
        let token = authz::sign_jwt(&self.state.token_key, "at+jwt", &claims)
            .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, e))?;
        let openid = scope.openid && self.state.settings.openid_scope;
        let id_token = match (&scope.service, openid) {
            (Some(service), true) => Some(
                authz::sign_jwt(
                    &self.state.token_key,
                    "JWT",
                    &IdTokenClaims {
                        ver: 1,
                        aud: format!("{}.{service}", scope.scope.domain),
                        sub: principal.clone(),
                        iss: issuer,
                        iat: now,
                        auth_time: now,
                        exp: now + expires_in,
                    },
                )
                .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, e))?,
            ),
            _ => None,
        };
        let asked = scope.scope.roles.as_ref().map_or(0, BTreeSet::len);
        let mut answer = serde_json::json!({
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": expires_in,
        });
        if scope.whole_domain || asked != roles.len() {
            let mut items: Vec<String> = roles
                .iter()
                .map(|r| format!("{}:role.{r}", scope.scope.domain))
                .collect();
            if openid {
                items.push("openid".into());
            }
            answer["scope"] = items.join(" ").into();
        }
        if let Some(id_token) = id_token {
            answer["id_token"] = id_token.into();
        }
        Ok(json_response(StatusCode::OK, &answer))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn scopes_parse_as_athenz_reads_them() {
        let s = parse_scope("media.sports:role.readers media.sports:role.writers").unwrap();
        assert_eq!(
            s.scope.roles,
            Some(["readers".to_owned(), "writers".to_owned()].into())
        );
        assert!(!s.whole_domain);
        let d = parse_scope("media.sports:domain").unwrap();
        assert_eq!(d.scope.roles, None);
        assert!(d.whole_domain);
        // k8s-athenz-sia's form: the roles, openid and the service
        let sia = parse_scope("media.sports:role.readers openid media.sports:service.web").unwrap();
        assert!(sia.openid);
        assert_eq!(sia.service.as_deref(), Some("web"));
        assert_eq!(sia.scope.roles, Some(["readers".to_owned()].into()));
        // unknown items and groups are skipped, not refused
        let skipped = parse_scope("media.sports:domain something media.sports:group.g").unwrap();
        assert_eq!(skipped.scope.domain, "media.sports");
        for (bad, why) in [
            ("", "No domains in scope"),
            ("media.sports", "No domains in scope"),
            ("openid", "No domains in scope"),
            ("a:domain b:domain", "Multiple domains in scope"),
            (":domain", "empty domain name"),
            ("openid media.sports:domain", "No audience service name"),
            (
                "a:service.x a:service.y a:domain",
                "Multiple services in scope",
            ),
            ("media.sports:role.a;b", "Invalid role name"),
            ("-bad:domain", "Invalid domain name"),
        ] {
            let Refusal(status, message) = parse_scope(bad).unwrap_err();
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(message.contains(why), "{bad}: {message}");
        }
    }

    #[test]
    fn forms_decode_percent_and_plus_and_skip_components_without_a_value() {
        let form =
            parse_form(b"grant_type=client_credentials&scope=a%3Adomain+b&junk&expires_in=60")
                .unwrap();
        assert_eq!(form[1], ("scope".to_owned(), "a:domain b".to_owned()));
        assert_eq!(form.len(), 3);
        assert!(parse_form(&[0xff, b'=', b'1']).is_err());
        assert!(
            parse_form(b"scope=%ff&grant_type=x").unwrap()
                == [("grant_type".to_owned(), "x".to_owned())]
        );
    }
}
