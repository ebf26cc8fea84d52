//! The webhook's own certificate authority and the serving certificates it signs: what they
//! hold, how long they live and when each is replaced. Pure functions of their inputs (the clock
//! is a parameter), so every edge of a rotation is tested without waiting for it.

use athenz_core::crypto::{CertInfo, CryptoError, PrivateKey};
use athenz_core::secret::Secret;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// How long a CA is valid. The API server trusts it through the webhook's `caBundle`, which the
/// initializer keeps in step, so its length costs nothing but the window a stolen key is good for.
pub const CA_LIFETIME: Duration = Duration::days(365);
/// How long a serving certificate is valid; each replica signs its own, with a key that never
/// leaves its memory.
pub const SERVING_LIFETIME: Duration = Duration::days(7);
/// Share of its lifetime after which a CA or a serving certificate is replaced. A replaced CA
/// stays in the bundle until it expires, so serving certificates it signed keep verifying.
pub const RENEW_AT: f64 = 2.0 / 3.0;
/// The CA's subject common name.
pub const CA_NAME: &str = "athenz-initializer webhook CA";

/// What went wrong with the CA or a serving certificate.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A stored CA that cannot be used.
    #[error("the stored CA: {0}")]
    BadCa(String),
    /// Generating or signing failed.
    #[error("{what}: {source}")]
    Signing {
        /// What was being made.
        what: &'static str,
        /// rcgen's reason.
        source: rcgen::Error,
    },
    /// No random serial number.
    #[error("drawing a serial number: {0}")]
    Random(String),
    /// A certificate or key just made could not be read back.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
}

/// A CA certificate and its key, as the Secret holds them (PEM).
pub struct WebhookCa {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    /// Its PKCS#8 key (PEM).
    pub key_pem: Secret,
    /// What the certificate says.
    pub info: CertInfo,
}

impl std::fmt::Debug for WebhookCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookCa(serial {})", self.info.serial_hex)
    }
}

/// A serving certificate and its key.
pub struct ServingPair {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its key (PKCS#8 PEM).
    pub key_pem: Secret,
    /// What the certificate says.
    pub info: CertInfo,
    /// The serial of the CA that signed it.
    pub ca_serial: String,
}

impl std::fmt::Debug for ServingPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ServingPair(serial {}, CA {})",
            self.info.serial_hex, self.ca_serial
        )
    }
}

fn signing(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Signing { what, source }
}

fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    athenz_core::random::fill(&mut bytes).map_err(|e| PkiError::Random(e.to_string()))?;
    // positive and without a leading zero byte, as RFC 5280 asks
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from(bytes.to_vec()))
}

/// Whether a certificate valid from `not_before` to `not_after` is due for replacement at `now`:
/// past [`RENEW_AT`] of its lifetime, or not valid at all.
pub fn due(not_before: OffsetDateTime, not_after: OffsetDateTime, now: OffsetDateTime) -> bool {
    if now < not_before || now >= not_after {
        return true;
    }
    let lifetime = (not_after - not_before).as_seconds_f64();
    (now - not_before).as_seconds_f64() >= lifetime * RENEW_AT
}

