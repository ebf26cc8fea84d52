//! `POST /zts/v1/rolecert`: a role certificate for the caller, as Athenz issues it
//! (`ZTSImpl.postRoleCertificateRequestExt`, `processRoleCertificateRequest`,
//! `validateRoleCertificateRequest`; `cert/X509RoleCertRequest.java`), with ZTS's default settings
//! (`validate_role_cert_dns_names`, `cert_request_verify_ip`, `validate_cert_uri_schemes` all false):
//!
//! - the request's optional fields (`proxyForPrincipal`, `prevCertNotBefore`,
//!   `prevCertNotAfter`, `x509CertSignerKeyId`) and unknown ones are accepted, the signer key id
//!   only as ZTS's schema types it (a `SimpleName`, else 400);
//! - the CSR's CN is `<domain>:role.<role>`, else it cannot be parsed ("Unable to parse PKCS10
//!   CSR: Role Certificate CN is not a valid role");
//! - a proxy request needs a caller configured as an authorized proxy user (403), and both the
//!   caller and the principal it acts for must be in the role;
//! - the domain must exist (404), the caller must be in the role (403), then the CSR is checked
//!   (400 "Unable to validate cert request"): the principal named by an `athenz://principal/` URI
//!   or by a single email SAN `<principal>@<suffix>` (either, or both agreeing), the proxy user URI
//!   for a proxy request, a SPIFFE URI of the role if any, an instance id URI matching the caller's
//!   certificate if any; DNS and IP SANs as the caller likes.

use super::authz;
use super::refusal::{Refusal, parse_csr, parse_json};
use super::server::ZtsHandler;
use super::x509_cert_request::{check_parsable, instance_id_in, instance_id_of_certificate};
use athenz_core::crypto::{CertInfo, CsrInfo};
use athenz_core::http::{Body, ConnInfo, json_response};
use athenz_core::zts::{RoleCertificate, RoleCertificateRequest};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use time::Duration;

/// `ZTSConsts.ZTS_CERT_PRINCIPAL_URI`.
const PRINCIPAL_URI: &str = "athenz://principal/";

/// `ZTSConsts.ZTS_CERT_PROXY_USER_URI`.
const PROXY_USER_URI: &str = "athenz://proxyuser/";

/// ZTS validates each request against its RDL schema before reading it (`ZTSImpl.validate`,
/// `ZTSSchema`): the one typed field a role certificate request carries beyond the CSR is the
/// signer key id, a `SimpleName`. The message is rdl-java `Validator`'s, checked through
/// Athenz's own Validator by harness/peers/athenz/java (row `role_cert_signer_key_id_not_simple_name`).
fn check_schema(request: &RoleCertificateRequest) -> Result<(), Refusal> {
    let simple_name = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    match request.x509_cert_signer_key_id.as_deref() {
        // ZTSImpl.validate wraps the validator's ResourceException in its own message
        Some(id) if !simple_name(id) => Err(Refusal::bad_request(
            "Invalid RoleCertificateRequest error: ResourceException (400): {code: 400, message: \"Invalid RoleCertificateRequest error: String pattern mismatch (expected \"[a-zA-Z0-9_][a-zA-Z0-9_-]*\")  for type SimpleName in data.x509CertSignerKeyId\"}",
        )),
        _ => Ok(()),
    }
}

/// The role a CSR's CN names (`X509RoleCertRequest`'s constructor).
fn requested_role(csr: &CsrInfo) -> Result<(String, String), Refusal> {
    let cn = &csr.common_name;
    match cn.find(":role.") {
        Some(at) if at > 0 && at + ":role.".len() < cn.len() => {
            Ok((cn[..at].to_owned(), cn[at + ":role.".len()..].to_owned()))
        }
        _ => Err(Refusal::bad_request(format!(
            "Unable to parse PKCS10 CSR: Role Certificate CN is not a valid role: {cn}"
        ))),
    }
}

