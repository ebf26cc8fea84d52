//! `POST /zts/v1/instance/{provider}/{domain}/{service}/{instanceId}`: an instance refreshes its
//! certificate, authenticated by the one it holds. The rules and their order are Athenz's
//! (`servers/zts/.../ZTSImpl.java`: `postInstanceRefreshInformation`,
//! `processProviderX509RefreshRequest`, `getValidatedX509CertRecord`), with their status codes
//! and message texts:
//!
//! | check | status | message |
//! |---|---|---|
//! | no client certificate | 401 | `Invalid credentials` |
//! | no CSR | 400 | `no csr provided` |
//! | the client certificate's principal is not the path's | 400 | `Principal mismatch: <path> vs. <cert>` |
//! | the provider may not launch the service | 403 | `provider '<p>' not authorized to launch ...` |
//! | the CSR cannot be read | 400 | `unable to parse PKCS10 CSR` |
//! | the CSR breaks a rule | 400 | `CSR validation failed - <rule>` |
//! | CSR, path and certificate name different instances | 400 | `CSR validation failed - instance id mismatch` |
//! | the provider refuses (or answers 504 / not at all) | 403 (504) | `unable to verify attestation data: ...` |
//! | ZTS has no record of the instance | 403 | `Unable to find certificate record` |
//! | the certificate is neither the current nor the previous one | 403 | `Certificate revoked` |
//!
//! The provider is asked before the record is read, as in Athenz: a refresh of an unknown
//! instance still reaches the provider.

use super::instance_provider_client::ProviderRoute;
use super::instances::{InstanceKey, RefreshRefusal};
use super::refusal::{INVALID_CREDENTIALS, Outcome, Refusal, parse_csr, parse_json};
use super::server::{RefreshPath, ZtsHandler};
use super::x509_cert_request::{check_instance_csr, validate_instance_id};
use athenz_core::crypto::CertInfo;
use athenz_core::http::{ConnInfo, json_response};
use athenz_core::names;
use athenz_core::zts::{InstanceConfirmation, InstanceIdentity, InstanceRefreshInformation};
use bytes::Bytes;
use http::{Request, StatusCode};

impl ZtsHandler {
    /// Serves a refresh (see the module's table).
    pub(super) async fn refresh_instance(
        &self,
        req: &Request<Bytes>,
        conn: &ConnInfo,
        path: RefreshPath<'_>,
    ) -> Outcome {
        let RefreshPath {
            provider: provider_name,
            domain,
            service,
            instance_id,
        } = path;
        names::validate_provider("provider", provider_name)
            .and_then(|()| names::validate_domain("domain", domain))
            .and_then(|()| names::validate_service("service", service))
            .and_then(|()| names::validate_instance_id("instance id", instance_id))
            .map_err(|e| Refusal::bad_request(e.to_string()))?;
        // an authenticated route: without a client certificate, ZTS's authentication
        // (`Http.authenticate`) refuses before the route runs, in its own words
        let presented = conn
            .principal
            .as_deref()
            .ok_or_else(|| Refusal::unauthorized(INVALID_CREDENTIALS))?;
        let info: InstanceRefreshInformation = parse_json(req, "InstanceRefreshInformation")?;
        let csr_pem = info
            .csr
            .as_deref()
            .filter(|csr| !csr.is_empty())
            .ok_or_else(|| Refusal::bad_request("no csr provided"))?;
        let principal = names::principal(domain, service);
        if !presented.eq_ignore_ascii_case(&principal) {
            return Err(Refusal::bad_request(format!(
                "Principal mismatch: {principal} vs. {presented}"
            )));
        }
        let provider = self.launching_provider(provider_name, domain, service)?;
        let csr = parse_csr(csr_pem)?;
        let csr_instance = check_instance_csr(&csr, domain, service, &provider.dns_suffixes)
            .map_err(|why| Refusal::bad_request(format!("CSR validation failed - {why}")))?;
        let cert = conn
            .peer_certificate
            .as_ref()
            .and_then(|der| CertInfo::from_der(der).ok())
            .ok_or_else(|| Refusal::unauthorized(INVALID_CREDENTIALS))?;
        if !validate_instance_id(&csr_instance, instance_id, &cert) {
            return Err(Refusal::bad_request(
                "CSR validation failed - instance id mismatch",
            ));
        }

        let confirmation = InstanceConfirmation {
            provider: provider_name.to_owned(),
            domain: domain.to_owned(),
            service: service.to_owned(),
            attestation_data: info.attestation_data.clone().unwrap_or_default(),
            attributes: self.confirmation_attributes(&csr, instance_id, conn),
        };
        let confirmed = self
            .confirm(&provider, ProviderRoute::Refresh, &confirmation, conn)
            .await?;
        let key = InstanceKey {
            provider: provider_name.to_owned(),
            domain: domain.to_owned(),
            service: service.to_owned(),
            instance_id: instance_id.to_owned(),
        };
        match self.state.instances.check_refresh(&key, &cert.serial_hex) {
            Ok(()) => {}
            Err(RefreshRefusal::Unknown) => {
                return Err(Refusal::forbidden("Unable to find certificate record"));
            }
            Err(RefreshRefusal::Revoked) => return Err(Refusal::forbidden("Certificate revoked")),
        }
        let issued = self.issue(&csr, self.lifetime(info.expiry_time, &confirmed))?;
        self.state
            .instances
            .rotate(&key, &cert.serial_hex, &issued.serial_hex);
        let identity = InstanceIdentity {
            provider: provider_name.to_owned(),
            name: principal,
            instance_id: instance_id.to_owned(),
            x509_certificate: Some(issued.cert_pem),
            x509_certificate_signer: Some(self.state.cas.bundle().to_owned()),
            service_token: match info.token {
                Some(true) => Some(self.service_token(domain, service)?),
                _ => None,
            },
            attributes: None,
        };
        Ok(json_response(StatusCode::OK, &identity))
    }
}
