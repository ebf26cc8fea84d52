//! Certificate authorities for tests and the local stack: a self-signed root, intermediates, and
//! leaf certificates for services — issued for a generated key or for the public key of a CSR.
//!
//! Leaves carry what a real Athenz CA puts in: CN, optional OUs, DNS/IP/URI SANs, digital-signature
//! and key-encipherment usages, server- and client-auth extended usages, and a random serial.

use athenz_core::crypto::{CryptoError, CsrInfo, KeyAlgorithm, PrivateKey};
use athenz_core::names::CsrIdentity;
use athenz_core::secret::Secret;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, string::Ia5String,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use thiserror::Error;
use time::{Duration, OffsetDateTime};

/// Errors of the test PKI.
#[derive(Debug, Error)]
pub enum PkiError {
    /// rcgen refused the certificate.
    #[error("issuing {what}: {source}")]
    Issue {
        /// What was being issued.
        what: String,
        /// rcgen's error.
        source: rcgen::Error,
    },
    /// Key handling failed.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    /// Writing files failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What a leaf certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    /// Subject CN.
    pub common_name: String,
    /// Subject OUs.
    pub organizational_units: Vec<String>,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<IpAddr>,
    /// URI SANs.
    pub uris: Vec<String>,
    /// Email (RFC 822) SANs.
    pub emails: Vec<String>,
    /// Lifetime from now.
    pub validity: Duration,
    /// How far `notBefore` is set in the past, for clock skew (one minute by default).
    pub backdate: Duration,
}

impl LeafSpec {
    /// A service certificate for `common_name` with DNS SANs, valid for a day.
    pub fn service(common_name: &str, dns_names: &[&str]) -> Self {
        Self {
            common_name: common_name.to_owned(),
            organizational_units: Vec::new(),
            dns_names: dns_names.iter().map(|s| (*s).to_owned()).collect(),
            ip_addresses: Vec::new(),
            uris: Vec::new(),
            emails: Vec::new(),
            validity: Duration::days(1),
            backdate: Duration::minutes(1),
        }
    }

    /// Everything a CSR identity asks for.
    pub fn from_identity(identity: &CsrIdentity, validity: Duration) -> Self {
        Self {
            common_name: identity.common_name.clone(),
            organizational_units: identity.organizational_unit.iter().cloned().collect(),
            dns_names: identity.dns_names.clone(),
            ip_addresses: identity.ip_addresses.clone(),
            uris: identity.uris.clone(),
            emails: Vec::new(),
            validity,
            backdate: Duration::minutes(1),
        }
    }

    /// Everything a (verified) CSR asks for.
    pub fn from_csr(csr: &CsrInfo, validity: Duration) -> Self {
        Self {
            common_name: csr.common_name.clone(),
            organizational_units: csr.organizational_units.clone(),
            dns_names: csr.dns_names.clone(),
            ip_addresses: csr.ip_addresses.clone(),
            uris: csr.uris.clone(),
            emails: csr.emails.clone(),
            validity,
            backdate: Duration::minutes(1),
        }
    }
}

/// A certificate issued by a [`CertAuthority`].
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The leaf alone, PEM.
    pub cert_pem: String,
    /// The leaf followed by the issuing intermediates (not the root), PEM.
    pub chain_pem: String,
    /// The private key, PKCS#8 PEM; empty when issued for a CSR (the requester holds the key).
    pub key_pem: Secret,
    /// Serial, lowercase hex without leading zeros.
    pub serial_hex: String,
}

/// Paths of a certificate written to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// Leaf + intermediates.
    pub cert: PathBuf,
    /// Private key (0600).
    pub key: PathBuf,
    /// The root CA that verifies it.
    pub ca: PathBuf,
}

/// A certificate authority: a root, or an intermediate under another authority.
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// This CA's certificate and its parents', up to but excluding the root.
    intermediates_pem: String,
    root_pem: String,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CertAuthority(..)")
    }
}

/// Maps an rcgen error to a [`PkiError`] naming what was being issued.
fn issuing(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |source| PkiError::Issue {
        what: what.to_owned(),
        source,
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    let _ = aws_lc_rs::rand::fill(&mut bytes);
    // positive and without a leading zero byte, as RFC 5280 asks
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from(bytes.to_vec())
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "athenz-k8s-identity test PKI");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(3650);
    params.serial_number = Some(random_serial());
    params
}

