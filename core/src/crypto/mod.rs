//! Keys, CSRs and certificates.
//!
//! Keys and CSRs are made with rcgen (aws-lc-rs underneath); certificates and CSRs are read with
//! x509-parser, which — unlike rcgen's parser — accepts every extension a real CA puts in.

use crate::secret::Secret;
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, SigningKey};
use rustls_pki_types::pem::{PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use thiserror::Error;

mod csr;
pub use csr::{CsrInfo, KeyType, build_csr, public_key_type};
use time::OffsetDateTime;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::{FromDer, X509Certificate, X509Name};
use x509_parser::x509::SubjectPublicKeyInfo;

/// Largest PEM text accepted (a leaf plus a long chain fits in a few KiB).
pub const MAX_PEM_LEN: usize = 64 * 1024;

/// Errors of key, CSR and certificate handling.
#[derive(Debug, Error)]
pub enum CryptoError {
    /// Key generation failed.
    #[error("generating a {0} key failed")]
    KeyGeneration(KeyAlgorithm),
    /// The private key could not be read.
    #[error("private key: {0}")]
    BadKey(String),
    /// The key cannot do what was asked.
    #[error("private key: {0}")]
    UnsupportedKey(&'static str),
    /// The CSR could not be built.
    #[error("building the CSR failed: {0}")]
    CsrBuild(String),
    /// A certificate could not be read.
    #[error("certificate: {0}")]
    BadCertificate(String),
    /// A CSR could not be read or its signature is wrong.
    #[error("CSR: {0}")]
    BadCsr(String),
    /// A public key could not be read.
    #[error("public key: {0}")]
    BadPublicKey(String),
    /// Signing failed.
    #[error("signing failed")]
    Signing,
}

/// Which key the agent generates for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyAlgorithm {
    /// EC P-256 with ECDSA-SHA256: fast to generate (~16 µs), the default.
    #[default]
    P256,
    /// RSA-2048 with PKCS#1 v1.5 SHA-256, for consumers that cannot use EC (~50 ms to generate).
    Rsa2048,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::P256 => "p256",
            Self::Rsa2048 => "rsa2048",
        })
    }
}

impl FromStr for KeyAlgorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "p256" => Ok(Self::P256),
            "rsa2048" => Ok(Self::Rsa2048),
            other => Err(format!(
                "unknown key algorithm {other:?}: use p256 or rsa2048"
            )),
        }
    }
}

/// A private key that can sign CSRs and ntokens with SHA-256.
pub struct PrivateKey {
    pair: KeyPair,
    /// Whether `pair` holds PKCS#8 DER (generated keys and `BEGIN PRIVATE KEY` PEM do).
    pkcs8: bool,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey({})", self.kind())
    }
}

/// The family of a key, as needed to pick a signature algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// EC P-256.
    EcP256,
    /// RSA of any size.
    Rsa,
    /// Anything else (P-384, Ed25519, ...): cannot sign with SHA-256 here.
    Other,
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EcP256 => "EC P-256",
            Self::Rsa => "RSA",
            Self::Other => "unsupported algorithm",
        })
    }
}

impl PrivateKey {
    /// Generates a fresh key.
    pub fn generate(alg: KeyAlgorithm) -> Result<Self, CryptoError> {
        let sig_alg = match alg {
            KeyAlgorithm::P256 => &PKCS_ECDSA_P256_SHA256,
            KeyAlgorithm::Rsa2048 => &PKCS_RSA_SHA256,
        };
        let pair = KeyPair::generate_for(sig_alg).map_err(|_| CryptoError::KeyGeneration(alg))?;
        Ok(Self { pair, pkcs8: true })
    }

