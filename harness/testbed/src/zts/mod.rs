//! The development ZTS: a faithful stand-in for Athenz ZTS on the routes this system uses
//! (docs/design.md §4.5), with the provider call of §4.4.
//!
//! Start it in-process with [`DevZts::start`] (ephemeral loopback port; get its URL and CA), or as
//! a standalone server with [`run_standalone`] (what `athenz-devstack zts` will expose). It owns a
//! small PKI — a root and an intermediate that signs everything — and exposes the intermediate so
//! tests can mint certificates ZTS and its clients trust.

pub mod access_token_request;
pub mod authz;
pub mod ca_rotation;
pub mod instance_provider_client;
pub mod instance_refresh;
pub mod instance_refresh_request;
pub mod instances;
pub mod provider_addresses;
pub mod provider_answer;
pub mod refusal;
pub mod register_log;
pub mod registry;
pub mod server;
pub mod x509_cert_request;
pub mod x509_role_cert_request;

use crate::pki::{CertAuthority, PkiError};
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, pem_certificates};
use athenz_core::http::{HttpMetrics, Listener, Server, ServerLimits};
use athenz_core::tls::{self, ClientAuth, ClientIdentity, TlsError};
use instance_provider_client::ProviderClients;
use instances::{InstanceKey, InstanceRecord, InstanceStore};
use registry::{ProviderEntry, Registry, RegistryError, ServiceEntry};
use serde::{Deserialize, Serialize};
use server::{RouteSettings, ZtsHandler, ZtsState};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use thiserror::Error;

/// Why the dev ZTS could not start.
#[derive(Debug, Error)]
pub enum DevZtsError {
    /// The registry is invalid.
    #[error("dev ZTS registry: {0}")]
    Registry(#[from] RegistryError),
    /// The PKI could not be made.
    #[error("dev ZTS PKI: {0}")]
    Pki(#[from] PkiError),
    /// TLS setup failed.
    #[error("dev ZTS TLS: {0}")]
    Tls(#[from] TlsError),
    /// Its CAs could not be made.
    #[error("dev ZTS CA: {0}")]
    Ca(#[from] ca_rotation::CaRotationError),
    /// A file or socket operation failed.
    #[error("dev ZTS {action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The error.
        source: std::io::Error,
    },
    /// The config file is invalid.
    #[error("dev ZTS config {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        reason: String,
    },
}

fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> DevZtsError {
    let action = action.into();
    move |source| DevZtsError::Io { action, source }
}

/// Configuration of the dev ZTS (JSON, camelCase, for the standalone server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DevZtsConfig {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Services and their public keys by version.
    pub services: Vec<ServiceEntry>,
    /// Instance providers.
    pub providers: Vec<ProviderEntry>,
    /// Longest certificate issued, minutes (Athenz's default is 30 days).
    pub max_cert_lifetime_minutes: u32,
    /// How far certificates are backdated (notBefore in the past), seconds. Athenz's signer
    /// does not backdate (`Crypto.generateX509Certificate`: notBefore is now), hence 0.
    pub cert_backdate_secs: u32,
    /// Lifetime of ntokens handed to instances, seconds.
    pub token_lifetime_secs: u32,
    /// DNS suffixes allowed in key-based (control-plane) CSRs: ZTS's `athenz.zts.cert_dns_suffix`
    /// list. A DNS name must also be `<service>.<domain-with-dashes>.<suffix>`
    /// (`ZTSUtils.validateCertReqDNSNames`, applied by `x509_cert_request::check_service_csr`).
    pub service_dns_suffixes: Vec<String>,
    /// Time allowed for a provider call, milliseconds.
    pub provider_timeout_ms: u64,
    /// ZTS's own principal: its server certificate CN and what providers see as the client.
    pub principal: String,
    /// Extra CA certificates (PEM) whose clients may present certificates to ZTS.
    pub extra_client_cas: Vec<String>,
    /// Extra CA certificates (PEM) that may sign provider server certificates.
    pub extra_provider_cas: Vec<String>,
    /// Roles and their members, for access tokens, role tokens and role certificates.
    pub roles: Vec<authz::RoleEntry>,
    /// Longest access token or role token issued, seconds (a longer `expires_in` is cut to it).
    pub max_token_expiry_secs: u32,
    /// Issue an ID token for an access token request with the `openid` scope (Athenz's
    /// `athenz.zts.oauth_openid_scope`, default false; the request is accepted either way).
    pub openid_scope: bool,
    /// Principals that may ask for tokens and role certificates on behalf of another (Athenz's
    /// `athenz.zts.authorized_proxy_users`).
    pub authorized_proxy_users: Vec<String>,
    /// Whether a key-based refresh's IP SANs must be the caller's address (Athenz's
    /// `athenz.zts.cert_request_verify_ip`, default false).
    pub cert_request_verify_ip: bool,
    /// The DNS server that resolves providers' endpoint host names (a cluster's DNS Service, so
    /// an endpoint can be registered as the callback Service's in-cluster name, as operators
    /// register it); the host's resolver when unset.
    pub provider_dns_server: Option<SocketAddr>,
}

impl Default for DevZtsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            services: Vec::new(),
            providers: Vec::new(),
            max_cert_lifetime_minutes: 30 * 24 * 60,
            cert_backdate_secs: 0,
            token_lifetime_secs: 2 * 3600,
            service_dns_suffixes: vec!["athenz.cloud".into()],
            provider_timeout_ms: 5_000,
            principal: "sys.auth.zts".into(),
            extra_client_cas: Vec::new(),
            extra_provider_cas: Vec::new(),
            roles: Vec::new(),
            max_token_expiry_secs: 24 * 3600,
            openid_scope: false,
            authorized_proxy_users: Vec::new(),
            cert_request_verify_ip: false,
            provider_dns_server: None,
        }
    }
}

