//! rustls configurations for every TLS endpoint of the system.
//!
//! - Servers always require a client certificate chaining to a configured CA, and hand the handler
//!   the client's principal (the certificate CN) so it can check an allow-list. Only TLS 1.2
//!   sessions are resumed, for [`SESSION_MAX_AGE`] after the full handshake that verified their
//!   client ([`ExpiringSessionCache`]); a resumed session is verified again before it serves
//!   ([`ResumedSessionCheck`]), and none survives a change of a reloaded client CA bundle
//!   (docs/design.md §6; [`server_config_on_clock`] says why each setting).
//! - Clients trust only a configured CA bundle — never the system roots.
//! - Certificates and keys are reloaded from disk when they change ([`ReloadingIdentity`]); a
//!   half-written pair (key not matching certificate) is skipped and the old pair keeps serving.
//!
//! Configs are built with aws-lc-rs as the explicit provider, so they work whether or not a
//! process-wide default was installed.

use crate::crypto::{CertInfo, pem_certificates};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
pub use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};
use thiserror::Error;

pub mod clock;
mod expect_principal;
mod reloading_client_ca;
mod resumption;
mod server_ca;
mod server_config;
mod session_cache;
#[cfg(test)]
pub(crate) mod test_pki;
pub use expect_principal::{client_config_expecting, client_config_expecting_cn_only};
pub use reloading_client_ca::ReloadingClientCa;
pub use resumption::{ResumedSessionCheck, ResumptionRefused};
pub use server_ca::{ServerCaBundle, client_config_with_bundle};
pub use server_config::{ClientCas, ServerTls, server_config_on_clock};
pub use session_cache::{ExpiringSessionCache, SESSION_MAX_AGE};

/// Largest certificate or key file read.
const MAX_TLS_FILE_LEN: u64 = 256 * 1024;

/// Errors building TLS material; each names the file or what was wrong.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file's content is not what it must be.
    #[error("{path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// In-memory PEM is not what it must be.
    #[error("{0}")]
    BadPem(String),
    /// The private key does not belong to the certificate.
    #[error("the private key does not match the certificate: {0}")]
    Mismatch(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// A certificate does not chain to the trusted bundle, or is not valid now.
    #[error("not a valid certificate of the trusted CA: {0}")]
    Untrusted(String),
}

/// The crypto provider used by every config here.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read_limited(path: &Path) -> Result<Vec<u8>, TlsError> {
    let io_err = |source| TlsError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = fs::metadata(path).map_err(io_err)?;
    if meta.len() > MAX_TLS_FILE_LEN {
        return Err(TlsError::BadFile {
            path: path.to_owned(),
            reason: format!("larger than {MAX_TLS_FILE_LEN} bytes"),
        });
    }
    fs::read(path).map_err(io_err)
}

/// Reads every certificate of a PEM file (a leaf + chain, or a CA bundle).
pub fn read_certs_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_limited(path)?;
    let text = String::from_utf8(bytes).map_err(|_| TlsError::BadFile {
        path: path.to_owned(),
        reason: "not UTF-8 PEM".into(),
    })?;
    pem_certificates(&text).map_err(|e| TlsError::BadFile {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Reads a PEM private key file (PKCS#8, SEC1 or PKCS#1).
pub fn read_key_file(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_limited(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::BadFile {
        path: path.to_owned(),
        reason: format!("no private key PEM block ({e})"),
    })
}

/// Pairs a chain with its key, refusing a key that does not belong to the leaf.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, TlsError> {
    if chain.is_empty() {
        return Err(TlsError::Mismatch("the certificate chain is empty".into()));
    }
    CertifiedKey::from_der(chain, key, &provider())
        .map(Arc::new)
        .map_err(|e| TlsError::Mismatch(e.to_string()))
}

/// Pairs a PEM chain with a PEM key (e.g. the pair a pod presents on refresh).
pub fn certified_key_from_pem(
    chain_pem: &str,
    key_pem: &str,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = pem_certificates(chain_pem).map_err(|e| TlsError::BadPem(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::BadPem(format!("private key: {e}")))?;
    certified_key(chain, key)
}

/// Builds a root store from CA certificates; refuses an empty one (which would trust nothing and
/// fail every handshake with an unhelpful error).
pub fn root_store(cas: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for ca in cas {
        store
            .add(ca.clone())
            .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
    }
    if store.is_empty() {
        return Err(TlsError::Config(
            "the CA bundle holds no certificate".into(),
        ));
    }
    Ok(Arc::new(store))
}

/// Which file versions are loaded: metadata that changes whenever a file is replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    cert: (Option<SystemTime>, u64, u64),
    key: (Option<SystemTime>, u64, u64),
}

fn file_stamp(path: &Path) -> io::Result<(Option<SystemTime>, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path)?;
    Ok((m.modified().ok(), m.len(), m.ino()))
}

/// What a reload did.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files did not change.
    Unchanged,
    /// A new pair was loaded and is now served.
    Reloaded,
    /// The files changed but the new pair is unusable; the old one keeps serving.
    Skipped(TlsError),
}