    /// Reads a PEM private key: PKCS#8 (`PRIVATE KEY`), SEC1 (`EC PRIVATE KEY`) or PKCS#1
    /// (`RSA PRIVATE KEY`). Encrypted keys and other block types are refused.
    pub fn from_pem(pem: &str) -> Result<Self, CryptoError> {
        if pem.len() > MAX_PEM_LEN {
            return Err(CryptoError::BadKey(format!(
                "PEM is larger than {MAX_PEM_LEN} bytes"
            )));
        }
        let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| {
            CryptoError::BadKey(format!("no PKCS#8, SEC1 or PKCS#1 PEM block found ({e})"))
        })?;
        let pkcs8 = matches!(der, PrivateKeyDer::Pkcs8(_));
        let pair = KeyPair::try_from(&der)
            .map_err(|e| CryptoError::BadKey(format!("cannot be parsed: {e}")))?;
        Ok(Self { pair, pkcs8 })
    }

    /// The key as PKCS#8 PEM, e.g. to hand to a pod. Only for keys that are PKCS#8 already.
    pub fn to_pkcs8_pem(&self) -> Result<Secret, CryptoError> {
        if !self.pkcs8 {
            return Err(CryptoError::UnsupportedKey(
                "only PKCS#8 keys are re-encoded; this one was read as SEC1 or PKCS#1",
            ));
        }
        Ok(Secret::new(self.pair.serialize_pem()))
    }

    /// The public key as DER SubjectPublicKeyInfo.
    pub fn public_key_der(&self) -> Vec<u8> {
        use rcgen::PublicKeyData;
        self.pair.subject_public_key_info()
    }

    /// The key's family.
    pub fn kind(&self) -> KeyKind {
        let alg = self.pair.algorithm();
        if alg == &PKCS_ECDSA_P256_SHA256 {
            KeyKind::EcP256
        } else if alg == &PKCS_RSA_SHA256 {
            KeyKind::Rsa
        } else {
            KeyKind::Other
        }
    }

    /// Signs `msg` with SHA-256: RSA PKCS#1 v1.5, or ECDSA P-256 with a DER signature (what Java's
    /// `SHA256withRSA` / `SHA256withECDSA` produce, as Athenz expects).
    pub fn sign_sha256(&self, msg: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if self.kind() == KeyKind::Other {
            return Err(CryptoError::UnsupportedKey(
                "only RSA and EC P-256 keys sign with SHA-256",
            ));
        }
        self.pair.sign(msg).map_err(|_| CryptoError::Signing)
    }

    /// The rcgen key pair, for issuing certificates in the dev CA.
    pub fn key_pair(&self) -> &KeyPair {
        &self.pair
    }
}

/// What a certificate says, as the parts of this system need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject CN (empty if none).
    pub common_name: String,
    /// Subject OUs.
    pub organizational_units: Vec<String>,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<IpAddr>,
    /// URI SANs.
    pub uris: Vec<String>,
    /// Serial number, lowercase hex without leading zeros.
    pub serial_hex: String,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// Issuer distinguished name, RFC 4514 text.
    pub issuer: String,
    /// Subject distinguished name, RFC 4514 text.
    pub subject: String,
    /// Whether the certificate is a CA (basicConstraints cA).
    pub is_ca: bool,
    /// Public key as DER SubjectPublicKeyInfo.
    pub public_key_der: Vec<u8>,
}

