//! CSRs: the one this system builds for an identity, and the reading of one it receives (the
//! agent checks a pod-made CSR, the dev ZTS every CSR), with what its subject and key are.

use super::{CryptoError, MAX_PEM_LEN, PrivateKey, Sans, first_cn, ous, read_sans};
use crate::names::CsrIdentity;
use rcgen::{CertificateParams, DistinguishedName, DnType, SanType, string::Ia5String};
use rustls_pki_types::CertificateSigningRequestDer;
use rustls_pki_types::pem::PemObject;
use std::fmt;
use std::net::IpAddr;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer, X509Name};
use x509_parser::x509::SubjectPublicKeyInfo;

/// Builds a PEM CSR for `identity`, signed by `key`.
pub fn build_csr(identity: &CsrIdentity, key: &PrivateKey) -> Result<String, CryptoError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, identity.common_name.as_str());
    if let Some(ou) = &identity.organizational_unit {
        dn.push(DnType::OrganizationalUnitName, ou.as_str());
    }
    params.distinguished_name = dn;
    let ia5 = |s: &str| {
        Ia5String::try_from(s).map_err(|e| CryptoError::CsrBuild(format!("SAN {s:?}: {e}")))
    };
    let mut sans = Vec::new();
    for dns in &identity.dns_names {
        sans.push(SanType::DnsName(ia5(dns)?));
    }
    for ip in &identity.ip_addresses {
        sans.push(SanType::IpAddress(*ip));
    }
    for uri in &identity.uris {
        sans.push(SanType::URI(ia5(uri)?));
    }
    params.subject_alt_names = sans;
    params
        .serialize_request(&key.pair)
        .and_then(|csr| csr.pem())
        .map_err(|e| CryptoError::CsrBuild(e.to_string()))
}

/// What a CSR asks for, after its signature has been checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrInfo {
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
    /// Email (rfc822Name) SANs: Athenz role-certificate CSRs may name the principal as
    /// `<principal>@<suffix>` (certificates never carry one here and refuse it).
    pub emails: Vec<String>,
    /// Public key as DER SubjectPublicKeyInfo.
    pub public_key_der: Vec<u8>,
    /// Every subject attribute, in order, as `<short name or OID>=<value>` (so a check can say
    /// exactly what a subject holds beyond CN and OU).
    pub subject_attributes: Vec<String>,
    /// The CSR itself, DER.
    pub der: Vec<u8>,
}

impl CsrInfo {
    /// Reads a PEM CSR and verifies its self-signature.
    pub fn from_pem(pem: &str) -> Result<Self, CryptoError> {
        if pem.len() > MAX_PEM_LEN {
            return Err(CryptoError::BadCsr(format!(
                "PEM is larger than {MAX_PEM_LEN} bytes"
            )));
        }
        let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| CryptoError::BadCsr(format!("no CERTIFICATE REQUEST PEM block ({e})")))?;
        Self::from_der(der.as_ref())
    }

    /// Reads a DER CSR and verifies its self-signature.
    pub fn from_der(der: &[u8]) -> Result<Self, CryptoError> {
        let (rest, csr) = X509CertificationRequest::from_der(der)
            .map_err(|e| CryptoError::BadCsr(format!("not valid DER PKCS#10: {e}")))?;
        if !rest.is_empty() {
            return Err(CryptoError::BadCsr("trailing bytes after the CSR".into()));
        }
        let info = &csr.certification_request_info;
        // an RSA key under 2048 bits cannot be verified at all: say that, not "bad signature"
        if let Ok(KeyType::Rsa { bits }) = public_key_type(info.subject_pki.raw)
            && bits < 2048
        {
            return Err(CryptoError::BadCsr(format!(
                "key RSA-{bits} is too weak: RSA keys need at least 2048 bits"
            )));
        }
        csr.verify_signature()
            .map_err(|e| CryptoError::BadCsr(format!("signature does not verify: {e}")))?;
        let names = match csr.requested_extensions() {
            Some(exts) => read_sans(exts).map_err(CryptoError::BadCsr)?,
            None => Sans::default(),
        };
        Ok(Self {
            common_name: first_cn(&info.subject),
            organizational_units: ous(&info.subject),
            dns_names: names.dns,
            ip_addresses: names.ips,
            uris: names.uris,
            emails: names.emails,
            public_key_der: info.subject_pki.raw.to_vec(),
            subject_attributes: subject_attributes(&info.subject),
            der: der.to_vec(),
        })
    }
}

fn subject_attributes(name: &X509Name<'_>) -> Vec<String> {
    use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATIONAL_UNIT};
    name.iter_attributes()
        .map(|attr| {
            let oid = attr.attr_type();
            let label = if *oid == OID_X509_COMMON_NAME {
                "CN".to_owned()
            } else if *oid == OID_X509_ORGANIZATIONAL_UNIT {
                "OU".to_owned()
            } else {
                oid.to_id_string()
            };
            let value = attr.as_str().unwrap_or("<not a string>");
            format!("{label}={value}")
        })
        .collect()
}

/// A public key's algorithm and size, as a CSR check names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyType {
    /// EC on the P-256 curve.
    EcP256,
    /// RSA of `bits` modulus bits.
    Rsa {
        /// Modulus size.
        bits: usize,
    },
    /// Anything else, described.
    Other(String),
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EcP256 => f.write_str("EC P-256"),
            Self::Rsa { bits } => write!(f, "RSA-{bits}"),
            Self::Other(what) => f.write_str(what),
        }
    }
}

/// The algorithm and size of a DER SubjectPublicKeyInfo.
pub fn public_key_type(spki_der: &[u8]) -> Result<KeyType, CryptoError> {
    use x509_parser::public_key::PublicKey as Parsed;
    let (_, spki) = SubjectPublicKeyInfo::from_der(spki_der)
        .map_err(|e| CryptoError::BadPublicKey(format!("not valid DER: {e}")))?;
    let parsed = spki
        .parsed()
        .map_err(|e| CryptoError::BadPublicKey(format!("unreadable key: {e}")))?;
    Ok(match parsed {
        Parsed::RSA(rsa) => KeyType::Rsa {
            bits: rsa.key_size(),
        },
        Parsed::EC(_) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            match curve {
                Some(c) if c == x509_parser::oid_registry::OID_EC_P256 => KeyType::EcP256,
                Some(c) => KeyType::Other(format!("EC on curve {}", c.to_id_string())),
                None => KeyType::Other("EC without a named curve".into()),
            }
        }
        _ => KeyType::Other(format!("a {} key", spki.algorithm.algorithm.to_id_string())),
    })
}
