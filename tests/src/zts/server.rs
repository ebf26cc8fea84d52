//! The dev ZTS's routes (DESIGN.md 4.5), with the checks and status codes of the real server:
//!
//! | route | auth | outcome |
//! |---|---|---|
//! | `POST /zts/v1/instance` | none | 201 + `Location` + InstanceIdentity |
//! | `POST /zts/v1/instance/{provider}/{domain}/{service}/{instanceId}` | client cert = `domain.service` | 200 InstanceIdentity |
//! | `POST /zts/v1/instance/{domain}/{service}/refresh` | ntoken in `Athenz-Principal-Auth` | 200 Identity |
//! | `GET /zts/v1/status` | none | 200 |
//!
//! Errors are always `{"code","message"}`: 400 for a malformed request or CSR, 401 for missing or
//! bad credentials, 403 for refusals (launch not authorised, provider denied, principal or
//! instance mismatch, revoked), 404 for unknown routes and instances, 504 when the provider does
//! not answer.

use super::csr_rules::{check_instance_csr, check_service_csr};
use super::instances::{InstanceKey, InstanceStore, RefreshRefusal};
use super::provider_client::{ProviderClients, ProviderOutcome, ProviderRoute};
use super::registry::{ProviderEntry, Registry};
use crate::pki::{CertAuthority, IssuedCert, LeafSpec};
use athenz_core::crypto::{CertInfo, CsrInfo, PrivateKey};
use athenz_core::http::{Body, ConnInfo, Handler, Peer, error_response, json_response};
use athenz_core::names;
use athenz_core::ntoken::{NToken, NTokenBuilder, VerifyLimits};
use athenz_core::secret::Secret;
use athenz_core::zts::{
    Identity, InstanceConfirmation, InstanceIdentity, InstanceRefreshInformation,
    InstanceRefreshRequest, InstanceRegisterInformation, PRINCIPAL_AUTH_HEADER, attr,
};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use std::sync::{Arc, RwLock};
use time::{Duration, OffsetDateTime};

/// Settings of the routes.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Longest certificate issued, minutes.
    pub max_cert_lifetime_minutes: u32,
    /// How far certificates are backdated.
    pub backdate: Duration,
    /// Lifetime of issued ntokens.
    pub token_lifetime: Duration,
    /// DNS suffixes allowed in key-based (control-plane) CSRs.
    pub service_dns_suffixes: Vec<String>,
    /// Clock skew allowed for ntokens.
    pub ntoken_skew: Duration,
    /// Longest access token issued.
    pub max_token_expiry: Duration,
}

/// Everything the routes share.
pub struct ZtsState {
    /// ZTS's own principal.
    pub principal: String,
    /// Services and providers.
    pub registry: RwLock<Registry>,
    /// Instance records.
    pub instances: InstanceStore,
    /// Signs instance and service certificates.
    pub signer: CertAuthority,
    /// The CA bundle returned with certificates (intermediates then root).
    pub ca_bundle: String,
    /// Signs the ntokens handed to instances.
    pub token_key: PrivateKey,
    /// Calls providers.
    pub providers: ProviderClients,
    /// Settings.
    pub settings: RouteSettings,
    /// Roles and their members.
    pub roles: Vec<super::authz::RoleEntry>,
    /// A status every instance register and refresh is answered with (0: none): a fault a
    /// chaos run injects.
    pub instance_fault: std::sync::atomic::AtomicU16,
}

/// A refusal: status and message.
struct Refusal(StatusCode, String);

/// An authorization refusal keeps the status and message `authz` chose.
impl From<super::authz::AuthzRefusal> for Refusal {
    fn from(super::authz::AuthzRefusal(code, message): super::authz::AuthzRefusal) -> Self {
        Self(
            StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
            message,
        )
    }
}