impl CertInfo {
    /// Reads one DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CryptoError> {
        let (rest, cert) = X509Certificate::from_der(der)
            .map_err(|e| CryptoError::BadCertificate(format!("not valid DER X.509: {e}")))?;
        if !rest.is_empty() {
            return Err(CryptoError::BadCertificate(
                "trailing bytes after the certificate".into(),
            ));
        }
        let names = read_sans(cert.extensions().iter().map(|ext| ext.parsed_extension()))
            .map_err(CryptoError::BadCertificate)?;
        if let Some(email) = names.emails.first() {
            // no certificate of this system carries one: an identity is its DNS, IP and URI names
            return Err(CryptoError::BadCertificate(format!(
                "unsupported SAN type email {email:?}"
            )));
        }
        let validity = cert.validity();
        Ok(Self {
            common_name: first_cn(cert.subject()),
            organizational_units: ous(cert.subject()),
            dns_names: names.dns,
            ip_addresses: names.ips,
            uris: names.uris,
            serial_hex: cert.tbs_certificate.serial.to_str_radix(16),
            not_before: validity.not_before.to_datetime(),
            not_after: validity.not_after.to_datetime(),
            issuer: cert.issuer().to_string(),
            subject: cert.subject().to_string(),
            is_ca: cert.is_ca(),
            public_key_der: cert.public_key().raw.to_vec(),
        })
    }

    /// Reads the first certificate of a PEM text (the leaf of a chain).
    pub fn from_pem(pem: &str) -> Result<Self, CryptoError> {
        let chain = pem_certificates(pem)?;
        let leaf = chain
            .first()
            .ok_or_else(|| CryptoError::BadCertificate("no certificate in the PEM".into()))?;
        Self::from_der(leaf)
    }

    /// Whether the certificate names itself as its issuer (a root).
    pub fn is_self_issued(&self) -> bool {
        self.subject == self.issuer
    }

    /// Whether the certificate is valid at `now`.
    pub fn is_valid_at(&self, now: OffsetDateTime) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

/// Every `CERTIFICATE` block of a PEM text, in order. Refuses texts with no certificate, over
/// [`MAX_PEM_LEN`], or holding a block of another kind (a key pasted into a chain is a mistake to
/// report, not to skip).
pub fn pem_certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, CryptoError> {
    if pem.len() > MAX_PEM_LEN {
        return Err(CryptoError::BadCertificate(format!(
            "PEM is larger than {MAX_PEM_LEN} bytes"
        )));
    }
    let mut certs = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        let (kind, der) =
            item.map_err(|e| CryptoError::BadCertificate(format!("malformed PEM: {e}")))?;
        if kind != SectionKind::Certificate {
            return Err(CryptoError::BadCertificate(format!(
                "unexpected PEM block {kind:?} among certificates"
            )));
        }
        certs.push(CertificateDer::from(der));
    }
    if certs.is_empty() {
        return Err(CryptoError::BadCertificate(
            "no CERTIFICATE block in the PEM".into(),
        ));
    }
    Ok(certs)
}

/// A DER certificate as PEM (`CERTIFICATE`, 64-column base64).
pub fn der_to_pem(der: &[u8]) -> String {
    der_to_pem_labelled(der, "CERTIFICATE")
}

/// DER as PEM with the block label `label` (e.g. `CERTIFICATE REQUEST`), 64-column base64.
pub fn der_to_pem_labelled(der: &[u8], label: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The leaf followed by the certificates of `bundle_pem` that are not roots: the chain a TLS peer
/// sends (roots belong in trust stores, not chains). An empty bundle gives the leaf alone.
pub fn leaf_with_chain(leaf_pem: &str, bundle_pem: &str) -> Result<String, CryptoError> {
    let mut out = format!("{}\n", leaf_pem.trim_end());
    if bundle_pem.trim().is_empty() {
        return Ok(out);
    }
    for der in pem_certificates(bundle_pem)? {
        if !CertInfo::from_der(&der)?.is_self_issued() {
            out.push_str(&der_to_pem(&der));
        }
    }
    Ok(out)
}

/// Whether `key` is the private half of `cert`'s public key.
pub fn key_matches_cert(key: &PrivateKey, cert: &CertInfo) -> bool {
    key.public_key_der() == cert.public_key_der
}

/// A public key that verifies SHA-256 signatures (ntokens).
#[derive(Clone)]
pub struct PublicKey {
    kind: KeyKind,
    /// The key bits inside the SubjectPublicKeyInfo: an EC point or a PKCS#1 RSAPublicKey.
    bits: Vec<u8>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.kind)
    }
}

