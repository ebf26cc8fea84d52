//! The dev ZTS's routes (docs/design.md §4.5, §4.11), with the checks, status codes and message
//! texts of Athenz ZTS (`servers/zts/.../ZTSImpl.java`); the rules of each route that has many live
//! in their own module, named for the Athenz class they follow:
//!
//! | route | auth | outcome | rules |
//! |---|---|---|---|
//! | `POST /zts/v1/instance` | none | 201 + `Location` + InstanceIdentity | here (`postInstanceRegisterInformation`), [`super::x509_cert_request`], [`super::instance_provider_client`] |
//! | `POST /zts/v1/instance/{provider}/{domain}/{service}/{instanceId}` | client cert | 200 InstanceIdentity | [`super::instance_refresh`] |
//! | `POST /zts/v1/instance/{domain}/{service}/refresh` | ntoken in `Athenz-Principal-Auth` | 200 Identity | [`super::instance_refresh_request`] |
//! | `POST /zts/v1/oauth2/token` | client cert | 200 access token | [`super::access_token_request`] |
//! | `GET /zts/v1/domain/{domain}/token` | client cert | 200 role token | here (`getRoleToken`) |
//! | `POST /zts/v1/rolecert` | client cert | 200 role certificate | [`super::x509_role_cert_request`] |
//! | `GET /zts/v1/oauth2/keys` | none | 200 | |
//! | `GET /zts/v1/status` | a client certificate (else 401 `Invalid credentials`) | 200 | |
//!
//! Errors are always `{"code","message"}` with Athenz's message text (no caller prefix, as
//! `ZTSImpl.error` builds them). `harness/testbed/data/zts-contract.tsv` lists every case with its Athenz
//! source, and `harness/testbed/tests/zts_contract.rs` holds the dev ZTS to it.

use super::authz;
use super::instance_provider_client::{ProviderClients, ProviderRefusal, ProviderRoute};
use super::instances::{InstanceKey, InstanceStore};
use super::registry::{ProviderEntry, Registry};
use super::x509_cert_request::check_instance_csr;
use crate::pki::{IssuedCert, LeafSpec};
use athenz_core::crypto::{CsrInfo, PrivateKey};
use athenz_core::http::{Body, ConnInfo, Handler, Peer, error_response, json_response};
use athenz_core::names;
use athenz_core::ntoken::NTokenBuilder;
use athenz_core::secret::Secret;
use athenz_core::zts::{InstanceConfirmation, InstanceIdentity, InstanceRegisterInformation, attr};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use std::sync::{Arc, RwLock};
use time::{Duration, OffsetDateTime};

use super::refusal::{Outcome, Refusal, parse_csr, parse_form, parse_json};

/// Settings of the routes.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Longest certificate issued, minutes.
    pub max_cert_lifetime_minutes: u32,
    /// How far certificates are backdated.
    pub backdate: Duration,
    /// Lifetime of issued ntokens.
    pub token_lifetime: Duration,
    /// DNS suffixes allowed in key-based (control-plane) CSRs, and of role-certificate emails.
    pub service_dns_suffixes: Vec<String>,
    /// Clock skew allowed for ntokens.
    pub ntoken_skew: Duration,
    /// Longest access token issued.
    pub max_token_expiry: Duration,
    /// An ID token for the `openid` scope (Athenz `athenz.zts.oauth_openid_scope`).
    pub openid_scope: bool,
    /// Principals that may ask on behalf of another (Athenz `athenz.zts.authorized_proxy_users`).
    pub authorized_proxy_users: Vec<String>,
    /// A key-based refresh's IP SANs must be the caller's (`athenz.zts.cert_request_verify_ip`).
    pub cert_request_verify_ip: bool,
}