/// RFC 5280's first way of naming a CA's key (4.2.1.2): the SHA-1 of its public key's bits, as
/// OpenSSL and most CAs do. Issuers that compute the Authority Key Identifier of what they sign
/// from the CA's public key (Athenz's `Crypto.generateX509Certificate`, through BouncyCastle)
/// then name the same key, and a verifier matching the two (Java's) finds the CA.
fn rfc5280_key_id(key: &KeyPair) -> rcgen::KeyIdMethod {
    let digest = aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
        key.public_key_raw(),
    );
    rcgen::KeyIdMethod::PreSpecified(digest.as_ref().to_vec())
}

impl CertAuthority {
    /// A new self-signed root with a P-256 key.
    pub fn new_root(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(issuing(common_name))?;
        let mut params = ca_params(common_name);
        params.key_identifier_method = rfc5280_key_id(&key);
        let cert = params.self_signed(&key).map_err(issuing(common_name))?;
        let cert_pem = cert.pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            root_pem: cert_pem.clone(),
            cert_pem,
            intermediates_pem: String::new(),
        })
    }

    /// A new intermediate CA signed by this one.
    pub fn new_intermediate(&self, common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(issuing(common_name))?;
        let mut params = ca_params(common_name);
        params.key_identifier_method = rfc5280_key_id(&key);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(issuing(common_name))?;
        let cert_pem = cert.pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            intermediates_pem: format!("{cert_pem}{}", self.intermediates_pem),
            cert_pem,
            root_pem: self.root_pem.clone(),
        })
    }

    /// This CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The root at the top of this CA's chain, PEM (what verifiers trust).
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// This CA's certificate and its parents' up to but excluding the root, PEM.
    pub fn intermediates_pem(&self) -> &str {
        &self.intermediates_pem
    }

    /// Issues a leaf for a freshly generated key.
    pub fn issue(&self, spec: &LeafSpec, alg: KeyAlgorithm) -> Result<IssuedCert, PkiError> {
        let key = PrivateKey::generate(alg)?;
        let mut issued = self.issue_for_key(spec, &key.public_key_der())?;
        issued.key_pem = key.to_pkcs8_pem()?;
        Ok(issued)
    }

    /// Issues a leaf for a public key (DER SubjectPublicKeyInfo), e.g. a CSR's.
    pub fn issue_for_key(
        &self,
        spec: &LeafSpec,
        public_key_der: &[u8],
    ) -> Result<IssuedCert, PkiError> {
        self.issue_for_key_in(spec, None, public_key_der)
    }

    /// Issues a leaf for a freshly generated key whose subject also names an `organization` (O):
    /// Kubernetes reads a client certificate's O as the user's group (`system:masters`,
    /// `system:nodes`), so a cluster's admin and kubelet certificates need one. (One: rcgen keeps
    /// a single value per attribute type.)
    pub fn issue_with_organization(
        &self,
        spec: &LeafSpec,
        organization: &str,
        alg: KeyAlgorithm,
    ) -> Result<IssuedCert, PkiError> {
        let key = PrivateKey::generate(alg)?;
        let mut issued = self.issue_for_key_in(spec, Some(organization), &key.public_key_der())?;
        issued.key_pem = key.to_pkcs8_pem()?;
        Ok(issued)
    }

    /// This CA's private key, PKCS#8 PEM: for a signer that must hold it itself, as
    /// kube-controller-manager does (`--cluster-signing-key-file`).
    pub fn key_pem(&self) -> Secret {
        Secret::new(self.issuer.key().serialize_pem())
    }

    fn issue_for_key_in(
        &self,
        spec: &LeafSpec,
        organization: Option<&str>,
        public_key_der: &[u8],
    ) -> Result<IssuedCert, PkiError> {
        let what = spec.common_name.as_str();
        let public =
            rcgen::SubjectPublicKeyInfo::from_der(public_key_der).map_err(issuing(what))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        if let Some(org) = organization {
            dn.push(DnType::OrganizationName, org);
        }
        dn.push(DnType::CommonName, spec.common_name.as_str());
        for ou in &spec.organizational_units {
            dn.push(DnType::OrganizationalUnitName, ou.as_str());
        }
        params.distinguished_name = dn;
        let ia5 = |s: &str| Ia5String::try_from(s).map_err(issuing(what));
        let mut sans = Vec::new();
        for d in &spec.dns_names {
            sans.push(SanType::DnsName(ia5(d)?));
        }
        for ip in &spec.ip_addresses {
            sans.push(SanType::IpAddress(*ip));
        }
        for u in &spec.uris {
            sans.push(SanType::URI(ia5(u)?));
        }
        for e in &spec.emails {
            sans.push(SanType::Rfc822Name(ia5(e)?));
        }
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - spec.backdate;
        params.not_after = now + spec.validity;
        let serial = random_serial();
        let serial_hex = athenz_core::volume::hex(serial.as_ref())
            .trim_start_matches('0')
            .to_owned();
        params.serial_number = Some(serial);
        let cert = params
            .signed_by(&public, &self.issuer)
            .map_err(issuing(what))?;
        let cert_pem = cert.pem();
        Ok(IssuedCert {
            chain_pem: format!("{cert_pem}{}", self.intermediates_pem),
            cert_pem,
            key_pem: Secret::default(),
            serial_hex,
        })
    }

    /// Issues a service certificate and writes `<name>.cert.pem` (leaf + chain), `<name>.key.pem`
    /// (0600) and `<name>.ca.pem` (the root) into `dir`.
    pub fn write_service_cert(
        &self,
        dir: &Path,
        name: &str,
        spec: &LeafSpec,
    ) -> Result<CertFiles, PkiError> {
        let issued = self.issue(spec, KeyAlgorithm::P256)?;
        let files = CertFiles {
            cert: dir.join(format!("{name}.cert.pem")),
            key: dir.join(format!("{name}.key.pem")),
            ca: dir.join(format!("{name}.ca.pem")),
        };
        write_file(&files.cert, issued.chain_pem.as_bytes(), 0o644)?;
        write_file(&files.key, issued.key_pem.expose().as_bytes(), 0o600)?;
        write_file(&files.ca, self.root_pem.as_bytes(), 0o644)?;
        Ok(files)
    }
}