impl WebhookCa {
    /// A new self-signed CA (EC P-256) valid from `now` for [`CA_LIFETIME`].
    pub fn generate(now: OffsetDateTime) -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(signing("generating the CA key"))?;
        let cert = Self::params(now)?
            .self_signed(&key)
            .map_err(signing("signing the CA"))?;
        let cert_pem = cert.pem();
        let info = CertInfo::from_pem(&cert_pem)?;
        Ok(Self {
            cert_pem,
            key_pem: Secret::new(key.serialize_pem()),
            info,
        })
    }

    fn params(now: OffsetDateTime) -> Result<CertificateParams, PkiError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, CA_NAME);
        params.distinguished_name = dn;
        // it signs serving certificates and nothing below them
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now;
        params.not_after = now + CA_LIFETIME;
        params.serial_number = Some(random_serial()?);
        Ok(params)
    }

    /// A CA read back from the Secret: a CA certificate and the key that belongs to it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let info = CertInfo::from_pem(cert_pem).map_err(|e| PkiError::BadCa(e.to_string()))?;
        if !info.is_ca {
            return Err(PkiError::BadCa("the certificate is not a CA".into()));
        }
        let key = PrivateKey::from_pem(key_pem).map_err(|e| PkiError::BadCa(e.to_string()))?;
        if !athenz_core::crypto::key_matches_cert(&key, &info) {
            return Err(PkiError::BadCa(
                "the key does not belong to the certificate".into(),
            ));
        }
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: Secret::new(key_pem),
            info,
        })
    }

    /// Whether the CA is due for replacement at `now`.
    pub fn due(&self, now: OffsetDateTime) -> bool {
        due(self.info.not_before, self.info.not_after, now)
    }

    /// A serving certificate for `dns_names` with a fresh key, valid from `now` for
    /// [`SERVING_LIFETIME`] and never past the CA's own end.
    pub fn sign_serving(
        &self,
        dns_names: &[String],
        now: OffsetDateTime,
    ) -> Result<ServingPair, PkiError> {
        let ca_key = KeyPair::from_pem(self.key_pem.expose())
            .map_err(|e| PkiError::BadCa(format!("key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)
            .map_err(|e| PkiError::BadCa(format!("certificate: {e}")))?;
        let key = KeyPair::generate().map_err(signing("generating the serving key"))?;
        let mut params = CertificateParams::new(dns_names.to_vec())
            .map_err(signing("naming the serving certificate"))?;
        let mut dn = DistinguishedName::new();
        if let Some(first) = dns_names.first() {
            dn.push(DnType::CommonName, first.as_str());
        }
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = now;
        params.not_after = (now + SERVING_LIFETIME).min(self.info.not_after);
        params.serial_number = Some(random_serial()?);
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(signing("signing the serving certificate"))?;
        let cert_pem = cert.pem();
        Ok(ServingPair {
            info: CertInfo::from_pem(&cert_pem)?,
            cert_pem,
            key_pem: Secret::new(key.serialize_pem()),
            ca_serial: self.info.serial_hex.clone(),
        })
    }
}

impl ServingPair {
    /// Whether the pair must be replaced at `now`: signed by another CA than `ca`, or due.
    pub fn due(&self, ca: &WebhookCa, now: OffsetDateTime) -> bool {
        self.ca_serial != ca.info.serial_hex || due(self.info.not_before, self.info.not_after, now)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use athenz_core::tls;
    use rustls::client::danger::ServerCertVerifier;

    fn t(days: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap() + Duration::days(days)
    }

    fn names() -> Vec<String> {
        vec!["athenz-initializer.k8s-admin.svc".to_owned()]
    }

    #[test]
    fn a_serving_certificate_chains_to_its_ca_and_names_the_service() {
        let now = OffsetDateTime::now_utc();
        let ca = WebhookCa::generate(now - Duration::minutes(1)).unwrap();
        let pair = ca
            .sign_serving(&names(), now - Duration::minutes(1))
            .unwrap();
        assert_eq!(pair.info.dns_names, names());
        assert!(!pair.info.is_ca);
        assert_eq!(pair.info.issuer, ca.info.subject);
        assert_eq!(pair.info.not_after - pair.info.not_before, SERVING_LIFETIME);
        // as a TLS client (the API server) checks it: a server certificate under the bundle
        let roots =
            tls::root_store(&athenz_core::crypto::pem_certificates(&ca.cert_pem).unwrap()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder(roots)
            .build()
            .unwrap();
        let chain = athenz_core::crypto::pem_certificates(&pair.cert_pem).unwrap();
        let name = rustls_pki_types::ServerName::try_from(names()[0].clone()).unwrap();
        verifier
            .verify_server_cert(
                &chain[0],
                &[],
                &name,
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .unwrap();
        // and the key serves it
        tls::certified_key_from_pem(&pair.cert_pem, pair.key_pem.expose()).unwrap();
    }

    #[test]
    fn a_ca_read_back_must_be_a_ca_with_its_own_key() {
        let ca = WebhookCa::generate(t(0)).unwrap();
        let again = WebhookCa::from_pem(&ca.cert_pem, ca.key_pem.expose()).unwrap();
        assert_eq!(again.info.serial_hex, ca.info.serial_hex);
        let other = WebhookCa::generate(t(0)).unwrap();
        let mixed = WebhookCa::from_pem(&ca.cert_pem, other.key_pem.expose()).unwrap_err();
        assert!(mixed.to_string().contains("does not belong"), "{mixed}");
        let leaf = ca.sign_serving(&names(), t(0)).unwrap();
        let not_ca = WebhookCa::from_pem(&leaf.cert_pem, leaf.key_pem.expose()).unwrap_err();
        assert!(not_ca.to_string().contains("not a CA"), "{not_ca}");
        for (cert, key) in [
            ("", ca.key_pem.expose()),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                ca.key_pem.expose(),
            ),
            (ca.cert_pem.as_str(), ""),
            (
                ca.cert_pem.as_str(),
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            ),
        ] {
            let err = WebhookCa::from_pem(cert, key).unwrap_err();
            assert!(err.to_string().starts_with("the stored CA"), "{err}");
        }
        let huge = "A".repeat(athenz_core::crypto::MAX_PEM_LEN + 1);
        assert!(WebhookCa::from_pem(&huge, ca.key_pem.expose()).is_err());
    }

    #[test]
    fn each_is_replaced_at_two_thirds_of_its_life_or_when_not_valid() {
        let ca = WebhookCa::generate(t(0)).unwrap();
        assert!(!ca.due(t(0)));
        assert!(!ca.due(t(243)));
        assert!(ca.due(t(244)));
        assert!(ca.due(t(400)));
        assert!(ca.due(t(-1)));
        let pair = ca.sign_serving(&names(), t(0)).unwrap();
        assert!(!pair.due(&ca, t(4)));
        assert!(pair.due(&ca, t(5)));
        // another CA's pair is replaced at once, however young
        let next = WebhookCa::generate(t(0)).unwrap();
        assert!(pair.due(&next, t(0)));
    }

    #[test]
    fn a_serving_certificate_never_outlives_its_ca() {
        let ca = WebhookCa::generate(t(0)).unwrap();
        let late = ca.sign_serving(&names(), t(362)).unwrap();
        assert_eq!(late.info.not_after, ca.info.not_after);
    }
}
