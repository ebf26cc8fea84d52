//! The CA bundle a client verifies its server (ZTS) with, read again when its file changes, so
//! that a rotation of ZTS's CA (docs/design.md §6: a new CA added to the bundle, the server moved
//! to it, the old CA removed) reaches every running client with no restart: the SIA's direct
//! refreshes and its role certificates and tokens, the agent's own ZTS calls, control SIA.
//!
//! The file is checked as connections are made, not by a task of its own: before a server
//! certificate is verified, a bundle not checked for [`CHECK_EVERY`] has its file's stamp
//! (modification time, length, inode) compared with the one last read, and is read again only
//! when that changed. A ConfigMap volume's update (a new `..data` directory, the link swapped)
//! changes the inode. A bundle that does not parse, or holds no certificate, is never used: the
//! last good one stays, and the next check tries again.

use super::{TlsError, file_stamp, provider, read_certs_file, root_store};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// How often, at most, a bundle's file is looked at (one `stat`).
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

type Stamp = (Option<SystemTime>, u64, u64);

/// A server-verifying CA bundle: fixed, or read from a file and followed as it changes.
pub struct ServerCaBundle {
    source: Option<PathBuf>,
    current: RwLock<Current>,
    checked: Mutex<Checked>,
}

struct Current {
    cas: Vec<CertificateDer<'static>>,
    verifier: Arc<WebPkiServerVerifier>,
}

struct Checked {
    at: Instant,
    stamp: Option<Stamp>,
}

impl std::fmt::Debug for ServerCaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Some(path) => write!(f, "ServerCaBundle({}, {} CAs)", path.display(), self.len()),
            None => write!(f, "ServerCaBundle(fixed, {} CAs)", self.len()),
        }
    }
}

fn verifier(cas: &[CertificateDer<'static>]) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    WebPkiServerVerifier::builder_with_provider(root_store(cas)?, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))
}

impl ServerCaBundle {
    /// Exactly `cas`, never reloaded (a bundle given in memory, or a test's).
    pub fn fixed(cas: Vec<CertificateDer<'static>>) -> Result<Arc<Self>, TlsError> {
        let verifier = verifier(&cas)?;
        Ok(Arc::new(Self {
            source: None,
            current: RwLock::new(Current { cas, verifier }),
            checked: Mutex::new(Checked {
                at: Instant::now(),
                stamp: None,
            }),
        }))
    }

    /// The bundle in `path` (at least one certificate), followed as the file changes.
    pub fn from_file(path: &Path) -> Result<Arc<Self>, TlsError> {
        let stamp = file_stamp(path).map_err(|source| TlsError::Io {
            path: path.to_owned(),
            source,
        })?;
        let cas = read_certs_file(path)?;
        let verifier = verifier(&cas)?;
        Ok(Arc::new(Self {
            source: Some(path.to_owned()),
            current: RwLock::new(Current { cas, verifier }),
            checked: Mutex::new(Checked {
                at: Instant::now(),
                stamp: Some(stamp),
            }),
        }))
    }

    /// The certificates trusted now.
    pub fn certificates(&self) -> Vec<CertificateDer<'static>> {
        self.read().cas.clone()
    }

    /// How many CA certificates are trusted now.
    pub fn len(&self) -> usize {
        self.read().cas.len()
    }

    /// Never true: a bundle with no certificate is refused.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the file again if its stamp changed since it was last read; returns whether the
    /// trusted bundle changed. A fixed bundle never changes. An unreadable or empty file keeps
    /// the last good bundle and is an error.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let Some(path) = &self.source else {
            return Ok(false);
        };
        let mut checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
        checked.at = Instant::now();
        let stamp = file_stamp(path).map_err(|source| TlsError::Io {
            path: path.clone(),
            source,
        })?;
        if checked.stamp == Some(stamp) {
            return Ok(false);
        }
        let cas = read_certs_file(path)?;
        checked.stamp = Some(stamp);
        if cas == self.read().cas {
            return Ok(false);
        }
        let verifier = verifier(&cas)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Current { cas, verifier };
        Ok(true)
    }

    /// [`Self::reload`] when the file was last looked at [`CHECK_EVERY`] ago or more.
    fn reload_if_due(&self) {
        let due = self.source.is_some()
            && self
                .checked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .at
                .elapsed()
                >= CHECK_EVERY;
        if !due {
            return;
        }
        match self.reload() {
            Ok(true) => tracing::info!(
                path = %self.source.as_deref().unwrap_or(Path::new("")).display(),
                certificates = self.len(),
                "the server CA bundle changed; verifying servers with the new one"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "kept the last good server CA bundle"),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Current> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Arc<WebPkiServerVerifier> {
        Arc::clone(&self.read().verifier)
    }
}

impl ServerCertVerifier for ServerCaBundle {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.reload_if_due();
        self.now()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.now().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.now().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.now().supported_verify_schemes()
    }
}

/// A client config verifying its server with `bundle` (as it is at each handshake), presenting
/// `identity` if given.
pub fn client_config_with_bundle(
    bundle: &Arc<ServerCaBundle>,
    identity: Option<super::ClientIdentity>,
) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(bundle) as Arc<dyn ServerCertVerifier>);
    Ok(super::with_identity(builder, identity))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::pem_certificates;

    fn self_signed(cn: &str) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn write(path: &Path, text: &str) {
        // a new file renamed over the old, as the kubelet's ConfigMap update and the agent's
        // publication both do: the inode changes
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_changed_file_is_followed_and_a_broken_one_keeps_the_last_good_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        let (old, new) = (self_signed("old CA"), self_signed("new CA"));
        write(&path, &old);
        let bundle = ServerCaBundle::from_file(&path).unwrap();
        assert_eq!(bundle.len(), 1);
        assert!(!bundle.reload().unwrap(), "nothing changed");

        write(&path, &format!("{old}{new}"));
        assert!(bundle.reload().unwrap(), "the new CA was added");
        assert_eq!(bundle.len(), 2);

        write(&path, "not a certificate\n");
        assert!(bundle.reload().is_err(), "a broken bundle is an error");
        assert_eq!(bundle.len(), 2, "and the last good one stays");

        write(&path, &new);
        assert!(bundle.reload().unwrap(), "the old CA was removed");
        assert_eq!(
            bundle.certificates(),
            pem_certificates(&new).unwrap(),
            "only the new CA is trusted"
        );

        std::fs::remove_file(&path).unwrap();
        assert!(bundle.reload().is_err(), "a missing file is an error");
        assert_eq!(bundle.len(), 1);
    }

    #[test]
    fn a_fixed_bundle_never_reloads_and_an_empty_one_is_refused() {
        let bundle = ServerCaBundle::fixed(pem_certificates(&self_signed("CA")).unwrap()).unwrap();
        assert!(!bundle.reload().unwrap());
        assert!(ServerCaBundle::fixed(Vec::new()).is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        write(&path, "");
        assert!(ServerCaBundle::from_file(&path).is_err());
    }
}