/// A certificate/key pair read from two files and reloaded when they change.
///
/// Serves as both the server certificate resolver and the client certificate resolver, so the
/// same object backs a daemon's server side and its outgoing mutual-TLS calls.
#[derive(Debug)]
pub struct ReloadingIdentity {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    loaded: Mutex<Fingerprint>,
}

impl ReloadingIdentity {
    /// Loads the pair; fails if either file is unreadable or they do not match.
    pub fn load(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
    ) -> Result<Arc<Self>, TlsError> {
        let cert_path = cert_path.into();
        let key_path = key_path.into();
        let (key, stamp) = Self::read_pair(&cert_path, &key_path)?;
        Ok(Arc::new(Self {
            cert_path,
            key_path,
            current: RwLock::new(key),
            loaded: Mutex::new(stamp),
        }))
    }

    fn read_pair(
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<(Arc<CertifiedKey>, Fingerprint), TlsError> {
        let stamp = |p: &Path| {
            file_stamp(p).map_err(|source| TlsError::Io {
                path: p.to_owned(),
                source,
            })
        };
        let before = Fingerprint {
            cert: stamp(cert_path)?,
            key: stamp(key_path)?,
        };
        let key = certified_key(read_certs_file(cert_path)?, read_key_file(key_path)?)?;
        Ok((key, before))
    }

    /// Reloads the pair if either file changed since the last load.
    pub fn reload(&self) -> ReloadOutcome {
        let now = match (file_stamp(&self.cert_path), file_stamp(&self.key_path)) {
            (Ok(cert), Ok(key)) => Fingerprint { cert, key },
            (Err(source), _) => {
                return ReloadOutcome::Skipped(TlsError::Io {
                    path: self.cert_path.clone(),
                    source,
                });
            }
            (_, Err(source)) => {
                return ReloadOutcome::Skipped(TlsError::Io {
                    path: self.key_path.clone(),
                    source,
                });
            }
        };
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *loaded == now {
            return ReloadOutcome::Unchanged;
        }
        match Self::read_pair(&self.cert_path, &self.key_path) {
            Ok((key, stamp)) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = key;
                *loaded = stamp;
                ReloadOutcome::Reloaded
            }
            Err(e) => ReloadOutcome::Skipped(e),
        }
    }

    /// Checks the files every `interval` from a background task, logging what happened.
    pub fn spawn_watcher(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        crate::periodic::every(interval, move || match this.reload() {
            ReloadOutcome::Unchanged => {}
            ReloadOutcome::Reloaded => tracing::info!(
                cert = %this.cert_path.display(),
                "reloaded TLS certificate and key"
            ),
            ReloadOutcome::Skipped(e) => tracing::warn!(
                cert = %this.cert_path.display(),
                error = %e,
                "TLS files changed but are not usable yet; still serving the previous pair"
            ),
        })
    }

