//! The token server of the refresh sidecar: k8s-athenz-sia's REST API (`POST /accesstoken`,
//! `POST /roletoken`) and its header mode (`X-Athenz-Domain`, `X-Athenz-Role`), with the same
//! request and response JSON, served from the [`TokenCache`]. Where we differ from it on purpose
//! (status codes of errors, JSON error bodies) the compatibility table in docs/binaries/athenz-sia.md says so.

use super::cache::{CacheError, Kind, TokenCache, TokenKey};
use super::targets::{DomainRole, TokenTypes};
use super::zts::{FetchError, Token, unix_now};
use athenz_core::http::{Body, ConnInfo, Handler};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Request header naming the domain in header mode.
pub const DOMAIN_HEADER: &str = "X-Athenz-Domain";
/// Request header naming the role in header mode.
pub const ROLE_HEADER: &str = "X-Athenz-Role";

/// `POST /accesstoken` body (k8s-athenz-sia `AccessTokenRequestBody`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessTokenRequestBody {
    /// The domain.
    pub domain: String,
    /// Roles, comma-separated; absent or empty for the whole domain.
    #[serde(default)]
    pub role: Option<String>,
    /// On behalf of this principal.
    #[serde(default)]
    pub proxy_for_principal: Option<String>,
    /// Lifetime asked for, seconds.
    #[serde(default)]
    pub expiry: Option<i64>,
}

/// `POST /roletoken` body (k8s-athenz-sia `RoleTokenRequestBody`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleTokenRequestBody {
    /// The domain.
    pub domain: String,
    /// Roles, comma-separated; absent or empty for all the pod's roles in the domain.
    #[serde(default)]
    pub role: Option<String>,
    /// On behalf of this principal.
    #[serde(default)]
    pub proxy_for_principal: Option<String>,
    /// Least lifetime, seconds.
    #[serde(default)]
    pub min_expiry: Option<i64>,
    /// Most lifetime, seconds.
    #[serde(default)]
    pub max_expiry: Option<i64>,
}

/// `POST /accesstoken` answer (k8s-athenz-sia `AccessTokenResponse`).
#[derive(Debug, Serialize, Deserialize)]
pub struct AccessTokenResponseBody {
    /// The token.
    pub access_token: String,
    /// `Bearer`.
    pub token_type: String,
    /// Seconds of life left.
    pub expires_in: i64,
    /// The roles granted, when ZTS said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// `POST /roletoken` answer (k8s-athenz-sia `RoleTokenResponse`).
#[derive(Debug, Serialize, Deserialize)]
pub struct RoleTokenResponseBody {
    /// The token.
    pub token: String,
    /// Expiry, Unix seconds.
    #[serde(rename = "expiryTime")]
    pub expiry_time: i64,
}

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Serve `POST /accesstoken` and `POST /roletoken`.
    pub rest_api: bool,
    /// Serve header mode.
    pub header_mode: bool,
    /// Which token kinds are served.
    pub types: TokenTypes,
    /// The configured targets (header mode serves only these, as k8s-athenz-sia does).
    pub targets: Vec<DomainRole>,
    /// Lifetime asked for when a request names none (`--token-expiry`), seconds; 0 for ZTS's.
    pub default_expiry: u64,
    /// Time allowed for one answer (`--token-server-timeout`).
    pub timeout: Duration,
    /// Header carrying the role token in header mode (`--role-auth-header`).
    pub role_auth_header: http::HeaderName,
}

/// The token server's request handler.
pub struct TokenServer {
    cache: Arc<TokenCache>,
    settings: ServerSettings,
}

/// A refusal: status and reason, answered as `{"error": reason}`.
struct Refusal(StatusCode, String);

impl From<CacheError> for Refusal {
    fn from(e: CacheError) -> Self {
        let status = match &e {
            CacheError::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            CacheError::Fetch(FetchError::BadRequest(_)) => StatusCode::BAD_REQUEST,
            CacheError::Fetch(FetchError::Refused { status, .. }) => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            CacheError::Fetch(FetchError::Unavailable(_) | FetchError::NoIdentity) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        Self(status, e.to_string())
    }
}

fn bad_request(reason: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, reason.into())
}

fn error_json(status: StatusCode, reason: &str) -> Response<Body> {
    json(status, &serde_json::json!({ "error": reason }))
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    resp
}

/// A lifetime in seconds from a request: absent or 0 means the default.
fn seconds(field: &str, value: Option<i64>, default: u64) -> Result<Option<u64>, Refusal> {
    match value {
        None | Some(0) => Ok((default > 0).then_some(default)),
        Some(n) if n > 0 => Ok(Some(n as u64)),
        Some(n) => Err(bad_request(format!(
            "{field} must be a positive number of seconds, not {n}"
        ))),
    }
}

/// The roles of a comma list (blanks skipped).
fn roles(list: Option<&str>) -> Vec<String> {
    list.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
        .collect()
}

fn nonempty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

fn body<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Refusal> {
    serde_json::from_slice(bytes).map_err(|e| bad_request(format!("invalid request body: {e}")))
}

impl TokenServer {
    /// A server of `cache`.
    pub fn new(cache: Arc<TokenCache>, settings: ServerSettings) -> Self {
        Self { cache, settings }
    }