/// Everything the routes share.
pub struct ZtsState {
    /// ZTS's own principal.
    pub principal: String,
    /// Services and providers.
    pub registry: RwLock<Registry>,
    /// Instance records.
    pub instances: InstanceStore,
    /// Signs instance and service certificates, and the bundle returned with them (the first
    /// CA, or the next once rotated).
    pub cas: super::ca_rotation::CaGenerations,
    /// Signs the ntokens handed to instances.
    pub token_key: PrivateKey,
    /// Calls providers.
    pub providers: ProviderClients,
    /// Settings.
    pub settings: RouteSettings,
    /// Roles and their members.
    pub roles: Vec<authz::RoleEntry>,
    /// A status every instance register and refresh is answered with (0: none): a fault a
    /// chaos run injects.
    pub instance_fault: std::sync::atomic::AtomicU16,
    /// Every instance register's arrival and end, and a delay a test may put before each.
    pub registers: super::register_log::RegisterLog,
}

/// Where a refresh is addressed: the path's parts.
pub struct RefreshPath<'a> {
    /// `{provider}`.
    pub provider: &'a str,
    /// `{domain}`.
    pub domain: &'a str,
    /// `{service}`.
    pub service: &'a str,
    /// `{instanceId}`.
    pub instance_id: &'a str,
}

/// The route handler.
pub struct ZtsHandler {
    pub(super) state: Arc<ZtsState>,
}

impl ZtsHandler {
    /// A handler over `state`.
    pub fn new(state: Arc<ZtsState>) -> Self {
        Self { state }
    }
}

impl Handler for ZtsHandler {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let Some(rest) = path.strip_prefix("/zts/v1/") else {
            return error_response(StatusCode::NOT_FOUND, "no such route");
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let _register = if req.method() == Method::POST && segments.as_slice() == ["instance"] {
            let (guard, delay) = self.state.registers.enter();
            tokio::time::sleep(delay).await;
            Some(guard)
        } else {
            None
        };
        let fault = self
            .state
            .instance_fault
            .load(std::sync::atomic::Ordering::SeqCst);
        if fault != 0 && req.method() == Method::POST && segments.first() == Some(&"instance") {
            let status = StatusCode::from_u16(fault).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            tracing::info!(%path, %status, "dev ZTS answering with an injected fault");
            return error_response(status, format!("dev ZTS: injected fault ({status})"));
        }
        let outcome = match (req.method(), segments.as_slice()) {
            // an authenticated resource, like every ZTS route but registration and the keys
            // (ZTSResources.getStatus): a caller without credentials gets 401
            (&Method::GET, ["status"]) => match conn.principal {
                Some(_) => Ok(json_response(
                    StatusCode::OK,
                    &serde_json::json!({"code": 200, "message": "OK"}),
                )),
                None => Err(Refusal::unauthorized(super::refusal::INVALID_CREDENTIALS)),
            },
            (&Method::POST, ["instance"]) => self.register(&req, &conn).await,
            (&Method::POST, ["instance", domain, service, "refresh"]) => {
                self.refresh_with_key(&req, &conn, domain, service)
            }
            (&Method::POST, ["instance", provider, domain, service, instance_id]) => {
                let path = RefreshPath {
                    provider,
                    domain,
                    service,
                    instance_id,
                };
                self.refresh_instance(&req, &conn, path).await
            }
            (&Method::POST, ["oauth2", "token"]) => self.access_token(&req, &conn),
            (&Method::GET, ["domain", domain, "token"]) => self.role_token(&req, &conn, domain),
            (&Method::POST, ["rolecert"]) => self.role_cert(&req, &conn),
            (&Method::GET, ["oauth2", "keys"]) => authz::jwks(&self.state.token_key)
                .map(|keys| json_response(StatusCode::OK, &keys))
                .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, e)),
            (
                _,
                ["status"]
                | ["instance", ..]
                | ["oauth2", ..]
                | ["domain", _, "token"]
                | ["rolecert"],
            ) => Err(Refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{} is not allowed here", req.method()),
            )),
            _ => Err(Refusal::not_found("no such route")),
        };
        outcome.unwrap_or_else(|Refusal(status, message)| {
            tracing::info!(%path, %status, %message, "dev ZTS refused");
            if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
                // JAX-RS refuses before ZTS's code runs: the container's page, no ZTS error
                // object (real ZTS's body has no `message`; harness/testbed/data/zts-recorded.json)
                let mut page = Response::new(Body::new(Bytes::from(message)));
                *page.status_mut() = status;
                page.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("text/plain"),
                );
                return page;
            }
            error_response(status, message)
        })
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        let path = req.uri.path();
        match path.matches('/').count() {
            _ if path == "/zts/v1/status" => "status",
            _ if path == "/zts/v1/oauth2/token" => "oauth2_token",
            _ if path == "/zts/v1/oauth2/keys" => "oauth2_keys",
            _ if path.starts_with("/zts/v1/domain/") => "role_token",
            _ if path == "/zts/v1/rolecert" => "role_cert",
            3 => "register",
            6 if path.ends_with("/refresh") => "key_refresh",
            7 => "instance_refresh",
            _ => "other",
        }
    }
}