impl PublicKey {
    /// Reads a `PUBLIC KEY` (SubjectPublicKeyInfo) PEM.
    pub fn from_pem(pem: &str) -> Result<Self, CryptoError> {
        if pem.len() > MAX_PEM_LEN {
            return Err(CryptoError::BadPublicKey("PEM is too large".into()));
        }
        let der = rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| CryptoError::BadPublicKey(format!("no PUBLIC KEY PEM block ({e})")))?;
        Self::from_spki_der(der.as_ref())
    }

    /// Reads a DER SubjectPublicKeyInfo.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, CryptoError> {
        use x509_parser::public_key::{ECPoint, PublicKey as Parsed};
        let (_, spki) = SubjectPublicKeyInfo::from_der(der)
            .map_err(|e| CryptoError::BadPublicKey(format!("not valid DER: {e}")))?;
        let parsed = spki
            .parsed()
            .map_err(|e| CryptoError::BadPublicKey(format!("unreadable key: {e}")))?;
        let kind = match parsed {
            Parsed::RSA(_) => KeyKind::Rsa,
            Parsed::EC(ECPoint { .. }) => {
                let curve = spki
                    .algorithm
                    .parameters
                    .as_ref()
                    .and_then(|p| p.as_oid().ok());
                if curve == Some(x509_parser::oid_registry::OID_EC_P256) {
                    KeyKind::EcP256
                } else {
                    return Err(CryptoError::BadPublicKey(
                        "only the P-256 curve is supported".into(),
                    ));
                }
            }
            _ => {
                return Err(CryptoError::BadPublicKey(
                    "only RSA and EC P-256 keys are supported".into(),
                ));
            }
        };
        Ok(Self {
            kind,
            bits: spki.subject_public_key.data.to_vec(),
        })
    }

    /// The key's family.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// Whether `other` is the same public key.
    pub fn same_key(&self, other: &PublicKey) -> bool {
        self.kind == other.kind && self.bits == other.bits
    }

    /// Verifies a SHA-256 signature made by [`PrivateKey::sign_sha256`].
    pub fn verify_sha256(&self, msg: &[u8], signature: &[u8]) -> bool {
        use aws_lc_rs::signature::{
            ECDSA_P256_SHA256_ASN1, RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey,
        };
        match self.kind {
            KeyKind::EcP256 => UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.bits)
                .verify(msg, signature)
                .is_ok(),
            KeyKind::Rsa => UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &self.bits)
                .verify(msg, signature)
                .is_ok(),
            KeyKind::Other => false,
        }
    }
}

#[derive(Default)]
pub(super) struct Sans {
    dns: Vec<String>,
    ips: Vec<IpAddr>,
    uris: Vec<String>,
    emails: Vec<String>,
}

fn read_sans<'a>(exts: impl Iterator<Item = &'a ParsedExtension<'a>>) -> Result<Sans, String> {
    let mut sans = Sans::default();
    let mut seen = false;
    for ext in exts {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            if seen {
                return Err("more than one subjectAltName extension".into());
            }
            seen = true;
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => sans.dns.push((*d).to_owned()),
                    GeneralName::URI(u) => sans.uris.push((*u).to_owned()),
                    GeneralName::RFC822Name(e) => sans.emails.push((*e).to_owned()),
                    GeneralName::IPAddress(bytes) => sans.ips.push(ip_from_bytes(bytes)?),
                    other => return Err(format!("unsupported SAN type {other}")),
                }
            }
        }
    }
    Ok(sans)
}

fn ip_from_bytes(bytes: &[u8]) -> Result<IpAddr, String> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        Ok(IpAddr::from(v4))
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        Ok(IpAddr::from(v6))
    } else {
        Err(format!("IP SAN of {} bytes", bytes.len()))
    }
}

