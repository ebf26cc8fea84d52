//! What a pod got: the files its SIA wrote, checked (the key belongs to the certificate, the chain
//! verifies to the CA bundle as a client certificate, the modes are right) and described.

use anyhow::{Context, bail};
use athenz_core::crypto::{CertInfo, PrivateKey, key_matches_cert, pem_certificates};
use rustls_pki_types::UnixTime;
use serde::Serialize;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A pod's identity as its files show it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct IdentityReport {
    /// Subject CN: `<domain>.<service>`.
    pub common_name: String,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<String>,
    /// URI SANs.
    pub uris: Vec<String>,
    /// Serial, hex.
    pub serial: String,
    /// Expiry, RFC 3339.
    pub not_after: String,
    /// The chain's subjects, leaf first, ending at the root that verified it.
    pub chain: Vec<String>,
    /// The ntoken's principal.
    pub ntoken_principal: String,
}

/// Reads and checks the credential set in `dir` against the CA bundle it came with.
pub fn check(dir: &Path) -> anyhow::Result<IdentityReport> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .with_context(|| format!("reading {}/{name}", dir.display()))
    };
    let key_pem = read("service.key.pem")?;
    let cert_pem = read("service.cert.pem")?;
    let ca_pem = read("ca.cert.pem")?;
    let ntoken = read("ntoken")?;

    let key_mode = std::fs::metadata(dir.join("service.key.pem"))
        .context("reading the key's mode")?
        .permissions()
        .mode()
        & 0o777;
    if key_mode & 0o007 != 0 {
        bail!("the key is readable by others (mode {key_mode:o})");
    }
    let key = PrivateKey::from_pem(&key_pem).context("the key file")?;
    let leaf = CertInfo::from_pem(&cert_pem).context("the certificate file")?;
    if !key_matches_cert(&key, &leaf) {
        bail!("the key does not belong to the certificate");
    }

    let chain = pem_certificates(&cert_pem).context("the certificate chain")?;
    let roots = pem_certificates(&ca_pem).context("the CA bundle")?;
    let (end_entity, intermediates) = chain.split_first().context("an empty chain")?;
    let root_store = athenz_core::tls::root_store(&roots).context("the CA bundle")?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        root_store,
        athenz_core::tls::provider(),
    )
    .build()
    .context("building a verifier")?;
    verifier
        .verify_client_cert(end_entity, intermediates, UnixTime::now())
        .map_err(|e| anyhow::anyhow!("the chain does not verify to the CA bundle: {e}"))?;
    let mut subjects = Vec::new();
    for der in &chain {
        subjects.push(CertInfo::from_der(der)?.subject);
    }
    let last_issuer = CertInfo::from_der(chain.last().unwrap_or(end_entity))?.issuer;
    subjects.push(last_issuer);

    let token = athenz_core::ntoken::NToken::parse(ntoken.trim()).context("the ntoken")?;
    Ok(IdentityReport {
        common_name: leaf.common_name.clone(),
        dns_names: leaf.dns_names.clone(),
        ip_addresses: leaf.ip_addresses.iter().map(ToString::to_string).collect(),
        uris: leaf.uris.clone(),
        serial: leaf.serial_hex.clone(),
        not_after: leaf
            .not_after
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        chain: subjects,
        ntoken_principal: token.principal(),
    })
}