/// The client's IP address as text (empty for a Unix socket peer).
pub(super) fn client_ip(conn: &ConnInfo) -> String {
    match conn.peer {
        Peer::Tcp(addr) => addr.ip().to_string(),
        Peer::Unix { .. } => String::new(),
    }
}

/// Who a principal may act for, checked as ZTS checks a proxy request.
fn may_proxy(settings: &RouteSettings, principal: &str) -> bool {
    settings
        .authorized_proxy_users
        .iter()
        .any(|p| p.eq_ignore_ascii_case(principal))
}

impl ZtsHandler {
    /// The roles of `scope` the caller is in, and, for a proxy request, that the principal it
    /// acts for is in too (`ZTSImpl.processAccessTokenStandardRequest`, `getRoleToken`,
    /// `processRoleCertificateRequest`): 403 for a caller not configured as a proxy user, 404 for
    /// an unknown domain, 403 with `tokenErrorMessage` when none is granted.
    pub(super) fn roles_for(
        &self,
        caller: &str,
        scope: &authz::Scope,
        principal: &str,
        proxy_for: Option<&str>,
    ) -> Result<Vec<String>, Refusal> {
        if proxy_for.is_some() && !may_proxy(&self.state.settings, principal) {
            let what = match caller {
                "postrolecertificaterequestext" => "role certificate",
                "getroletoken" => "role token",
                _ => "access token",
            };
            return Err(Refusal::forbidden(format!(
                "Principal: {principal} not authorized for proxy {what} request"
            )));
        }
        let mut roles = authz::granted_roles(caller, &self.state.roles, scope, principal)?;
        if let Some(proxy) = proxy_for {
            let theirs = authz::granted_roles(caller, &self.state.roles, scope, proxy)?;
            roles.retain(|r| theirs.contains(r));
            if roles.is_empty() {
                return Err(authz::not_included(caller, scope, proxy).into());
            }
        }
        Ok(roles)
    }

    /// The provider, if it may launch `domain.service` (`InstanceCertManager.authorizeLaunch`):
    /// 403 with Athenz's message otherwise, an unknown provider included.
    pub(super) fn launching_provider(
        &self,
        name: &str,
        domain: &str,
        service: &str,
    ) -> Result<ProviderEntry, Refusal> {
        let registry = self
            .state
            .registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let provider = registry.provider(name).ok_or_else(|| {
            Refusal::forbidden(format!(
                "provider '{name}' not authorized to launch instances in Athenz"
            ))
        })?;
        if !provider.may_launch(domain, service) {
            return Err(Refusal::forbidden(format!(
                "provider '{name}' not authorized to launch {domain}.{service} instances"
            )));
        }
        Ok(provider.clone())
    }

    /// The attributes ZTS sends a provider about a CSR (docs/design.md §4.4).
    pub(super) fn confirmation_attributes(
        &self,
        csr: &CsrInfo,
        instance_id: &str,
        conn: &ConnInfo,
    ) -> std::collections::BTreeMap<String, String> {
        let join = |items: Vec<String>| items.join(",");
        let mut attributes = std::collections::BTreeMap::new();
        attributes.insert(attr::INSTANCE_ID.to_owned(), instance_id.to_owned());
        attributes.insert(attr::CLIENT_IP.to_owned(), client_ip(conn));
        attributes.insert(attr::SAN_DNS.to_owned(), join(csr.dns_names.clone()));
        attributes.insert(
            attr::SAN_IP.to_owned(),
            join(csr.ip_addresses.iter().map(ToString::to_string).collect()),
        );
        attributes.insert(attr::SAN_URI.to_owned(), join(csr.uris.clone()));
        attributes.retain(|_, v| !v.is_empty());
        attributes
    }

