//! The dev ZTS's two CA generations, for a rotation of ZTS's CA (docs/design.md §6): it starts
//! serving and signing under the first; [`CaGenerations::rotate`] moves both its serving
//! certificate and its signer to the next, as an operator moves a real ZTS to a new CA once every
//! client trusts both. The next root is written at start (`next-ca.pem` beside `ca.pem`) so a
//! test can add it to the bundles before the move. ZTS trusts client certificates of both
//! generations throughout, as a ZTS in the middle of a rotation must.

use crate::pki::{CertAuthority, LeafSpec, PkiError};
use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_core::tls::{ReloadOutcome, ReloadingIdentity};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The next generation's root, written beside `ca.pem` at start.
pub const NEXT_CA_FILE: &str = "next-ca.pem";

/// One CA: its signer, the bundle returned with what it signs, ZTS's certificate under it.
struct Generation {
    signer: CertAuthority,
    bundle: String,
    serving_chain: String,
    serving_key: String,
}

impl Generation {
    fn new(name: &str, principal: &str, ip_addresses: &[IpAddr]) -> Result<Self, PkiError> {
        let root = CertAuthority::new_root(&format!("Athenz Dev ZTS {name}Root"))?;
        let signer = root.new_intermediate(&format!("Athenz Dev ZTS {name}Intermediate"))?;
        let key = PrivateKey::generate(KeyAlgorithm::P256)?;
        let own = signer.issue_for_key(
            &LeafSpec {
                ip_addresses: ip_addresses.to_vec(),
                ..LeafSpec::service(principal, &["localhost"])
            },
            &key.public_key_der(),
        )?;
        Ok(Self {
            bundle: format!("{}{}", signer.intermediates_pem(), signer.root_pem()),
            signer,
            serving_chain: own.chain_pem,
            serving_key: key.to_pkcs8_pem()?.expose().to_owned(),
        })
    }
}

/// The first and next CA, which one serves and signs now, and ZTS's serving identity.
pub struct CaGenerations {
    first: Generation,
    next: Generation,
    rotated: AtomicBool,
    serving: Arc<ReloadingIdentity>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

/// Why the CAs could not be made or moved.
#[derive(Debug, thiserror::Error)]
pub enum CaRotationError {
    /// Making a CA or a certificate failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// Writing or loading ZTS's own certificate failed.
    #[error(transparent)]
    Tls(#[from] athenz_core::tls::TlsError),
    /// ZTS's new certificate was written but not taken.
    #[error("ZTS's certificate under the next CA was not taken: {0}")]
    NotTaken(String),
}

impl CaGenerations {
    /// Makes both generations, writes `ca.pem` and [`NEXT_CA_FILE`] (the roots) and ZTS's own
    /// pair under the first (`zts.cert.pem`, `zts.key.pem`) in `dir`.
    pub fn create(
        dir: &Path,
        principal: &str,
        ip_addresses: &[IpAddr],
    ) -> Result<Self, CaRotationError> {
        let first = Generation::new("", principal, ip_addresses)?;
        let next = Generation::new("Next ", principal, ip_addresses)?;
        let cert_path = dir.join("zts.cert.pem");
        let key_path = dir.join("zts.key.pem");
        write_pair(&cert_path, &key_path, &first)?;
        crate::pki::write_file(
            &dir.join("ca.pem"),
            first.signer.root_pem().as_bytes(),
            0o644,
        )?;
        crate::pki::write_file(
            &dir.join(NEXT_CA_FILE),
            next.signer.root_pem().as_bytes(),
            0o644,
        )?;
        let serving = ReloadingIdentity::load(&cert_path, &key_path)?;
        Ok(Self {
            first,
            next,
            rotated: AtomicBool::new(false),
            serving,
            cert_path,
            key_path,
        })
    }

    fn now(&self) -> &Generation {
        if self.rotated.load(Ordering::SeqCst) {
            &self.next
        } else {
            &self.first
        }
    }

    /// The signer of what ZTS issues now.
    pub fn signer(&self) -> &CertAuthority {
        &self.now().signer
    }

    /// The bundle returned with what ZTS issues now (intermediate then root).
    pub fn bundle(&self) -> &str {
        &self.now().bundle
    }

    /// The first generation's signer (tests mint certificates ZTS trusts with it).
    pub fn first_signer(&self) -> &CertAuthority {
        &self.first.signer
    }

    /// The first generation's root.
    pub fn first_root_pem(&self) -> &str {
        self.first.signer.root_pem()
    }

    /// Every CA certificate of both generations (roots and signers): what ZTS trusts for
    /// clients and providers throughout.
    pub fn all_cas_pem(&self) -> Vec<String> {
        [&self.first, &self.next]
            .iter()
            .flat_map(|g| {
                [
                    g.signer.root_pem().to_owned(),
                    g.signer.cert_pem().to_owned(),
                ]
            })
            .collect()
    }

    /// ZTS's own certificate, as it is now (served, and presented to providers).
    pub fn serving(&self) -> Arc<ReloadingIdentity> {
        Arc::clone(&self.serving)
    }

    /// Whether ZTS serves and signs under the next CA.
    pub fn rotated(&self) -> bool {
        self.rotated.load(Ordering::SeqCst)
    }

    /// Moves ZTS to the next CA: its certificate (served from the next handshake on) and its
    /// signer. Returns whether it moved now (false: it had already).
    pub fn rotate(&self) -> Result<bool, CaRotationError> {
        if self.rotated() {
            return Ok(false);
        }
        write_pair(&self.cert_path, &self.key_path, &self.next)?;
        match self.serving.reload() {
            ReloadOutcome::Reloaded | ReloadOutcome::Unchanged => {}
            ReloadOutcome::Skipped(e) => return Err(CaRotationError::NotTaken(e.to_string())),
        }
        self.rotated.store(true, Ordering::SeqCst);
        tracing::info!("the dev ZTS serves and signs under its next CA");
        Ok(true)
    }
}

fn write_pair(cert: &Path, key: &Path, generation: &Generation) -> Result<(), PkiError> {
    crate::pki::write_file(key, generation.serving_key.as_bytes(), 0o600)?;
    crate::pki::write_file(cert, generation.serving_chain.as_bytes(), 0o644)
}