    /// The pinned key of a target, as the cache and the files know it.
    pub fn target_key(kind: Kind, target: &DomainRole, default_expiry: u64) -> TokenKey {
        let mut key = TokenKey::new(kind, &target.domain, [target.role.clone()]);
        let expiry = (default_expiry > 0).then_some(default_expiry);
        match kind {
            Kind::Access => key.max_expiry = expiry,
            Kind::Role => key.min_expiry = expiry,
        }
        key
    }

    async fn access_token(&self, bytes: &[u8]) -> Result<Response<Body>, Refusal> {
        let request: AccessTokenRequestBody = body(bytes)?;
        if request.domain.is_empty() {
            return Err(bad_request("domain is required"));
        }
        let mut key = TokenKey::new(
            Kind::Access,
            &request.domain,
            roles(request.role.as_deref()),
        );
        key.proxy_for_principal = nonempty(request.proxy_for_principal);
        key.max_expiry = seconds("expiry", request.expiry, self.settings.default_expiry)?;
        let token = self.cache.get(&key).await?;
        Ok(json(
            StatusCode::OK,
            &AccessTokenResponseBody {
                access_token: token.raw.expose().to_owned(),
                token_type: "Bearer".into(),
                expires_in: (token.expires_at - unix_now()).max(0),
                scope: token.scope.as_deref().map(str::to_owned),
            },
        ))
    }

    async fn role_token(&self, bytes: &[u8]) -> Result<Response<Body>, Refusal> {
        let request: RoleTokenRequestBody = body(bytes)?;
        if request.domain.is_empty() {
            return Err(bad_request("domain is required"));
        }
        let mut key = TokenKey::new(Kind::Role, &request.domain, roles(request.role.as_deref()));
        key.proxy_for_principal = nonempty(request.proxy_for_principal);
        key.min_expiry = seconds(
            "min_expiry",
            request.min_expiry,
            self.settings.default_expiry,
        )?;
        key.max_expiry = seconds("max_expiry", request.max_expiry, 0)?;
        let token = self.cache.get(&key).await?;
        Ok(json(
            StatusCode::OK,
            &RoleTokenResponseBody {
                token: token.raw.expose().to_owned(),
                expiry_time: token.expires_at,
            },
        ))
    }

    /// Header mode: the tokens of a configured target, in response headers and as JSON.
    async fn header_mode(&self, req: &Request<Bytes>) -> Result<Response<Body>, Refusal> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (domain, role) = (header(DOMAIN_HEADER), header(ROLE_HEADER));
        if domain.is_empty() || role.is_empty() {
            return Err(bad_request(format!(
                "http headers not set: {DOMAIN_HEADER}[{domain}] {ROLE_HEADER}[{role}]."
            )));
        }
        let target = DomainRole {
            domain: domain.clone(),
            role: role.clone(),
        };
        if !self.settings.targets.contains(&target) {
            return Err(bad_request(format!(
                "domain[{domain}] role[{role}] was not found in cache."
            )));
        }
        let expiry = self.settings.default_expiry;
        let mut fields = serde_json::Map::new();
        let mut resp_headers = Vec::new();
        if self.settings.types.access {
            let token = self
                .cache
                .get(&Self::target_key(Kind::Access, &target, expiry))
                .await?;
            resp_headers.push((
                header::AUTHORIZATION,
                format!("bearer {}", token.raw.expose()),
            ));
            fields.insert("accesstoken".into(), token.raw.expose().into());
        }
        if self.settings.types.role {
            let token: Token = self
                .cache
                .get(&Self::target_key(Kind::Role, &target, expiry))
                .await?;
            resp_headers.push((
                self.settings.role_auth_header.clone(),
                token.raw.expose().to_owned(),
            ));
            fields.insert("roletoken".into(), token.raw.expose().into());
        }
        let mut resp = json(StatusCode::OK, &fields);
        for (name, value) in resp_headers {
            let value = header::HeaderValue::from_str(&value).map_err(|_| {
                Refusal(
                    StatusCode::BAD_GATEWAY,
                    "ZTS answered a token that cannot be a header".into(),
                )
            })?;
            resp.headers_mut().insert(name, value);
        }
        Ok(resp)
    }

    async fn dispatch(&self, req: &Request<Bytes>) -> Result<Response<Body>, Refusal> {
        let s = &self.settings;
        if s.rest_api && req.method() == Method::POST {
            match req.uri().path() {
                "/accesstoken" if s.types.access => return self.access_token(req.body()).await,
                "/roletoken" if s.types.role => return self.role_token(req.body()).await,
                _ => {}
            }
        }
        if s.header_mode {
            return self.header_mode(req).await;
        }
        Err(Refusal(StatusCode::NOT_FOUND, "404 page not found".into()))
    }
}

impl Handler for TokenServer {
    async fn handle(&self, req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        let timeout = self.settings.timeout;
        match tokio::time::timeout(timeout, self.dispatch(&req)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(Refusal(status, reason))) => error_json(status, &reason),
            Err(_) => error_json(
                StatusCode::GATEWAY_TIMEOUT,
                &format!(
                    "no token within {timeout:?} (--token-server-timeout): ZTS has not answered yet"
                ),
            ),
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        match req.uri.path() {
            "/accesstoken" => "accesstoken",
            "/roletoken" => "roletoken",
            _ => "header",
        }
    }
}