fn first_cn(name: &X509Name<'_>) -> String {
    name.iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn ous(name: &X509Name<'_>) -> Vec<String> {
    name.iter_organizational_unit()
        .filter_map(|ou| ou.as_str().ok())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{CsrIdentity, PodIdentityInput};
    use rcgen::{CertificateParams, DnType};
    use rustls_pki_types::CertificateSigningRequestDer;

    pub(crate) fn pod_identity() -> CsrIdentity {
        CsrIdentity::for_pod(&PodIdentityInput {
            domain: "media.sports",
            service: "web",
            provider: "k8s.admin.athenz-callback",
            dns_suffix: "athenz.cloud",
            instance_id: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            pod_ip: Some("10.1.2.3".parse().unwrap()),
            service_ip: Some("fd00::10".parse().unwrap()),
        })
        .unwrap()
    }

    fn self_signed(key: &PrivateKey, id: &CsrIdentity) -> String {
        let mut params = CertificateParams::new(id.dns_names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, id.common_name.as_str());
        params.not_before = OffsetDateTime::now_utc() - time::Duration::minutes(1);
        params.not_after = OffsetDateTime::now_utc() + time::Duration::hours(1);
        params.self_signed(key.key_pair()).unwrap().pem()
    }

    #[test]
    fn csr_round_trips_through_our_reader() {
        for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
            let key = PrivateKey::generate(alg).unwrap();
            let id = pod_identity();
            let pem = build_csr(&id, &key).unwrap();
            let csr = CsrInfo::from_pem(&pem).unwrap();
            assert_eq!(csr.common_name, id.common_name);
            assert_eq!(csr.organizational_units, ["k8s.admin.athenz-callback"]);
            assert_eq!(csr.dns_names, id.dns_names);
            assert_eq!(csr.ip_addresses, id.ip_addresses);
            assert_eq!(csr.uris, id.uris);
            assert_eq!(csr.public_key_der, key.public_key_der());
            assert_eq!(
                csr.subject_attributes,
                [
                    format!("CN={}", id.common_name),
                    "OU=k8s.admin.athenz-callback".to_owned()
                ]
            );
            let expected = match alg {
                KeyAlgorithm::P256 => KeyType::EcP256,
                KeyAlgorithm::Rsa2048 => KeyType::Rsa { bits: 2048 },
            };
            assert_eq!(public_key_type(&csr.public_key_der).unwrap(), expected);
        }
        let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let kind = public_key_type(&rcgen::PublicKeyData::subject_public_key_info(&p384)).unwrap();
        assert!(
            matches!(&kind, KeyType::Other(w) if w.contains("1.3.132.0.34")),
            "{kind}"
        );
        assert!(public_key_type(b"garbage").is_err());
    }

    #[test]
    fn tampered_csr_fails_signature() {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let pem = build_csr(&pod_identity(), &key).unwrap();
        let mut der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec();
        // flip a byte inside the CN "media.sports.web"
        let at = der
            .windows(5)
            .position(|w| w == b"media")
            .expect("CN in the DER");
        der[at] = b'M';
        let err = CsrInfo::from_der(&der).unwrap_err();
        assert!(err.to_string().contains("signature"), "{err}");
    }

    #[test]
    fn garbage_csrs_are_refused() {
        for bad in [
            "",
            "not pem",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        ] {
            assert!(CsrInfo::from_pem(bad).is_err(), "{bad:?}");
        }
        assert!(CsrInfo::from_pem(&"A".repeat(MAX_PEM_LEN + 1)).is_err());
    }

    #[test]
    fn keys_round_trip_as_pkcs8() {
        for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
            let key = PrivateKey::generate(alg).unwrap();
            let pem = key.to_pkcs8_pem().unwrap();
            assert!(pem.expose().starts_with("-----BEGIN PRIVATE KEY-----"));
            let back = PrivateKey::from_pem(pem.expose()).unwrap();
            assert_eq!(back.public_key_der(), key.public_key_der());
            assert_eq!(back.kind(), key.kind());
        }
    }

    #[test]
    fn bad_keys_are_refused() {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let pem = key.to_pkcs8_pem().unwrap();
        let truncated = &pem.expose()[..pem.expose().len() / 2];
        let cert = self_signed(&key, &pod_identity());
        for bad in ["", "garbage", truncated, cert.as_str()] {
            assert!(PrivateKey::from_pem(bad).is_err(), "{bad:?}");
        }
        let wrong_body = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(PrivateKey::from_pem(wrong_body).is_err());
    }

    #[test]
    fn certificate_reading_and_key_match() {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let other = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let id = pod_identity();
        let pem = self_signed(&key, &id);
        let info = CertInfo::from_pem(&pem).unwrap();
        assert_eq!(info.common_name, "media.sports.web");
        assert_eq!(info.dns_names, id.dns_names);
        assert!(info.is_valid_at(OffsetDateTime::now_utc()));
        assert!(!info.is_valid_at(OffsetDateTime::now_utc() + time::Duration::hours(2)));
        assert!(!info.serial_hex.is_empty());
        assert!(!info.serial_hex.starts_with('0'), "{}", info.serial_hex);
        assert!(info.issuer.contains("media.sports.web"), "{}", info.issuer);
        assert!(info.is_self_issued(), "{} / {}", info.subject, info.issuer);
        assert!(key_matches_cert(&key, &info));
        assert!(!key_matches_cert(&other, &info));
    }

    #[test]
    fn der_to_pem_round_trips() {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let pem = self_signed(&key, &pod_identity());
        let der = pem_certificates(&pem).unwrap().remove(0);
        let back = der_to_pem(&der);
        assert_eq!(pem_certificates(&back).unwrap()[0], der);
        assert!(
            back.lines()
                .all(|l| l.len() <= 64 || l.starts_with("-----"))
        );
    }

    #[test]
    fn leaf_with_chain_drops_roots() {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let root = self_signed(&key, &pod_identity());
        let leaf = "-----BEGIN CERTIFICATE-----\nleaf\n-----END CERTIFICATE-----";
        assert_eq!(leaf_with_chain(leaf, "").unwrap(), format!("{leaf}\n"));
        // a self-issued certificate in the bundle is a root: left out
        assert_eq!(leaf_with_chain(leaf, &root).unwrap(), format!("{leaf}\n"));
        assert!(leaf_with_chain(leaf, "garbage").is_err());
    }

    #[test]
    fn chains_and_bad_certificates() {
        let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let leaf = self_signed(&key, &pod_identity());
        let chain = format!("{leaf}{leaf}");
        assert_eq!(pem_certificates(&chain).unwrap().len(), 2);
        let with_key = format!("{leaf}{}", key.to_pkcs8_pem().unwrap().expose());
        let err = pem_certificates(&with_key).unwrap_err();
        assert!(err.to_string().contains("unexpected PEM block"), "{err}");
        let truncated = &leaf[..leaf.len() - 40];
        for bad in ["", "junk", truncated] {
            assert!(CertInfo::from_pem(bad).is_err(), "{bad:?}");
        }
        let wrong_body = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(CertInfo::from_pem(wrong_body).is_err());
    }

    #[test]
    fn sha256_signatures_verify_with_the_public_key() {
        for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
            let key = PrivateKey::generate(alg).unwrap();
            let public = PublicKey::from_spki_der(&key.public_key_der()).unwrap();
            let sig = key.sign_sha256(b"message").unwrap();
            assert!(public.verify_sha256(b"message", &sig));
            assert!(!public.verify_sha256(b"messagf", &sig));
            let pem = key.key_pair().public_key_pem();
            assert!(
                PublicKey::from_pem(&pem)
                    .unwrap()
                    .verify_sha256(b"message", &sig)
            );
        }
    }

    #[test]
    fn key_algorithm_names() {
        assert_eq!("p256".parse::<KeyAlgorithm>().unwrap(), KeyAlgorithm::P256);
        assert_eq!(
            "rsa2048".parse::<KeyAlgorithm>().unwrap(),
            KeyAlgorithm::Rsa2048
        );
        assert!("ed25519".parse::<KeyAlgorithm>().is_err());
    }
}