    /// Certificate lifetime: the configured maximum, lowered by the request and by the provider.
    pub(super) fn lifetime(
        &self,
        requested: Option<i32>,
        confirmed: &InstanceConfirmation,
    ) -> Duration {
        let mut minutes = i64::from(self.state.settings.max_cert_lifetime_minutes);
        if let Some(r) = requested.filter(|r| *r > 0) {
            minutes = minutes.min(i64::from(r));
        }
        if let Some(p) = confirmed
            .attributes
            .get(attr::CERT_EXPIRY_TIME)
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|p| *p > 0)
        {
            minutes = minutes.min(p);
        }
        Duration::minutes(minutes)
    }

    pub(super) fn issue(&self, csr: &CsrInfo, lifetime: Duration) -> Result<IssuedCert, Refusal> {
        self.state
            .cas
            .signer()
            .issue_for_key(
                &LeafSpec {
                    backdate: self.state.settings.backdate,
                    ..LeafSpec::from_csr(csr, lifetime)
                },
                &csr.public_key_der,
            )
            .map_err(|e| {
                Refusal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("unable to generate identity: {e}"),
                )
            })
    }

    pub(super) fn service_token(&self, domain: &str, service: &str) -> Result<Secret, Refusal> {
        NTokenBuilder {
            domain: domain.to_owned(),
            service: service.to_owned(),
            host: None,
            key_version: "0".into(),
            key_service: Some("zts".into()),
            lifetime: self.state.settings.token_lifetime,
        }
        .sign(&self.state.token_key, OffsetDateTime::now_utc())
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
    }

    /// Asks the provider (`ZTSImpl.validateConfirmationData` for launches; the same mapping in
    /// `processProviderX509RefreshRequest` for refreshes): its 504, or no answer, is 504; any
    /// other refusal is 403; both "unable to verify attestation data: ...".
    pub(super) async fn confirm(
        &self,
        provider: &ProviderEntry,
        route: ProviderRoute,
        confirmation: &InstanceConfirmation,
        conn: &ConnInfo,
    ) -> Result<InstanceConfirmation, Refusal> {
        self.state
            .providers
            .confirm(provider, route, confirmation)
            .await
            .map_err(|refusal: ProviderRefusal| {
                let status = if refusal.is_gateway_timeout() {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::FORBIDDEN
                };
                // getExceptionMsg: the cause, then who asked
                Refusal(
                    status,
                    format!(
                        "unable to verify attestation data: {} client: null clientIP: {} \
                         clientHost: null",
                        refusal.message,
                        client_ip(conn)
                    ),
                )
            })
    }

    /// `POST /zts/v1/instance` (`ZTSImpl.postInstanceRegisterInformation`,
    /// `postInstanceX509CertificateRegister`).
    async fn register(&self, req: &Request<Bytes>, conn: &ConnInfo) -> Outcome {
        let info: InstanceRegisterInformation = parse_json(req, "InstanceRegisterInformation")?;
        names::validate_provider("provider", &info.provider)
            .and_then(|()| names::validate_domain("domain", &info.domain))
            .and_then(|()| names::validate_service("service", &info.service))
            .map_err(|e| Refusal::bad_request(e.to_string()))?;
        let provider = self.launching_provider(&info.provider, &info.domain, &info.service)?;
        if info.csr.is_empty() {
            // Athenz issues a JWT SVID for a register without a CSR; not served here
            return Err(Refusal::bad_request(
                "Audience is required for jwt SVID requests",
            ));
        }
        if info.attestation_data.is_empty() {
            return Err(Refusal::bad_request(
                "attestation data is required for x509 certificate request",
            ));
        }
        let csr = parse_csr(&info.csr)?;
        let instance_id =
            check_instance_csr(&csr, &info.domain, &info.service, &provider.dns_suffixes)
                .map_err(|why| Refusal::bad_request(format!("CSR validation failed - {why}")))?;

        let confirmation = InstanceConfirmation {
            provider: info.provider.clone(),
            domain: info.domain.clone(),
            service: info.service.clone(),
            attestation_data: info.attestation_data.clone(),
            attributes: self.confirmation_attributes(&csr, &instance_id, conn),
        };
        let confirmed = self
            .confirm(&provider, ProviderRoute::Instance, &confirmation, conn)
            .await?;
        let issued = self.issue(&csr, self.lifetime(info.expiry_time, &confirmed))?;
        let key = InstanceKey {
            provider: info.provider.clone(),
            domain: info.domain.clone(),
            service: info.service.clone(),
            instance_id: instance_id.clone(),
        };
        self.state.instances.register(key, &issued.serial_hex);
        // what a bench counts a node's registrations by (cluster flood)
        tracing::info!(provider = %info.provider, domain = %info.domain, service = %info.service, instance = %instance_id, "instance registered");

        let identity = InstanceIdentity {
            provider: info.provider.clone(),
            name: names::principal(&info.domain, &info.service),
            instance_id: instance_id.clone(),
            x509_certificate: Some(issued.cert_pem),
            x509_certificate_signer: Some(self.state.cas.bundle().to_owned()),
            service_token: match info.token {
                Some(true) => Some(self.service_token(&info.domain, &info.service)?),
                _ => None,
            },
            attributes: None,
        };
        let mut resp = json_response(StatusCode::CREATED, &identity);
        let location = format!(
            "/zts/v1/instance/{}/{}/{}/{}",
            info.provider, info.domain, info.service, instance_id
        );
        if let Ok(value) = header::HeaderValue::from_str(&location) {
            resp.headers_mut().insert(header::LOCATION, value);
        }
        Ok(resp)
    }
}