impl Refusal {
    fn bad_request(msg: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, msg.into())
    }
    fn unauthorized(msg: impl Into<String>) -> Self {
        Self(StatusCode::UNAUTHORIZED, msg.into())
    }
    fn forbidden(msg: impl Into<String>) -> Self {
        Self(StatusCode::FORBIDDEN, msg.into())
    }
    fn not_found(msg: impl Into<String>) -> Self {
        Self(StatusCode::NOT_FOUND, msg.into())
    }
}

type Outcome = Result<Response<Body>, Refusal>;

/// The route handler.
pub struct ZtsHandler {
    state: Arc<ZtsState>,
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
            (&Method::GET, ["status"]) => Ok(json_response(
                StatusCode::OK,
                &serde_json::json!({"code": 200, "message": "OK"}),
            )),
            (&Method::POST, ["instance"]) => self.register(&req, &conn).await,
            (&Method::POST, ["instance", domain, service, "refresh"]) => {
                self.refresh_with_key(&req, &conn, domain, service)
            }
            (&Method::POST, ["instance", provider, domain, service, instance_id]) => {
                self.refresh_instance(&req, &conn, provider, domain, service, instance_id)
                    .await
            }
            (&Method::POST, ["oauth2", "token"]) => self.access_token(&req, &conn),
            (&Method::GET, ["domain", domain, "token"]) => self.role_token(&req, &conn, domain),
            (&Method::POST, ["rolecert"]) => self.role_cert(&req, &conn),
            (&Method::GET, ["oauth2", "keys"]) => super::authz::jwks(&self.state.token_key)
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

impl ZtsHandler {
    /// `POST /zts/v1/oauth2/token`: client credentials over mutual TLS; an ES256 `at+jwt` for
    /// the roles of the scope the caller is in, bound to its certificate (`cnf`).
    fn access_token(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
    ) -> Result<Response<Body>, Refusal> {
        use super::authz;
        let (Some(principal), Some(cert)) = (&conn.principal, &conn.peer_certificate) else {
            return Err(Refusal::unauthorized(
                "a client certificate is required for an access token",
            ));
        };
        let form_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        if !form_type {
            return Err(Refusal::bad_request(
                "the request must be application/x-www-form-urlencoded",
            ));
        }
        let form = authz::parse_form(req.body()).map_err(Refusal::from)?;
        let field = |name: &str| {
            form.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        if field("grant_type") != Some("client_credentials") {
            return Err(Refusal::bad_request(
                "grant_type must be client_credentials",
            ));
        }
        refuse_proxy(principal, field("proxy_for_principal"))?;
        let scope =
            authz::parse_scope(field("scope").unwrap_or_default()).map_err(Refusal::from)?;
        let max = self.state.settings.max_token_expiry.whole_seconds();
        let expires_in = match field("expires_in") {
            None | Some("") => 3600.min(max),
            Some(text) => match text.parse::<i64>() {
                Ok(n) if n > 0 => n.min(max),
                _ => {
                    return Err(Refusal::bad_request(format!(
                        "invalid expires_in {text:?}: a positive number of seconds"
                    )));
                }
            },
        };
        let roles =
            authz::granted_roles(&self.state.roles, &scope, principal).map_err(Refusal::from)?;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost");
        let claims = authz::AccessTokenClaims {
            ver: 1,
            iss: format!("https://{host}/zts/v1"),
            aud: scope.domain.clone(),
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
        let token = authz::sign_access_token(&self.state.token_key, &claims)
            .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, e))?;
        let scope_text: Vec<String> = roles
            .iter()
            .map(|r| format!("{}:role.{r}", scope.domain))
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": expires_in,
                "scope": scope_text.join(" "),
            }),
        ))
    }
}

/// A token on behalf of another principal: ZTS grants it only to principals configured as
/// authorized proxies, and the dev ZTS has none, so it answers as ZTS does to everyone else.
fn refuse_proxy(principal: &str, proxy_for: Option<&str>) -> Result<(), Refusal> {
    match proxy_for {
        None | Some("") => Ok(()),
        Some(_) => Err(Refusal(
            StatusCode::FORBIDDEN,
            format!("{principal} is not authorized for proxy access"),
        )),
    }
}