/// The CSR names the caller and nothing it may not (`X509RoleCertRequest.validate` and
/// `ZTSImpl.validateRoleCertificateRequest` with ZTS's defaults).
pub fn csr_is_valid(
    csr: &CsrInfo,
    principal: &str,
    proxy_user: Option<&str>,
    caller_cert: &CertInfo,
    email_suffixes: &[String],
    (domain, role): (&str, &str),
) -> bool {
    // validateRolePrincipal: the principal URI, and/or exactly one email of the principal
    let uri_principal = csr.uris.iter().find_map(|u| u.strip_prefix(PRINCIPAL_URI));
    if let Some(named) = uri_principal
        && !named.eq_ignore_ascii_case(principal)
    {
        return false;
    }
    if uri_principal.is_none() || !csr.emails.is_empty() {
        let [email] = csr.emails.as_slice() else {
            return false;
        };
        let valid_email = email
            .strip_prefix(&format!("{principal}@"))
            .is_some_and(|host| {
                email_suffixes
                    .iter()
                    .any(|suffix| host.ends_with(&format!(".{suffix}")))
            });
        if !valid_email {
            return false;
        }
    }
    // validateProxyUserUri: exactly one, naming the proxy user
    if let Some(proxy) = proxy_user {
        let mut proxies = csr
            .uris
            .iter()
            .filter(|u| u.to_ascii_lowercase().starts_with(PROXY_USER_URI));
        let want = format!("{PROXY_USER_URI}{proxy}");
        match (proxies.next(), proxies.next()) {
            (Some(uri), None) if uri.eq_ignore_ascii_case(&want) => {}
            _ => return false,
        }
    }
    // validateSpiffeURI: the role's, if there is one
    if let Some(spiffe) = csr.uris.iter().find(|u| u.starts_with("spiffe://")) {
        let parts: Vec<&str> = spiffe["spiffe://".len()..].split('/').collect();
        let names_role = match parts.as_slice() {
            [d, "ra", r] => *d == domain && *r == role,
            [_trust_domain, "ns", d, "ra", r] => *d == domain && *r == role,
            _ => false,
        };
        if !names_role {
            return false;
        }
    }
    // validateInstanceId: an instance id in the CSR must be the caller certificate's
    if let Some(id) = instance_id_in(&csr.uris, &[])
        && instance_id_of_certificate(caller_cert) != Some(id)
    {
        return false;
    }
    true
}

impl ZtsHandler {
    /// `POST /zts/v1/rolecert` `{csr, expiryTime, ...}` → `{x509Certificate}`.
    pub(super) fn role_cert(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
    ) -> Result<Response<Body>, Refusal> {
        // ZTS's caller name: its ResourceContext's api name, lower case
        const CALLER: &str = "postrolecertificaterequestext";
        let (Some(principal), Some(cert_der)) = (&conn.principal, &conn.peer_certificate) else {
            return Err(Refusal::unauthorized(
                "a client certificate is required for a role certificate",
            ));
        };
        let caller_cert = CertInfo::from_der(cert_der)
            .map_err(|e| Refusal::unauthorized(format!("the client certificate: {e}")))?;
        let request: RoleCertificateRequest = parse_json(req, "RoleCertificateRequest")?;
        check_schema(&request)?;
        let csr = parse_csr(&request.csr)?;
        check_parsable(&csr)
            .map_err(|e| Refusal::bad_request(format!("Unable to parse PKCS10 CSR: {}", e.0)))?;
        let (domain, role) = requested_role(&csr)?;
        let scope = authz::role_scope(&domain, Some(&role)).map_err(Refusal::from)?;
        let proxy_for = request
            .proxy_for_principal
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(str::to_lowercase);
        self.roles_for(CALLER, &scope, principal, proxy_for.as_deref())?;
        // for a proxy request the certificate is the proxied principal's, and the proxy user
        // (the caller) is named by its URI (ZTSImpl.processRoleCertificateRequest)
        let (cert_principal, proxy_user) = match proxy_for.as_deref() {
            Some(proxied) => (proxied, Some(principal.as_str())),
            None => (principal.as_str(), None),
        };
        if !csr_is_valid(
            &csr,
            cert_principal,
            proxy_user,
            &caller_cert,
            &self.state.settings.service_dns_suffixes,
            (&domain, &role),
        ) {
            return Err(Refusal::bad_request("Unable to validate cert request"));
        }
        let mut minutes = i64::from(self.state.settings.max_cert_lifetime_minutes);
        if request.expiry_time > 0 {
            minutes = minutes.min(request.expiry_time);
        }
        let issued = self.issue(&csr, Duration::minutes(minutes))?;
        Ok(json_response(
            StatusCode::OK,
            &RoleCertificate {
                x509_certificate: issued.cert_pem,
            },
        ))
    }
}