impl ZtsHandler {
    /// `GET /zts/v1/domain/{domain}/token?role=<r,…>&minExpiryTime=&maxExpiryTime=`: a role token
    /// (`Z1`) for the named roles of `domain` the caller (its client certificate) is in, or all of
    /// them without `role`; `{token, expiryTime}`.
    pub(super) fn role_token(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
        domain: &str,
    ) -> Result<Response<Body>, Refusal> {
        // ZTS's caller name: its ResourceContext's api name, lower case
        const CALLER: &str = "getroletoken";
        let Some(principal) = &conn.principal else {
            return Err(Refusal::unauthorized(
                "a client certificate is required for a role token",
            ));
        };
        let query = parse_form(req.uri().query().unwrap_or_default().as_bytes())?;
        let field = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let scope = authz::role_scope(domain, field("role")).map_err(Refusal::from)?;
        // Integer query parameters: JAX-RS answers 404 when one is not a number; ZTS ignores a
        // value that is not positive (`determineTokenTimeout`)
        let seconds = |name: &str| -> Result<Option<i64>, Refusal> {
            match field(name) {
                None | Some("") => Ok(None),
                Some(text) => text
                    .parse::<i32>()
                    .map(|n| (n > 0).then_some(i64::from(n)))
                    .map_err(|_| Refusal::not_found("HTTP 404 Not Found")),
            }
        };
        let max = self.state.settings.max_token_expiry.whole_seconds();
        let lifetime = seconds("maxExpiryTime")?
            .unwrap_or(super::authz::DEFAULT_TOKEN_EXPIRY_SECS)
            .max(seconds("minExpiryTime")?.unwrap_or(0))
            .min(max);
        let proxy_for = field("proxyForPrincipal")
            .filter(|p| !p.is_empty())
            .map(str::to_lowercase);
        let roles = self.roles_for(CALLER, &scope, principal, proxy_for.as_deref())?;
        let now = OffsetDateTime::now_utc();
        let token = athenz_core::role_token::sign(
            &self.state.token_key,
            authz::TOKEN_KEY_ID,
            &scope.domain,
            &roles,
            principal,
            now,
            Duration::seconds(lifetime),
        )
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({
                "token": token,
                "expiryTime": now.unix_timestamp() + lifetime,
            }),
        ))
    }
}
