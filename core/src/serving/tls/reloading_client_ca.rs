//! The CA bundle a server verifies its clients with, read again when its file changes: a rotation
//! of the Athenz CA (a new CA appended to the ConfigMap, later the old one removed) reaches the
//! jwt-service and the callback without a restart, as their own certificates already do. A
//! bundle that does not parse, or holds no certificate, is never used: the last good one stays.
//!
//! The server sends no CA names in its certificate request (`root_hint_subjects` is empty, which
//! TLS allows): the names would have to outlive a reload. Every client here has exactly one
//! certificate to present, so the hint would change nothing.
//!
//! A change of the bundle reaches resumed sessions too (docs/design.md §6): the session caches of
//! the servers built on the bundle are emptied when it changes
//! ([`ReloadingClientCa::forget_sessions_on_change`]), so every client's next handshake is a full
//! one, verified with the new bundle; and a session resumed all the same (one stored by a
//! handshake that was under way at the change) is verified again with the bundle as it is now
//! before its connection serves ([`super::ResumedSessionCheck`]).

use super::{ExpiringSessionCache, TlsError, provider, read_certs_file, root_store};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

/// The verifier of the bundle last read from `path`.
pub struct ReloadingClientCa {
    path: PathBuf,
    current: RwLock<(Vec<CertificateDer<'static>>, Arc<dyn ClientCertVerifier>)>,
    /// The session caches of the servers verifying with this bundle, emptied when it changes.
    sessions: Mutex<Vec<Weak<ExpiringSessionCache>>>,
}

impl std::fmt::Debug for ReloadingClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReloadingClientCa({})", self.path.display())
    }
}

fn verifier(cas: &[CertificateDer<'static>]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(root_store(cas)?, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))
}

impl ReloadingClientCa {
    /// Reads `path`; it must hold at least one certificate.
    pub fn load(path: &Path) -> Result<Arc<Self>, TlsError> {
        let cas = read_certs_file(path)?;
        let verifier = verifier(&cas)?;
        Ok(Arc::new(Self {
            path: path.to_owned(),
            current: RwLock::new((cas, verifier)),
            sessions: Mutex::new(Vec::new()),
        }))
    }

    /// Reads the file again; a changed, valid bundle is used for the next handshake, and the
    /// sessions verified under the old one are forgotten. Returns whether it changed.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let cas = read_certs_file(&self.path)?;
        if cas == self.current.read().unwrap_or_else(|p| p.into_inner()).0 {
            return Ok(false);
        }
        let verifier = verifier(&cas)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (cas, verifier);
        // after the swap: a session stored from now on was verified with the new bundle (one
        // whose handshake began before the swap is caught when it resumes)
        self.forget_sessions();
        Ok(true)
    }

    /// Empties `cache` whenever the bundle changes: a session verified under the old bundle is
    /// not resumed under the new one. Held weakly; a dropped server's cache is forgotten.
    pub fn forget_sessions_on_change(&self, cache: &Arc<ExpiringSessionCache>) {
        let mut caches = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        caches.retain(|cache| cache.strong_count() > 0);
        caches.push(Arc::downgrade(cache));
    }

    fn forget_sessions(&self) {
        let mut caches = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        caches.retain(|cache| match cache.upgrade() {
            Some(cache) => {
                cache.clear();
                true
            }
            None => false,
        });
    }

    /// How many CA certificates are trusted now.
    pub fn len(&self) -> usize {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .len()
    }

    /// Never true: a bundle with no certificate is refused.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the file every `interval` until the task is aborted.
    pub fn spawn_watcher(self: Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        crate::periodic::every(interval, move || match self.reload() {
            Ok(true) => tracing::info!(
                path = %self.path.display(),
                certificates = self.len(),
                "the client CA bundle changed; verifying clients with the new one, their sessions \
                 forgotten"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "kept the last good client CA bundle"),
        })
    }

    fn now(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()).1)
    }
}

impl ClientCertVerifier for ReloadingClientCa {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.now()
            .verify_client_cert(end_entity, intermediates, now)
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