impl DevZtsConfig {
    /// Reads a JSON config file.
    pub fn from_file(path: &Path) -> Result<Self, DevZtsError> {
        let text = std::fs::read_to_string(path).map_err(|e| DevZtsError::Config {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| DevZtsError::Config {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// The root plus extra CA certificates, parsed.
fn ca_list(
    root_pem: &str,
    extra: &[String],
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, DevZtsError> {
    let mut cas = Vec::new();
    for pem in std::iter::once(root_pem).chain(extra.iter().map(String::as_str)) {
        cas.extend(pem_certificates(pem).map_err(|e| TlsError::BadPem(e.to_string()))?);
    }
    Ok(cas)
}

/// A running dev ZTS.
pub struct DevZts {
    url: String,
    addr: SocketAddr,
    root_pem: String,
    state: Arc<ZtsState>,
    files: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    metrics: Arc<prometheus_client::registry::Registry>,
}

impl DevZts {
    /// Requests answered so far on `route` (the server's route label, e.g. `oauth2_token`,
    /// `role_token`, `role_cert`), whatever their status: how often a client really called ZTS.
    pub fn requests(&self, route: &str) -> u64 {
        let text = athenz_core::telemetry::encode_metrics(&self.metrics).unwrap_or_default();
        let prefix = "dev_zts_http_requests_total{";
        let route_label = format!("route=\"{route}\"");
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(&route_label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Starts a dev ZTS with its files in a private temporary directory.
    pub async fn start(config: DevZtsConfig) -> Result<Self, DevZtsError> {
        let dir = tempfile::tempdir().map_err(io("creating a temporary directory"))?;
        let path = dir.path().to_owned();
        let mut zts = Self::start_in(config, &path).await?;
        zts._tempdir = Some(dir);
        Ok(zts)
    }

    /// Starts a dev ZTS keeping its files (`ca.pem`, its own certificate) in `dir`.
    pub async fn start_in(config: DevZtsConfig, dir: &Path) -> Result<Self, DevZtsError> {
        athenz_core::install_crypto_provider();
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let registry = Registry::new(&config.services, &config.providers)?;
        // clients reach it by the address it listens on (a pod reaches a ZTS beside its cluster
        // by the node's address), and always by loopback
        let mut ip_addresses = vec![std::net::IpAddr::from([127, 0, 0, 1])];
        let listen_ip = config.listen.ip();
        if !listen_ip.is_unspecified() && !ip_addresses.contains(&listen_ip) {
            ip_addresses.push(listen_ip);
        }
        let cas = ca_rotation::CaGenerations::create(dir, &config.principal, &ip_addresses)?;
        let root_pem = cas.first_root_pem().to_owned();
        let identity = cas.serving();

        // ZTS trusts its own signers as well as the roots, so an instance may present its leaf
        // alone (as real ZTS does with its configured signer chain); both CA generations, so
        // that a rotation ([`ca_rotation`]) never refuses a client in the middle of it.
        let mut client_extra = cas.all_cas_pem();
        client_extra.extend(config.extra_client_cas.iter().cloned());
        let client_cas = ca_list(&root_pem, &client_extra)?;
        let mut provider_extra = cas.all_cas_pem();
        provider_extra.extend(config.extra_provider_cas.iter().cloned());
        let provider_cas = ca_list(&root_pem, &provider_extra)?;
        let server_config =
            tls::server_config_with(identity.clone(), &client_cas, ClientAuth::Optional)?;

        let state = Arc::new(ZtsState {
            principal: config.principal.clone(),
            registry: RwLock::new(registry),
            instances: InstanceStore::default(),
            cas,
            token_key: PrivateKey::generate(KeyAlgorithm::P256).map_err(PkiError::from)?,
            providers: ProviderClients::new(
                provider_cas,
                ClientIdentity::Reloading(identity),
                std::time::Duration::from_millis(config.provider_timeout_ms),
            )
            .with_dns_server(config.provider_dns_server),
            settings: RouteSettings {
                max_cert_lifetime_minutes: config.max_cert_lifetime_minutes,
                backdate: time::Duration::seconds(i64::from(config.cert_backdate_secs)),
                token_lifetime: time::Duration::seconds(i64::from(config.token_lifetime_secs)),
                service_dns_suffixes: config.service_dns_suffixes.clone(),
                ntoken_skew: time::Duration::seconds(60),
                max_token_expiry: time::Duration::seconds(i64::from(config.max_token_expiry_secs)),
                openid_scope: config.openid_scope,
                authorized_proxy_users: config.authorized_proxy_users.clone(),
                cert_request_verify_ip: config.cert_request_verify_ip,
            },
            roles: config.roles.clone(),
            instance_fault: std::sync::atomic::AtomicU16::new(0),
            registers: register_log::RegisterLog::default(),
        });

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(io(format!("binding {}", config.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the bound address"))?;
        let mut metrics_registry = prometheus_client::registry::Registry::with_prefix("dev_zts");
        let metrics = HttpMetrics::register_tls(&mut metrics_registry);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = Server::new(
            Listener::Tcp(listener),
            Arc::new(ZtsHandler::new(state.clone())),
        )
        .with_tls(server_config)
        .with_limits(ServerLimits {
            max_connections: 4096,
            ..ServerLimits::default()
        })
        .with_metrics(metrics);
        let task = tokio::spawn(server.serve(async {
            let _ = rx.await;
        }));
        let url_ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        Ok(Self {
            url: format!("https://{}/zts/v1", SocketAddr::new(url_ip, addr.port())),
            addr,
            root_pem,
            state,
            files: dir.to_owned(),
            _tempdir: None,
            shutdown: Some(tx),
            task: Some(task),
            metrics: Arc::new(metrics_registry),
        })
    }

    /// Base URL, ending in `/zts/v1`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The root CA (PEM) that verifies ZTS and everything it issues.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// `GET /oauth2/keys` over HTTPS, trusting only the root, as a token verifier fetches it.
    pub async fn fetch_jwks(&self) -> Result<serde_json::Value, String> {
        let root = reqwest::Certificate::from_pem(self.root_pem.as_bytes())
            .map_err(|e| format!("the root: {e}"))?;
        let client = reqwest::Client::builder()
            .tls_certs_only([root])
            .build()
            .map_err(|e| format!("an HTTPS client: {e}"))?;
        client
            .get(format!("{}/oauth2/keys", self.url))
            .send()
            .await
            .map_err(|e| format!("GET /oauth2/keys: {e}"))?
            .json()
            .await
            .map_err(|e| format!("the JWKS: {e}"))
    }

    /// Path of `ca.pem` (the root).
    pub fn ca_path(&self) -> PathBuf {
        self.files.join("ca.pem")
    }

    /// The CA bundle ZTS returns with certificates now (intermediate then root).
    pub fn ca_bundle(&self) -> &str {
        self.state.cas.bundle()
    }

    /// The first intermediate, which signs everything until a rotation: mint provider, client
    /// and service certificates trusted by ZTS with it.
    pub fn ca(&self) -> &CertAuthority {
        self.state.cas.first_signer()
    }

    /// Moves ZTS to its next CA (its certificate and its signer; [`ca_rotation`]); the next
    /// root is `next-ca.pem` beside [`Self::ca_path`]. Returns whether it moved now.
    pub fn rotate_ca(&self) -> Result<bool, ca_rotation::CaRotationError> {
        self.state.cas.rotate()
    }

    /// The public key (SubjectPublicKeyInfo PEM) of the key that signs ntokens, role tokens and
    /// access tokens (as ZTS publishes its public keys).
    pub fn token_public_key_pem(&self) -> String {
        self.state.token_key.key_pair().public_key_pem()
    }

    /// ZTS's own principal.
    pub fn principal(&self) -> &str {
        &self.state.principal
    }

    /// Registers (or replaces) a service public key.
    pub fn add_service_key(
        &self,
        service: &str,
        version: &str,
        pem: &str,
    ) -> Result<(), RegistryError> {
        self.state
            .registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add_service_key(service, version, pem)
    }

    /// Registers (or replaces) a provider.
    pub fn add_provider(&self, provider: ProviderEntry) -> Result<(), RegistryError> {
        self.state
            .registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add_provider(provider)
    }

    /// Answers every instance register and refresh with `status` (`None`: as usual).
    pub fn set_instance_fault(&self, status: Option<http::StatusCode>) {
        self.state.instance_fault.store(
            status.map_or(0, |s| s.as_u16()),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Every instance register so far (arrival and end) and the most under way at once.
    pub fn registers(&self) -> &register_log::RegisterLog {
        &self.state.registers
    }

    /// What ZTS remembers of an instance.
    pub fn instance(&self, key: &InstanceKey) -> Option<InstanceRecord> {
        self.state.instances.get(key)
    }

    /// Stops accepting and waits for in-flight requests.
    pub async fn stop(mut self) {
        self.stop_inner().await;
    }

    async fn stop_inner(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for DevZts {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// What a standalone dev ZTS writes to `<state-dir>/zts.json` for scripts: where it is and the CA
/// that verifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandaloneInfo {
    /// Base URL ending in `/zts/v1`.
    pub url: String,
    /// Path of the root CA.
    pub ca: PathBuf,
}

/// Runs a dev ZTS until `shutdown` completes, with its files and `zts.json` in `state_dir`;
/// with `faults_file`, follows its `zts_instance_status` ([`crate::faults`]).
pub async fn run_standalone(
    config: DevZtsConfig,
    state_dir: &Path,
    faults_file: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DevZtsError> {
    let zts = DevZts::start_in(config, state_dir).await?;
    let follower = faults_file.map(|path| {
        let state = zts.state.clone();
        tokio::spawn(crate::faults::follow(path, move |f| {
            state.instance_fault.store(
                f.zts_instance_status.unwrap_or(0),
                std::sync::atomic::Ordering::SeqCst,
            );
            if f.zts_next_ca
                && let Err(e) = state.cas.rotate()
            {
                tracing::error!(error = %e, "the dev ZTS could not move to its next CA");
            }
        }))
    });
    let info = StandaloneInfo {
        url: zts.url().to_owned(),
        ca: zts.ca_path(),
    };
    let json = serde_json::to_vec_pretty(&info).map_err(|e| DevZtsError::Config {
        path: state_dir.join("zts.json"),
        reason: e.to_string(),
    })?;
    crate::pki::write_file(&state_dir.join("zts.json"), &json, 0o644)?;
    tracing::info!(url = %info.url, ca = %info.ca.display(), "dev ZTS ready");
    shutdown.await;
    if let Some(follower) = follower {
        follower.abort();
    }
    zts.stop().await;
    Ok(())
}
