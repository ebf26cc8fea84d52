//! The CA bundle that verifies ZTS, as the agent and its pods see it
//! (docs/binaries/athenz-identity-agent.md, "ZTS's CA for the pods").
//!
//! The image is `FROM scratch` and tenant namespaces hold none of the install's ConfigMaps, so a
//! pod's SIA has no CA of its own to verify ZTS with when it asks for role certificates and
//! tokens. The agent has one (`--zts-ca`, the install's `athenz-zts-ca` ConfigMap) and its
//! directory is already bound read-only into every pod that runs the SIA (`connect/` of the
//! identity volume, beside `agent.sock`): the agent publishes its bundle there as
//! [`PUBLISHED_NAME`]. A CA is public, so nothing is disclosed; nothing per namespace has to be
//! made; and a rotation of the ConfigMap reaches the pods when the agent sees the file change
//! (the kubelet updates a ConfigMap volume within about a minute), with no restart.
//!
//! A bundle that does not parse is never published: the last good one stays, and the error is
//! logged and counted.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use thiserror::Error;

/// The bundle's name in the agent dir (pods: `<identity mount>/connect/zts-ca.pem`).
pub const PUBLISHED_NAME: &str = "zts-ca.pem";

/// Why a bundle could not be read or published.
#[derive(Debug, Error)]
pub enum ZtsCaError {
    /// The source is missing, unreadable or holds no certificate.
    #[error("--zts-ca (ZTS_CA_FILE): {0}")]
    Source(#[from] athenz_core::tls::TlsError),
    /// The copy in the agent dir could not be written.
    #[error("publishing the ZTS CA bundle: {0}")]
    Publish(athenz_core::volume::VolumeError),
}

/// The current bundle, its source and where it is published.
#[derive(Debug)]
pub struct ZtsCa {
    source: PathBuf,
    published: PathBuf,
    pem: RwLock<String>,
}

impl ZtsCa {
    /// Reads `source` (it must hold at least one certificate) and publishes it in `agent_dir`.
    pub fn load(source: &Path, agent_dir: &Path) -> Result<Arc<Self>, ZtsCaError> {
        let pem = read_bundle(source)?;
        let ca = Self {
            source: source.to_owned(),
            published: agent_dir.join(PUBLISHED_NAME),
            pem: RwLock::new(String::new()),
        };
        ca.publish(&pem)?;
        *ca.pem.write().unwrap_or_else(|p| p.into_inner()) = pem;
        Ok(Arc::new(ca))
    }

    /// The bundle as last read (PEM).
    pub fn pem(&self) -> String {
        self.pem.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Where pods find it, on the host.
    pub fn published_path(&self) -> &Path {
        &self.published
    }

    /// Reads the source again; a changed, valid bundle is published and used from now on.
    /// Returns whether it changed.
    pub fn reload(&self) -> Result<bool, ZtsCaError> {
        let pem = read_bundle(&self.source)?;
        if pem == self.pem() {
            // the copy may have been removed (a node cleanup): put it back
            if !self.published.exists() {
                self.publish(&pem)?;
            }
            return Ok(false);
        }
        self.publish(&pem)?;
        *self.pem.write().unwrap_or_else(|p| p.into_inner()) = pem;
        Ok(true)
    }

    /// Checks the source every `interval` until the task is aborted.
    pub fn spawn_watcher(self: Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        athenz_core::periodic::every(interval, move || match self.reload() {
            Ok(true) => tracing::info!(
                source = %self.source.display(),
                published = %self.published.display(),
                "the ZTS CA bundle changed; published the new one"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "kept the last good ZTS CA bundle"),
        })
    }

    /// Writes `pem` next to the socket, whole (a temporary file, then a rename), so a pod never
    /// reads half a bundle. World-readable: it is public, and pods of any uid read it.
    fn publish(&self, pem: &str) -> Result<(), ZtsCaError> {
        athenz_core::volume::write_file_atomic(&self.published, pem.as_bytes(), 0o644)
            .map_err(ZtsCaError::Publish)
    }
}

/// The PEM text of `path`, once it is known to hold at least one certificate (the size limit
/// and parsing are the TLS files' own).
fn read_bundle(path: &Path) -> Result<String, ZtsCaError> {
    let certs = athenz_core::tls::read_certs_file(path)?;
    let pem = certs
        .iter()
        .map(|der| athenz_core::crypto::der_to_pem(der))
        .collect::<String>();
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn ca_pem(cn: &str) -> String {
        athenz_testbed::pki::CertAuthority::new_root(cn)
            .unwrap()
            .cert_pem()
            .to_owned()
    }

    #[test]
    fn publishes_the_bundle_and_follows_a_rotation_keeping_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("ca.pem");
        let agent_dir = dir.path().join("agent");
        std::fs::create_dir(&agent_dir).unwrap();
        let old = ca_pem("old");
        std::fs::write(&source, &old).unwrap();
        let ca = ZtsCa::load(&source, &agent_dir).unwrap();
        let published = agent_dir.join(PUBLISHED_NAME);
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&published).trim(), old.trim());
        assert_eq!(
            std::fs::metadata(&published).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert!(!ca.reload().unwrap(), "nothing changed");

        // appended, then the old one removed: each step is published
        let new = ca_pem("new");
        std::fs::write(&source, format!("{old}{new}")).unwrap();
        assert!(ca.reload().unwrap());
        assert_eq!(
            athenz_core::tls::read_certs_file(&published).unwrap().len(),
            2
        );
        std::fs::write(&source, &new).unwrap();
        assert!(ca.reload().unwrap());
        assert_eq!(read(&published).trim(), new.trim());
        assert_eq!(ca.pem().trim(), new.trim());

        // a broken or hostile source is refused, naming the setting; the last good one stays
        for bad in [
            String::new(),
            "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_owned(),
            "x".repeat(2 * 1024 * 1024),
        ] {
            std::fs::write(&source, &bad).unwrap();
            let err = ca.reload().unwrap_err().to_string();
            assert!(err.contains("--zts-ca"), "{err}");
            assert_eq!(read(&published).trim(), new.trim());
        }
        // a removed copy comes back
        std::fs::write(&source, &new).unwrap();
        std::fs::remove_file(&published).unwrap();
        assert!(!ca.reload().unwrap());
        assert_eq!(read(&published).trim(), new.trim());
    }

    #[test]
    fn a_missing_or_empty_source_stops_the_start_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = ZtsCa::load(&dir.path().join("absent.pem"), dir.path()).unwrap_err();
        assert!(err.to_string().contains("--zts-ca"), "{err}");
        assert!(!dir.path().join(PUBLISHED_NAME).exists());
    }
}