    /// The pair being served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

impl ResolvesServerCert for ReloadingIdentity {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for ReloadingIdentity {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A fixed client certificate (e.g. the pod's current certificate when refreshing).
#[derive(Debug)]
struct FixedClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for FixedClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A pair held in memory and replaced as it is renewed: an identity that never touches disk
/// (the node agent's, docs/design.md §4.9). Until one is set, no client certificate is presented.
#[derive(Debug, Default)]
pub struct InMemoryIdentity {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl InMemoryIdentity {
    /// Serves `key` from now on.
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(key);
    }

    /// The pair being served, if any.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesServerCert for InMemoryIdentity {
    /// The pair being served; until one is set every handshake fails (the admission webhook
    /// with its own CA sets one before it listens).
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for InMemoryIdentity {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The certificate a client presents.
#[derive(Debug, Clone)]
pub enum ClientIdentity {
    /// A pair reloaded from disk (a daemon's own identity).
    Reloading(Arc<ReloadingIdentity>),
    /// A fixed pair.
    Fixed(Arc<CertifiedKey>),
    /// A pair renewed in memory.
    InMemory(Arc<InMemoryIdentity>),
}

/// Whether a server demands a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Every client must present a certificate chaining to the client CAs (every daemon here).
    Required,
    /// A client may connect without a certificate, but one it presents must chain to the client
    /// CAs. Only for ZTS stand-ins: real ZTS serves register calls to clients without one.
    Optional,
}

/// Checks that a certificate was issued under a CA bundle, as a TLS server checking a client
/// certificate would (chain, validity now, client-auth usage): the agent asks it of every pair a
/// pod presents for refresh, before the pair is shown to ZTS.
#[derive(Debug, Clone)]
pub struct IssuerCheck {
    verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
}

impl IssuerCheck {
    /// Certificates must chain to one of `cas`.
    pub fn new(cas: &[CertificateDer<'static>]) -> Result<Self, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(root_store(cas)?, provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self { verifier })
    }

    /// Certificates must chain to the bundle `ca` holds at each check: a rotation of its file
    /// (followed by [`ReloadingClientCa::spawn_watcher`]) reaches the check with no restart.
    pub fn reloading(ca: Arc<ReloadingClientCa>) -> Self {
        Self { verifier: ca }
    }

    /// Whether `chain` (the leaf, then any intermediates) chains to the bundle and is valid
    /// now; the error says why not.
    pub fn check(&self, chain: &[CertificateDer<'static>]) -> Result<(), TlsError> {
        let (leaf, intermediates) = chain
            .split_first()
            .ok_or_else(|| TlsError::Untrusted("no certificate".into()))?;
        self.verifier
            .verify_client_cert(leaf, intermediates, rustls_pki_types::UnixTime::now())
            .map(|_| ())
            .map_err(|e| TlsError::Untrusted(e.to_string()))
    }
}

/// A server config ([`ServerTls`]: with its check of resumed sessions) that requires a client
/// certificate chaining to `client_cas`.
pub fn server_config(
    identity: Arc<dyn ResolvesServerCert>,
    client_cas: &[CertificateDer<'static>],
) -> Result<ServerTls, TlsError> {
    server_config_with(identity, client_cas, ClientAuth::Required)
}

/// A server config with the given client-certificate policy.
pub fn server_config_with(
    identity: Arc<dyn ResolvesServerCert>,
    client_cas: &[CertificateDer<'static>],
    client_auth: ClientAuth,
) -> Result<ServerTls, TlsError> {
    server_config_on_clock(
        identity,
        ClientCas::Fixed(client_cas, client_auth),
        clock::system_clock(),
    )
}

/// A server config that requires a client certificate verified by `client_ca`, whose bundle is
/// read again as its file changes ([`ReloadingClientCa::spawn_watcher`]); a change empties this
/// config's session cache.
pub fn server_config_reloading(
    identity: Arc<ReloadingIdentity>,
    client_ca: Arc<ReloadingClientCa>,
) -> Result<ServerTls, TlsError> {
    server_config_on_clock(
        identity,
        ClientCas::Reloading(client_ca),
        clock::system_clock(),
    )
}

/// A server config that asks for no client certificate (so its [`ResumedSessionCheck`] verifies
/// no chain, and refuses a resumed session carrying one). Only for the admission webhook, which
/// the Kubernetes API server calls without one unless it is given a kubeconfig for that webhook;
/// every other server here requires client certificates.
pub fn server_config_without_client_auth(
    identity: Arc<dyn ResolvesServerCert>,
) -> Result<ServerTls, TlsError> {
    server_config_on_clock(identity, ClientCas::NotAsked, clock::system_clock())
}

/// A client config trusting only `cas`, presenting `identity` if given.
pub fn client_config(
    cas: &[CertificateDer<'static>],
    identity: Option<ClientIdentity>,
) -> Result<ClientConfig, TlsError> {
    let roots = root_store(cas)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    Ok(with_identity(builder, identity))
}

pub(crate) fn with_identity(
    builder: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
    identity: Option<ClientIdentity>,
) -> ClientConfig {
    match identity {
        None => builder.with_no_client_auth(),
        Some(ClientIdentity::Reloading(r)) => builder.with_client_cert_resolver(r),
        Some(ClientIdentity::Fixed(k)) => {
            builder.with_client_cert_resolver(Arc::new(FixedClientCert(k)))
        }
        Some(ClientIdentity::InMemory(m)) => builder.with_client_cert_resolver(m),
    }
}

/// The principal (subject CN) of a certificate, if it has one.
pub fn principal_of(cert: &CertificateDer<'_>) -> Option<String> {
    CertInfo::from_der(cert.as_ref())
        .ok()
        .map(|info| info.common_name)
        .filter(|cn| !cn.is_empty())
}

/// The principal of the client on a server connection (its leaf certificate's CN).
pub fn peer_principal(conn: &rustls::ServerConnection) -> Option<String> {
    peer_leaf(conn).and_then(|info| Some(info.common_name).filter(|cn| !cn.is_empty()))
}

/// The client's leaf certificate on a server connection, read once (the HTTP layer keeps its
/// principal and URIs for every request of the connection).
pub fn peer_leaf(conn: &rustls::ServerConnection) -> Option<CertInfo> {
    conn.peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|der| CertInfo::from_der(der.as_ref()).ok())
}

/// An allow-list of principals: exact names and `prefix.*` patterns (`*` matches one or more
/// labels after the prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrincipalAllowList {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl PrincipalAllowList {
    /// Parses entries such as `k8s.admin.athenz-zts` or `k8s.nodes.*`.
    pub fn new<I, S>(entries: I) -> Result<Self, crate::names::NameError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = Self::default();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if let Some(prefix) = entry.strip_suffix(".*") {
                crate::names::validate_domain("allowed principal prefix", prefix)?;
                list.prefixes.push(format!("{prefix}."));
            } else {
                crate::names::validate_provider("allowed principal", entry)?;
                list.exact.push(entry.to_owned());
            }
        }
        Ok(list)
    }

    /// Whether `principal` is allowed.
    pub fn allows(&self, principal: &str) -> bool {
        self.exact.iter().any(|e| e == principal)
            || self.prefixes.iter().any(|p| {
                principal
                    .strip_prefix(p.as_str())
                    .is_some_and(|rest| crate::names::validate_domain("principal", rest).is_ok())
            })
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_exact_and_prefix() {
        let list = PrincipalAllowList::new(["k8s.admin.zts", "k8s.nodes.*"]).unwrap();
        assert!(list.allows("k8s.admin.zts"));
        assert!(list.allows("k8s.nodes.node-1"));
        assert!(list.allows("k8s.nodes.a.b"));
        assert!(!list.allows("k8s.nodes."));
        assert!(!list.allows("k8s.nodes"));
        assert!(!list.allows("k8s.nodesx.a"));
        assert!(!list.allows("k8s.admin.zts2"));
        assert!(!list.allows("K8S.ADMIN.ZTS"));
        assert!(PrincipalAllowList::new(["*"]).is_err());
        assert!(PrincipalAllowList::new(["a..b"]).is_err());
        assert!(PrincipalAllowList::new(["single"]).is_err());
        assert!(
            PrincipalAllowList::new(Vec::<String>::new())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn empty_root_store_is_refused() {
        assert!(root_store(&[]).is_err());
    }

    #[test]
    fn missing_files_name_the_path() {
        let err =
            ReloadingIdentity::load("/nonexistent/cert.pem", "/nonexistent/key.pem").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.pem");
        fs::write(&path, "not pem").unwrap();
        let err = read_certs_file(&path).unwrap_err();
        assert!(err.to_string().contains("c.pem"), "{err}");
        let err = read_key_file(&path).unwrap_err();
        assert!(err.to_string().contains("no private key"), "{err}");
        fs::write(&path, vec![b'a'; 300 * 1024]).unwrap();
        assert!(
            read_certs_file(&path)
                .unwrap_err()
                .to_string()
                .contains("larger")
        );
    }
}