/// A self-signed certificate for `common_name` over the key in `key_pem` that expired long
/// ago (2024-01-01 to 01-02): what a pod holds after being cut off longer than its certificate
/// lived, for tests of what happens next.
pub fn expired_self_signed(key_pem: &str, common_name: &str) -> Result<String, PkiError> {
    let key = rcgen::KeyPair::from_pem(key_pem).map_err(issuing("reading the key"))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(issuing("an expired certificate"))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2024, 1, 2);
    Ok(params
        .self_signed(&key)
        .map_err(issuing("an expired certificate"))?
        .pem())
}

/// Writes a file atomically with `mode`.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    athenz_core::volume::write_file_atomic(path, bytes, mode).map_err(|e| PkiError::Io {
        path: path.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::crypto::{CertInfo, key_matches_cert};

    #[test]
    fn root_intermediate_leaf() {
        let root = CertAuthority::new_root("Test Root").unwrap();
        let inter = root.new_intermediate("Test Intermediate").unwrap();
        let leaf = inter
            .issue(
                &LeafSpec::service("k8s.admin.zts", &["zts.example"]),
                KeyAlgorithm::P256,
            )
            .unwrap();
        let info = CertInfo::from_pem(&leaf.chain_pem).unwrap();
        assert_eq!(info.common_name, "k8s.admin.zts");
        assert_eq!(info.dns_names, ["zts.example"]);
        assert_eq!(info.serial_hex, leaf.serial_hex);
        assert!(info.issuer.contains("Test Intermediate"), "{}", info.issuer);
        assert!(!info.is_ca);
        assert!(!info.is_self_issued());
        assert!(
            CertInfo::from_pem(root.root_pem())
                .unwrap()
                .is_self_issued()
        );
        let key = PrivateKey::from_pem(leaf.key_pem.expose()).unwrap();
        assert!(key_matches_cert(&key, &info));
        let chain = athenz_core::crypto::pem_certificates(&leaf.chain_pem).unwrap();
        assert_eq!(chain.len(), 2, "leaf + intermediate");
        assert!(CertInfo::from_pem(root.root_pem()).unwrap().is_ca);
        assert_eq!(inter.root_pem(), root.cert_pem());
    }
}
