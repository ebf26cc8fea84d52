//! `POST /zts/v1/instance/{domain}/{service}/refresh`: a control-plane service refreshes its
//! certificate with its own key, authenticated by an ntoken signed with it (Athenz
//! `ZTSImpl.postInstanceRefreshRequest`, the `InstanceRefreshRequest` type), with Athenz's
//! status codes and message texts: an ntoken of another service is `400 Principal mismatch:
//! <path> vs. <token>`; a CSR that cannot be read is `400 Unable to parse PKCS10 certificate
//! request`; then `400 Invalid CSR - data mismatch` (CN and names,
//! `ZTSUtils.verifyCertificateRequest`), `- public key mismatch`, and, with
//! `cert_request_verify_ip` on (Athenz's default is off), `- IP address mismatch`. A
//! missing, malformed, expired or unverifiable ntoken is 401, as ZTS's authority refuses it.

use super::refusal::{Outcome, Refusal, parse_json};
use super::server::{ZtsHandler, client_ip};
use super::x509_cert_request::check_service_csr;
use athenz_core::crypto::CsrInfo;
use athenz_core::http::{ConnInfo, json_response};
use athenz_core::names;
use athenz_core::ntoken::{NToken, VerifyLimits};
use athenz_core::zts::{Identity, InstanceRefreshRequest, PRINCIPAL_AUTH_HEADER};
use bytes::Bytes;
use http::{Request, StatusCode};
use time::{Duration, OffsetDateTime};

impl ZtsHandler {
    /// Serves a key-based refresh (see the module).
    pub(super) fn refresh_with_key(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
        domain: &str,
        service: &str,
    ) -> Outcome {
        names::validate_domain("domain", domain)
            .and_then(|()| names::validate_service("service", service))
            .map_err(|e| Refusal::bad_request(e.to_string()))?;
        let principal = names::principal(domain, service);
        let token_text = req
            .headers()
            .get(PRINCIPAL_AUTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Refusal::unauthorized("authentication required"))?;
        let token = NToken::parse(token_text)
            .map_err(|e| Refusal::unauthorized(format!("invalid principal token: {e}")))?;
        if token.principal() != principal {
            return Err(Refusal::bad_request(format!(
                "Principal mismatch: {principal} vs. {}",
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
                    "no public key {} registered for {principal}",
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
            .map_err(|e| Refusal::unauthorized(e.to_string()))?;

        let request: InstanceRefreshRequest = parse_json(req, "InstanceRefreshRequest")?;
        let csr = CsrInfo::from_pem(&request.csr)
            .map_err(|_| Refusal::bad_request("Unable to parse PKCS10 certificate request"))?;
        let registered = athenz_core::crypto::PublicKey::from_spki_der(&csr.public_key_der)
            .ok()
            .filter(|csr_key| csr_key.same_key(&key));
        // ZTSUtils.verifyCertificateRequest: the CN, and the DNS names under allowed suffixes
        check_service_csr(
            &csr,
            domain,
            service,
            &self.state.settings.service_dns_suffixes,
        )
        .map_err(|_| Refusal::bad_request("Invalid CSR - data mismatch"))?;
        if registered.is_none() {
            return Err(Refusal::bad_request("Invalid CSR - public key mismatch"));
        }
        // As ZTS does when told to (athenz.zts.cert_request_verify_ip, off by default): an IP
        // SAN must be the address the request comes from.
        let caller_ip = client_ip(conn);
        if self.state.settings.cert_request_verify_ip
            && csr
                .ip_addresses
                .iter()
                .any(|ip| ip.to_string() != caller_ip)
        {
            return Err(Refusal::bad_request("Invalid CSR - IP address mismatch"));
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
                ca_cert_bundle: Some(self.state.cas.bundle().to_owned()),
                service_token: None,
            },
        ))
    }
}