impl ZtsHandler {
    /// `GET /zts/v1/domain/{domain}/token?role=<r,…>&minExpiryTime=&maxExpiryTime=`: a role token
    /// (`Z1`) for the named roles of `domain` the caller (its client certificate) is in, or all of
    /// them without `role`; `{token, expiryTime}`.
    fn role_token(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
        domain: &str,
    ) -> Result<Response<Body>, Refusal> {
        use super::authz;
        let Some(principal) = &conn.principal else {
            return Err(Refusal::unauthorized(
                "a client certificate is required for a role token",
            ));
        };
        let query = authz::parse_form(req.uri().query().unwrap_or_default().as_bytes())
            .map_err(Refusal::from)?;
        let field = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let scope = authz::role_scope(domain, field("role")).map_err(Refusal::from)?;
        refuse_proxy(principal, field("proxyForPrincipal"))?;
        let seconds = |name: &str| -> Result<Option<i64>, Refusal> {
            match field(name) {
                None | Some("") => Ok(None),
                Some(text) => text
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| {
                        Refusal::bad_request(format!("invalid {name} {text:?}: positive seconds"))
                    }),
            }
        };
        let max = self.state.settings.max_token_expiry.whole_seconds();
        let lifetime = seconds("maxExpiryTime")?
            .unwrap_or(3600)
            .max(seconds("minExpiryTime")?.unwrap_or(0))
            .min(max);
        let roles =
            authz::granted_roles(&self.state.roles, &scope, principal).map_err(Refusal::from)?;
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

impl ZtsHandler {
    /// `POST /zts/v1/rolecert` `{csr, expiryTime}` → `{x509Certificate}`: a certificate of role
    /// `<d>:role.<r>` for the caller (its client certificate), who must be a member. The CSR
    /// names exactly the role (CN and `spiffe://<d>/ra/<r>`) and the caller
    /// (`athenz://principal/<caller>`).
    fn role_cert(&self, req: &Request<Bytes>, conn: &ConnInfo) -> Result<Response<Body>, Refusal> {
        use super::authz;
        let Some(principal) = &conn.principal else {
            return Err(Refusal::unauthorized(
                "a client certificate is required for a role certificate",
            ));
        };
        let request: athenz_core::zts::RoleCertificateRequest =
            parse_json(req, "role certificate request")?;
        let csr = parse_csr(&request.csr, "rolecert")?;
        let (domain, role) = csr.common_name.split_once(":role.").ok_or_else(|| {
            Refusal::bad_request(format!(
                "CSR CN {:?} is not <domain>:role.<role>",
                csr.common_name
            ))
        })?;
        let expected = names::role_csr_identity(domain, role, principal)
            .map_err(|e| Refusal::bad_request(format!("CSR: {e}")))?;
        let caller_uri = format!("athenz://principal/{principal}");
        if let Some(other) = csr
            .uris
            .iter()
            .find(|u| u.starts_with("athenz://principal/") && **u != caller_uri)
        {
            return Err(Refusal::forbidden(format!(
                "CSR principal {other} is not the caller {principal}"
            )));
        }
        let mut uris = csr.uris.clone();
        uris.sort();
        let mut want = expected.uris.clone();
        want.sort();
        if uris != want || !csr.dns_names.is_empty() || !csr.ip_addresses.is_empty() {
            return Err(Refusal::bad_request(format!(
                "CSR SANs must be exactly the URIs {want:?}"
            )));
        }
        let scope = authz::role_scope(domain, Some(role)).map_err(Refusal::from)?;
        authz::granted_roles(&self.state.roles, &scope, principal).map_err(Refusal::from)?;
        let mut minutes = i64::from(self.state.settings.max_cert_lifetime_minutes);
        if request.expiry_time > 0 {
            minutes = minutes.min(request.expiry_time);
        }
        let issued = self.issue(&csr, Duration::minutes(minutes))?;
        Ok(json_response(
            StatusCode::OK,
            &athenz_core::zts::RoleCertificate {
                x509_certificate: issued.cert_pem,
            },
        ))
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(
    req: &Request<Bytes>,
    what: &str,
) -> Result<T, Refusal> {
    serde_json::from_slice(req.body())
        .map_err(|e| Refusal::bad_request(format!("invalid {what}: {e}")))
}

fn parse_csr(pem: &str, caller: &str) -> Result<CsrInfo, Refusal> {
    CsrInfo::from_pem(pem)
        .map_err(|e| Refusal::bad_request(format!("{caller}: unable to parse cert request: {e}")))
}

fn client_ip(conn: &ConnInfo) -> String {
    match conn.peer {
        Peer::Tcp(addr) => addr.ip().to_string(),
        Peer::Unix { .. } => String::new(),
    }
}

/// The attributes ZTS sends a provider about a CSR (DESIGN.md 4.4).
fn confirmation_attributes(
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

impl ZtsHandler {
    fn provider(&self, name: &str, caller: &str) -> Result<ProviderEntry, Refusal> {
        self.state
            .registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .provider(name)
            .cloned()
            .ok_or_else(|| Refusal::bad_request(format!("{caller}: unknown provider {name}")))
    }

    /// Certificate lifetime: the configured maximum, lowered by the request and by the provider.
    fn lifetime(&self, requested: Option<i32>, confirmed: &InstanceConfirmation) -> Duration {
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

    fn issue(&self, csr: &CsrInfo, lifetime: Duration) -> Result<IssuedCert, Refusal> {
        self.state
            .signer
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
                    format!("signing failed: {e}"),
                )
            })
    }

    fn service_token(&self, domain: &str, service: &str) -> Result<Secret, Refusal> {
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

    async fn confirm(
        &self,
        provider: &ProviderEntry,
        route: ProviderRoute,
        confirmation: &InstanceConfirmation,
        caller: &str,
    ) -> Result<InstanceConfirmation, Refusal> {
        match self
            .state
            .providers
            .confirm(provider, route, confirmation)
            .await
        {
            Ok(c) => Ok(c),
            Err(ProviderOutcome::Denied(message)) => Err(Refusal::forbidden(format!(
                "{caller}: unable to validate instance with provider {}: {message}",
                provider.name
            ))),
            Err(ProviderOutcome::Unreachable(message)) => Err(Refusal(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "{caller}: provider {} did not answer: {message}",
                    provider.name
                ),
            )),
        }
    }

    async fn register(&self, req: &Request<Bytes>, conn: &ConnInfo) -> Outcome {
        const CALLER: &str = "postInstanceRegisterInformation";
        let info: InstanceRegisterInformation = parse_json(req, "InstanceRegisterInformation")?;
        names::validate_provider("provider", &info.provider)
            .and_then(|()| names::validate_domain("domain", &info.domain))
            .and_then(|()| names::validate_service("service", &info.service))
            .map_err(|e| Refusal::bad_request(format!("{CALLER}: {e}")))?;
        let provider = self.provider(&info.provider, CALLER)?;
        if !provider.may_launch(&info.domain, &info.service) {
            return Err(Refusal::forbidden(format!(
                "{CALLER}: provider {} is not authorized to launch {}.{}",
                info.provider, info.domain, info.service
            )));
        }
        let csr = parse_csr(&info.csr, CALLER)?;
        let instance_id = check_instance_csr(
            &csr,
            &info.provider,
            &info.domain,
            &info.service,
            &provider.dns_suffixes,
        )
        .map_err(|why| {
            Refusal::bad_request(format!("{CALLER}: unable to validate cert request: {why}"))
        })?;

        let confirmation = InstanceConfirmation {
            provider: info.provider.clone(),
            domain: info.domain.clone(),
            service: info.service.clone(),
            attestation_data: info.attestation_data.clone(),
            attributes: confirmation_attributes(&csr, &instance_id, conn),
        };
        let confirmed = self
            .confirm(&provider, ProviderRoute::Instance, &confirmation, CALLER)
            .await?;
        let issued = self.issue(&csr, self.lifetime(info.expiry_time, &confirmed))?;
        let key = InstanceKey {
            provider: info.provider.clone(),
            domain: info.domain.clone(),
            service: info.service.clone(),
            instance_id: instance_id.clone(),
        };
        self.state.instances.register(key, &issued.serial_hex);

        let identity = InstanceIdentity {
            provider: info.provider.clone(),
            name: names::principal(&info.domain, &info.service),
            instance_id: instance_id.clone(),
            x509_certificate: Some(issued.cert_pem),
            x509_certificate_signer: Some(self.state.ca_bundle.clone()),
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

    async fn refresh_instance(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
        provider_name: &str,
        domain: &str,
        service: &str,
        instance_id: &str,
    ) -> Outcome {
        const CALLER: &str = "postInstanceRefreshInformation";
        names::validate_provider("provider", provider_name)
            .and_then(|()| names::validate_domain("domain", domain))
            .and_then(|()| names::validate_service("service", service))
            .and_then(|()| names::validate_instance_id("instance id", instance_id))
            .map_err(|e| Refusal::bad_request(format!("{CALLER}: {e}")))?;
        let principal = names::principal(domain, service);
        let presented = conn.principal.as_deref().ok_or_else(|| {
            Refusal::unauthorized(format!("{CALLER}: a client certificate is required"))
        })?;
        if presented != principal {
            return Err(Refusal::forbidden(format!(
                "{CALLER}: principal mismatch: {presented} is not {principal}"
            )));
        }
        let info: InstanceRefreshInformation = parse_json(req, "InstanceRefreshInformation")?;
        let provider = self.provider(provider_name, CALLER)?;
        let csr_pem = info
            .csr
            .as_deref()
            .ok_or_else(|| Refusal::bad_request(format!("{CALLER}: no CSR")))?;
        let csr = parse_csr(csr_pem, CALLER)?;
        let csr_instance =
            check_instance_csr(&csr, provider_name, domain, service, &provider.dns_suffixes)
                .map_err(|why| {
                    Refusal::bad_request(format!(
                        "{CALLER}: unable to validate cert request: {why}"
                    ))
                })?;
        if csr_instance != instance_id {
            return Err(Refusal::forbidden(format!(
                "{CALLER}: instance id mismatch: CSR names {csr_instance}, path names {instance_id}"
            )));
        }
        let cert = conn
            .peer_certificate
            .as_ref()
            .and_then(|der| CertInfo::from_der(der).ok())
            .ok_or_else(|| {
                Refusal::unauthorized(format!("{CALLER}: a client certificate is required"))
            })?;
        let cert_instance = cert.uris.iter().find_map(|u| {
            u.strip_prefix(&format!("athenz://instanceid/{provider_name}/"))
                .map(str::to_owned)
        });
        if cert_instance.as_deref() != Some(instance_id) {
            return Err(Refusal::forbidden(format!(
                "{CALLER}: instance id mismatch: the certificate names {cert_instance:?}, path names {instance_id}"
            )));
        }
        let key = InstanceKey {
            provider: provider_name.to_owned(),
            domain: domain.to_owned(),
            service: service.to_owned(),
            instance_id: instance_id.to_owned(),
        };
        match self.state.instances.check_refresh(&key, &cert.serial_hex) {
            Ok(()) => {}
            Err(RefreshRefusal::Unknown) => {
                return Err(Refusal::not_found(format!(
                    "{CALLER}: unknown instance {instance_id}"
                )));
            }
            Err(RefreshRefusal::Revoked) => {
                return Err(Refusal::forbidden("Certificate revoked"));
            }
        }

        let confirmation = InstanceConfirmation {
            provider: provider_name.to_owned(),
            domain: domain.to_owned(),
            service: service.to_owned(),
            attestation_data: info.attestation_data.clone().unwrap_or_default(),
            attributes: confirmation_attributes(&csr, instance_id, conn),
        };
        let confirmed = self
            .confirm(&provider, ProviderRoute::Refresh, &confirmation, CALLER)
            .await?;
        let issued = self.issue(&csr, self.lifetime(info.expiry_time, &confirmed))?;
        self.state
            .instances
            .rotate(&key, &cert.serial_hex, &issued.serial_hex);
        let identity = InstanceIdentity {
            provider: provider_name.to_owned(),
            name: principal,
            instance_id: instance_id.to_owned(),
            x509_certificate: Some(issued.cert_pem),
            x509_certificate_signer: Some(self.state.ca_bundle.clone()),
            service_token: match info.token {
                Some(true) => Some(self.service_token(domain, service)?),
                _ => None,
            },
            attributes: None,
        };
        Ok(json_response(StatusCode::OK, &identity))
    }

    fn refresh_with_key(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
        domain: &str,
        service: &str,
    ) -> Outcome {
        const CALLER: &str = "postInstanceRefreshRequest";
        names::validate_domain("domain", domain)
            .and_then(|()| names::validate_service("service", service))
            .map_err(|e| Refusal::bad_request(format!("{CALLER}: {e}")))?;
        let principal = names::principal(domain, service);
        let token_text = req
            .headers()
            .get(PRINCIPAL_AUTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Refusal::unauthorized(format!("{CALLER}: authentication required")))?;
        let token = NToken::parse(token_text).map_err(|e| {
            Refusal::unauthorized(format!("{CALLER}: invalid principal token: {e}"))
        })?;
        if token.principal() != principal {
            return Err(Refusal::forbidden(format!(
                "{CALLER}: principal mismatch: token is for {}, path names {principal}",
                token.principal()
            )));
        }
        let key = self
            .state
            .registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .service_key(&principal, &token.key_version)
            .cloned()
            .ok_or_else(|| {
                Refusal::unauthorized(format!(
                    "{CALLER}: no public key {} registered for {principal}",
                    token.key_version
                ))
            })?;
        token
            .verify(
                &key,
                OffsetDateTime::now_utc(),
                VerifyLimits {
                    max_skew: self.state.settings.ntoken_skew,
                    ..VerifyLimits::default()
                },
            )
            .map_err(|e| Refusal::unauthorized(format!("{CALLER}: {e}")))?;

        let request: InstanceRefreshRequest = parse_json(req, "InstanceRefreshRequest")?;
        let csr = parse_csr(&request.csr, CALLER)?;
        let registered = athenz_core::crypto::PublicKey::from_spki_der(&csr.public_key_der)
            .ok()
            .filter(|csr_key| csr_key.same_key(&key));
        if registered.is_none() {
            return Err(Refusal::bad_request(format!(
                "{CALLER}: the CSR's public key is not the registered key {}",
                token.key_version
            )));
        }
        check_service_csr(
            &csr,
            domain,
            service,
            &self.state.settings.service_dns_suffixes,
        )
        .map_err(|why| {
            Refusal::bad_request(format!("{CALLER}: unable to validate cert request: {why}"))
        })?;
        // As ZTS does: an IP SAN must be the address the request comes from.
        let caller_ip = client_ip(conn);
        if let Some(ip) = csr
            .ip_addresses
            .iter()
            .find(|ip| ip.to_string() != caller_ip)
        {
            return Err(Refusal::bad_request(format!(
                "{CALLER}: unable to validate cert request: IP address {ip} is not the \
                 client's address {caller_ip:?}"
            )));
        }
        let mut minutes = i64::from(self.state.settings.max_cert_lifetime_minutes);
        if let Some(r) = request.expiry_time.filter(|r| *r > 0) {
            minutes = minutes.min(i64::from(r));
        }
        let issued = self.issue(&csr, Duration::minutes(minutes))?;
        Ok(json_response(
            StatusCode::OK,
            &Identity {
                name: principal,
                certificate: issued.cert_pem,
                ca_cert_bundle: Some(self.state.ca_bundle.clone()),
                service_token: None,
            },
        ))
    }
}
