//! `init` and `refresh`.

use crate::Settings;
use crate::authz::cache::CachePolicy;
use crate::authz::server::{ServerSettings, TokenServer};
use crate::authz::targets::{TokenTypes, parse_targets};
use crate::authz::zts::ZtsAccess;
use crate::authz::{Authz, TargetFailure};
use crate::client::{AgentClient, AgentError};
use crate::pod_key::PodKey;
use crate::pod_refresh::{PodRefreshError, ZtsRoute};
use crate::sds::{Publisher, Sds, Snapshot};
use athenz_core::agent_api::KeySource;
use athenz_core::agent_api::{IdentityResponse, RefreshRequest};
use athenz_core::crypto::CertInfo;
use athenz_core::files::{
    CA_FILE, CERT_FILE, Credentials, FileSet, FileSpec, KEY_FILE, NTOKEN_FILE, Owner,
    credential_files,
};
use athenz_core::refresh::{Backoff, RefreshPolicy, random_unit};
use athenz_core::secret::Secret;
use athenz_core::volume::VolumeId;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest the sidecar sleeps between looks at its tokens.
const AUTHZ_IDLE: Duration = Duration::from_secs(3600);
/// The shortest: a due slot is fetched or backs off, never spun on.
const AUTHZ_MIN_WAIT: Duration = Duration::from_millis(100);

/// Connections the token server serves at once; more wait in the listen backlog. Each costs
/// ~23 KiB of buffers (1,000 at once took the sidecar from 11 to 34 MiB, past the template's
/// 32 MiB limit): 256 bound it to ~6 MiB.
const TOKEN_SERVER_CONNECTIONS: usize = 256;
/// How long an idle keep-alive connection (or one sending its headers) may hold a slot: on
/// loopback a reconnect is cheap, and a client pool holding idle connections must not keep
/// others waiting in the backlog for long.
const TOKEN_SERVER_IDLE: Duration = Duration::from_secs(3);

/// Serves `handler` over plain HTTP on `addr` until `stop`; `setting` names the flag in errors.
async fn serve_tcp<H: athenz_core::http::Handler>(
    addr: SocketAddr,
    handler: H,
    max_connections: usize,
    stop: impl Future<Output = ()> + Send + 'static,
    setting: &str,
) -> Result<tokio::task::JoinHandle<()>, String> {
    use athenz_core::http::{Listener, Server, ServerLimits};
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{setting}: cannot listen on {addr}: {e}"))?;
    let server =
        Server::new(Listener::Tcp(listener), Arc::new(handler)).with_limits(ServerLimits {
            max_body: 16 * 1024,
            header_timeout: TOKEN_SERVER_IDLE,
            body_timeout: TOKEN_SERVER_IDLE,
            max_connections,
            grace: Duration::from_secs(1),
            ..ServerLimits::default()
        });
    Ok(tokio::spawn(server.serve(stop)))
}

/// A configured SIA.
pub struct Sia {
    settings: Settings,
    client: AgentClient,
    set: FileSet,
    owner: Option<Owner>,
    /// Role certificates and tokens, when targets or a token server are configured.
    authz: Option<Arc<Authz>>,
    /// The token server: where, and how.
    token_server: Option<TokenServerSetup>,
    /// Where `/metrics` and `/healthz` are served.
    metrics_addr: Option<SocketAddr>,
    /// One writer of the set at a time (identity refresh and token renewal both write it).
    write_lock: Mutex<()>,
    /// How refreshes reach ZTS with a pod-made key (`None` with --key-source agent).
    zts_route: Option<ZtsRoute>,
}

/// With a pod-made key: through the agent's tunnel, or to --zts-url (`--refresh-route direct`).
fn load_zts_route(settings: &Settings) -> Result<Option<ZtsRoute>, String> {
    if settings.key_source != KeySource::Pod {
        return Ok(None);
    }
    if settings.refresh_route == crate::RefreshRoute::Tunnel {
        return Ok(Some(ZtsRoute::Tunnel { ca: None }));
    }
    let url = settings
        .zts_url
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or("--zts-url (ZTS_URL) is required with --refresh-route direct")?;
    let ca = settings.zts_ca_path();
    // followed as the file changes: a ZTS CA rotation reaches direct refreshes with no restart
    let ca = athenz_core::tls::ServerCaBundle::from_file(&ca)
        .map_err(|e| format!("--zts-ca (SERVER_CA_CERT) {}: {e}", ca.display()))?;
    let zts = athenz_core::zts::ZtsClient::new(athenz_core::zts::ZtsClientConfig {
        url: url.to_owned(),
        ca,
        timeout: settings.zts_timeout,
        connect_timeout: settings.zts_timeout,
    })
    .map_err(|e| format!("--zts-url (ZTS_URL): {e}"))?;
    Ok(Some(ZtsRoute::Direct(zts)))
}

/// Where the token server listens, and how it serves.
type TokenServerSetup = (SocketAddr, ServerSettings);

/// The authorization part of the settings, checked; errors name the setting.
fn load_authz(
    settings: &Settings,
) -> Result<(Option<Arc<Authz>>, Option<TokenServerSetup>), String> {
    let targets = parse_targets(&settings.target_domain_roles)
        .map_err(|e| format!("--target-domain-roles (TARGET_DOMAIN_ROLES): {e}"))?;
    let types = TokenTypes::parse(&settings.token_type)
        .map_err(|e| format!("--token-type (TOKEN_TYPE): {e}"))?;
    let server_addr = match &settings.token_server_addr {
        Some(a) if !a.is_empty() => Some(
            crate::parse_listen_addr(a)
                .map_err(|e| format!("--token-server-addr (TOKEN_SERVER_ADDR): {e}"))?,
        ),
        _ => None,
    };
    if targets.is_empty() && server_addr.is_none() {
        return Ok((None, None));
    }
    let expiry = settings.token_expiry;
    if !expiry.is_zero() && settings.token_refresh_interval >= expiry {
        return Err(format!(
            "--token-refresh-interval (TOKEN_REFRESH_INTERVAL) {:?} must be shorter than --token-expiry (TOKEN_EXPIRY) {expiry:?}",
            settings.token_refresh_interval
        ));
    }
    let url = settings
        .zts_url
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(
            "--zts-url (ZTS_URL) is required with --target-domain-roles or --token-server-addr",
        )?;
    let ca = settings.zts_ca_path();
    let zts = ZtsAccess::new(url, &ca, settings.zts_timeout).map_err(|e| {
        format!(
            "--zts-url / --zts-ca (SERVER_CA_CERT; default: the agent's copy beside --endpoint) {}: {e}",
            ca.display()
        )
    })?;
    let role_auth_header = http::HeaderName::try_from(settings.role_auth_header.as_str())
        .map_err(|e| format!("--role-auth-header (ROLE_AUTH_HEADER): {e}"))?;
    let policy = CachePolicy {
        refresh_interval: settings.token_refresh_interval,
        ..CachePolicy::default()
    };
    let authz = Authz::new(
        Arc::new(zts),
        targets.clone(),
        types,
        policy,
        expiry.as_secs(),
    );
    let server = server_addr.map(|addr| {
        (
            addr,
            ServerSettings {
                rest_api: settings.token_server_rest_api,
                header_mode: settings.use_token_server,
                types,
                targets,
                default_expiry: expiry.as_secs(),
                timeout: settings.token_server_timeout,
                role_auth_header,
            },
        )
    });
    Ok((Some(Arc::new(authz)), server))
}

/// Says what could not be had, one line per file.
fn describe(failures: &[TargetFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Sia {
    /// Reads the volume id and resolves the owner; errors name the setting.
    pub fn load(settings: Settings) -> Result<Self, String> {
        crate::client::check_endpoint(&settings.endpoint)
            .map_err(|e| format!("--endpoint (ENDPOINT): {e}"))?;
        let raw = std::fs::read_to_string(&settings.id_file)
            .map_err(|e| format!("--id-file (ID_FILE) {}: {e}", settings.id_file.display()))?;
        let id = VolumeId::parse(raw.trim()).map_err(|e| format!("--id-file (ID_FILE): {e}"))?;
        let gid = match &settings.group {
            Some(g) => Some(
                athenz_core::files::resolve_group(g)
                    .map_err(|e| format!("--group (GROUP): {e}"))?,
            ),
            None => None,
        };
        let owner = (gid.is_some() || settings.owner_uid.is_some()).then_some(Owner {
            uid: settings.owner_uid,
            gid,
        });
        let (authz, token_server) = load_authz(&settings)?;
        let metrics_addr = match &settings.metrics_server_addr {
            Some(a) if !a.is_empty() => Some(
                crate::parse_listen_addr(a)
                    .map_err(|e| format!("--metrics-server-addr (METRICS_SERVER_ADDR): {e}"))?,
            ),
            _ => None,
        };
        let zts_route = load_zts_route(&settings)?;
        Ok(Self {
            zts_route,
            client: AgentClient::new(settings.endpoint.clone(), id, settings.request_timeout),
            set: FileSet::new(&settings.out_dir),
            owner,
            authz,
            token_server,
            metrics_addr,
            write_lock: Mutex::new(()),
            settings,
        })
    }

    /// Writes the identity and, with it, the targets' role certificates and tokens as one set.
    fn write_set(&self, creds: &Credentials<'_>) -> Result<(), String> {
        let _one_writer = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let authz_files = match &self.authz {
            Some(authz) => authz.files(&self.set, self.owner),
            None => Vec::new(),
        };
        let mut files = credential_files(creds, self.owner);
        files.extend(authz_files.iter().map(|(name, contents, mode)| FileSpec {
            name,
            contents,
            mode: *mode,
        }));
        self.set
            .write(&files, self.owner)
            .map_err(|e| e.to_string())
    }

    fn write(&self, answer: &IdentityResponse) -> Result<(), String> {
        let creds = answer
            .credentials_with_key()
            .ok_or("the answer carries no key and none was made here")?;
        self.write_set(&creds)
    }

    /// Rewrites the set with the identity on disk and the targets' current files.
    fn rewrite_with_identity_on_disk(&self) -> Result<(), String> {
        let [key, cert, ca, ntoken] =
            self.read_set([KEY_FILE, CERT_FILE, CA_FILE, NTOKEN_FILE], "rewrite")?;
        self.write_set(&Credentials {
            key_pem: Some(&Secret::new(key)),
            cert_pem: &cert,
            ca_pem: &ca,
            ntoken: &Secret::new(ntoken),
        })
    }

    /// `init`: the targets' role certificates and tokens for the new identity, all of them,
    /// retrying what may pass until `deadline`; a refusal (not a member, unknown role) fails at once.
    async fn authorize_all(
        &self,
        authz: &Authz,
        answer: &IdentityResponse,
        deadline: Instant,
    ) -> Result<(), String> {
        let key_pem = answer.key_pem.clone().unwrap_or_default();
        let mut failures = authz.rotate(&key_pem, &answer.cert_pem).await?;
        loop {
            if failures.is_empty() {
                return Ok(());
            }
            if let Some(refused) = failures.iter().find(|f| !f.error.is_transient()) {
                return Err(format!(
                    "role certificates and tokens: {refused} (not retried: it cannot heal)"
                ));
            }
            let wait = authz.next_due_in(Duration::from_secs(10));
            if Instant::now() + wait >= deadline {
                return Err(format!(
                    "role certificates and tokens: gave up after {:?}: {}",
                    self.settings.init_timeout,
                    describe(&failures)
                ));
            }
            tracing::info!(failed = %describe(&failures), retry_in = ?wait, "role certificates or tokens not ready; retrying");
            tokio::time::sleep(wait).await;
            failures = authz.renew().await.1;
        }
    }

    /// Gets the identity and writes it, retrying transient failures until `--init-timeout`.
    /// `started` is when the process started: the closing log line says how long init took
    /// (`took_ms`), the part of a pod's start an operator can attribute to its identity.
    pub async fn init(&self, started: Instant) -> Result<(), String> {
        let deadline = Instant::now() + self.settings.init_timeout;
        let backoff = Backoff {
            base: Duration::from_millis(250),
            max: Duration::from_secs(10),
        };
        let mut attempt = 0;
        // one key for every attempt: an RSA key costs tens of milliseconds, and a refused CSR
        // says nothing against the key
        let pod_key = match self.settings.key_source {
            KeySource::Pod => Some(PodKey::generate(self.settings.key_algorithm)?),
            KeySource::Agent => None,
        };
        loop {
            match self.register(pod_key.as_ref()).await {
                Ok(answer) => {
                    if let Some(authz) = &self.authz {
                        self.authorize_all(authz, &answer, deadline).await?;
                    }
                    self.write(&answer)?;
                    let took_ms = (started.elapsed().as_secs_f64() * 1e4).round() / 10.0;
                    tracing::info!(expires = %answer.expires_at, out_dir = %self.settings.out_dir.display(), took_ms, "identity written");
                    return Ok(());
                }
                Err(e) if e.is_transient() => {
                    let mut wait = backoff.delay(attempt, random_unit());
                    if let AgentError::Refused {
                        retry_after: Some(s),
                        ..
                    } = &e
                    {
                        wait = wait.max(Duration::from_secs(*s).min(backoff.max));
                    }
                    if Instant::now() + wait >= deadline {
                        return Err(format!(
                            "gave up after {:?}: {e}",
                            self.settings.init_timeout
                        ));
                    }
                    tracing::info!(error = %e, retry_in = ?wait, "not ready yet; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(e) => return Err(format!("{e} (not retried: it cannot heal)")),
            }
        }
    }

    /// One registration through the agent: with `pod_key`, the agent's template, this pod's CSR
    /// and the answer completed with the key that never left the pod; without, the agent's key.
    async fn register(&self, pod_key: Option<&PodKey>) -> Result<IdentityResponse, AgentError> {
        let Some(key) = pod_key else {
            return self.client.init().await;
        };
        let template = self.client.csr_template().await?;
        let csr = key.csr(template).map_err(AgentError::BadAnswer)?;
        let mut answer = self.client.init_with_csr(csr).await?;
        if answer.key_pem.is_some() {
            return Err(AgentError::BadAnswer(
                "the agent sent a key although this pod made its own".into(),
            ));
        }
        key.check_certificate(&answer.cert_pem)
            .map_err(AgentError::BadAnswer)?;
        answer.key_pem = Some(key.pem().clone());
        Ok(answer)
    }

    /// One refresh: through the agent with its key, or with ZTS itself with a new pod-made key.
    async fn refresh_once(
        &self,
        pair: &RefreshRequest,
    ) -> Result<Result<IdentityResponse, String>, String> {
        let Some(route) = &self.zts_route else {
            return retry_unless_misconfigured(self.client.refresh(pair).await);
        };
        let refreshed = crate::pod_refresh::refresh(
            &self.client,
            route,
            self.settings.key_algorithm,
            &pair.key_pem,
            &pair.cert_pem,
            self.settings.zts_timeout,
        )
        .await;
        match refreshed {
            Ok(answer) => Ok(Ok(answer)),
            Err(PodRefreshError::Agent(e)) => retry_unless_misconfigured(Err(e)),
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// With a pod-made key, tells the agent which certificate the pod holds now (its state and
    /// `status` show it); a failure only leaves them one refresh behind.
    async fn report(&self, answer: &IdentityResponse) {
        if self.zts_route.is_none() {
            return;
        }
        if let Err(e) = self.client.report_certificate(&answer.cert_pem).await {
            tracing::warn!(error = %e, "the agent was not told the new certificate");
        }
    }

    /// The files `names` of the current set, read as one set, as text; `purpose` says what the
    /// set is wanted for when there is none.
    fn read_set<const N: usize>(
        &self,
        names: [&str; N],
        purpose: &str,
    ) -> Result<[String; N], String> {
        let files = self
            .set
            .read(&names)
            .map_err(|e| format!("no current identity to {purpose}: {e}"))?;
        let mut text = Vec::with_capacity(N);
        for (name, bytes) in names.iter().zip(files) {
            text.push(String::from_utf8(bytes).map_err(|_| format!("{name} is not PEM"))?);
        }
        text.try_into()
            .map_err(|_| format!("no current identity to {purpose}: a file is missing"))
    }

    fn current(&self) -> Result<(RefreshRequest, CertInfo), String> {
        let [key, cert] = self.read_set([KEY_FILE, CERT_FILE], "refresh")?;
        let info = CertInfo::from_pem(&cert).map_err(|e| e.to_string())?;
        Ok((
            RefreshRequest {
                key_pem: Secret::new(key),
                cert_pem: cert,
            },
            info,
        ))
    }

    /// The set on disk as SDS serves it (key, certificate and CA read as one set).
    fn current_snapshot(&self) -> Result<Snapshot, String> {
        let [key, cert, ca] = self.read_set([KEY_FILE, CERT_FILE, CA_FILE], "serve over SDS")?;
        Snapshot::new(Secret::new(key), cert, ca)
    }

    /// Refreshes before expiry until `shutdown`; keeps the old files when a refresh fails.
    /// With `--sds-socket`, serves the same credentials over SDS meanwhile, each new set pushed
    /// right after it is written; with targets, renews their role certificates and tokens and
    /// serves the token server and metrics when asked.
    pub async fn refresh(&self, shutdown: impl Future<Output = ()>) -> Result<(), String> {
        let stop = athenz_core::daemon::Shutdown::new();
        let mut servers = Vec::new();
        let outcome = async {
            let publisher = match &self.settings.sds_socket {
                Some(socket) => {
                    let (sds, publisher) = Sds::new(self.current_snapshot()?);
                    let gid = self.owner.and_then(|o| o.gid);
                    servers.push(crate::sds::serve(socket, gid, sds, stop.wait())?);
                    tracing::info!(socket = %socket.display(), "serving SDS");
                    Some(publisher)
                }
                None => None,
            };
            if let Some(authz) = &self.authz {
                self.start_authz(authz).await;
                if let Some((addr, settings)) = &self.token_server {
                    let handler = TokenServer::new(authz.cache().clone(), settings.clone());
                    servers.push(serve_tcp(*addr, handler, TOKEN_SERVER_CONNECTIONS, stop.wait(), "--token-server-addr (TOKEN_SERVER_ADDR)").await?);
                    tracing::info!(%addr, rest_api = settings.rest_api, header_mode = settings.header_mode, "serving tokens");
                }
            }
            if let Some(addr) = self.metrics_addr {
                let mut registry = prometheus_client::registry::Registry::default();
                if let Some(authz) = &self.authz {
                    registry.register_collector(Box::new(crate::authz::metrics::TokenMetrics(
                        authz.cache().clone(),
                    )));
                }
                let readiness = athenz_core::http::Readiness::default();
                readiness.set(true);
                let handler = athenz_core::http::OpsHandler::new(Arc::new(registry), readiness);
                servers.push(serve_tcp(addr, handler, 8, stop.wait(), "--metrics-server-addr (METRICS_SERVER_ADDR)").await?);
            }
            self.refresh_files(shutdown, publisher.as_ref()).await
        }
        .await;
        stop.trigger();
        for server in servers {
            let _ = server.await;
        }
        outcome
    }

    /// The sidecar's start: presents the identity on disk to ZTS and renews every target, so
    /// the tokens it serves are its own; what fails keeps init's files and is retried.
    async fn start_authz(&self, authz: &Authz) {
        let rotated = match self.current() {
            Ok((pair, _)) => authz.rotate(&pair.key_pem, &pair.cert_pem).await,
            Err(e) => Err(e),
        };
        match rotated {
            Ok(failures) if failures.is_empty() => {}
            Ok(failures) => {
                tracing::warn!(failed = %describe(&failures), "role certificates or tokens not renewed; keeping init's and retrying")
            }
            Err(e) => tracing::warn!(error = %e, "cannot present the identity to ZTS yet"),
        }
        if !authz.targets().is_empty()
            && let Err(e) = self.rewrite_with_identity_on_disk()
        {
            tracing::warn!(error = %e, "role certificates and tokens not written");
        }
    }

    async fn refresh_files(
        &self,
        shutdown: impl Future<Output = ()>,
        sds: Option<&Publisher>,
    ) -> Result<(), String> {
        let policy = RefreshPolicy {
            max_delay: self.settings.refresh_interval,
            min_delay: Duration::from_secs(1).min(self.settings.refresh_interval),
            ..RefreshPolicy::default()
        };
        let backoff = Backoff::default();
        tokio::pin!(shutdown);
        let (_, mut info) = self.current()?;
        let mut identity_due = tokio::time::Instant::now()
            + policy.delay(
                info.not_before,
                info.not_after,
                time::OffsetDateTime::now_utc(),
                random_unit(),
            );
        let mut failures = 0u32;
        loop {
            let authz_wait = self.authz.as_ref().map_or(AUTHZ_IDLE, |a| {
                a.next_due_in(AUTHZ_IDLE).max(AUTHZ_MIN_WAIT)
            });
            tracing::debug!(identity_in = ?identity_due.saturating_duration_since(tokio::time::Instant::now()), ?authz_wait, "next refresh");
            let identity = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep_until(identity_due) => true,
                _ = tokio::time::sleep(authz_wait) => false,
            };
            if !identity {
                self.renew_authz().await;
                continue;
            }
            // the expiry of the certificate a refresh presented, when the attempt is a refresh
            let mut refreshed_until = None;
            let outcome = match self.current() {
                // Expired (ZTS or the agent was away longer than it lived): no one refreshes an
                // expired certificate, so the pod registers anew, as its init container did —
                // the agent binds the call to the pod by its cgroup, not by the certificate.
                Ok((_, current)) if current.not_after <= time::OffsetDateTime::now_utc() => {
                    tracing::warn!(expired = %current.not_after, "the certificate expired; registering anew");
                    let pod_key = match self.settings.key_source {
                        KeySource::Pod => Some(PodKey::generate(self.settings.key_algorithm)?),
                        KeySource::Agent => None,
                    };
                    retry_unless_misconfigured(self.register(pod_key.as_ref()).await)?
                }
                Ok((pair, current)) => {
                    refreshed_until = Some(current.not_after);
                    self.refresh_once(&pair).await?
                }
                Err(e) => Err(e),
            };
            let outcome = match outcome {
                Ok(answer) => {
                    self.rotate_authz(&answer).await;
                    self.write(&answer).map(|()| answer)
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(answer) => {
                    tracing::info!(expires = %answer.expires_at, "identity refreshed");
                    self.report(&answer).await;
                    if let Some(sds) = sds {
                        match Snapshot::new(
                            answer.key_pem.clone().unwrap_or_default(),
                            answer.cert_pem.clone(),
                            answer.ca_cert_pem.clone(),
                        ) {
                            Ok(snapshot) => sds.publish(snapshot),
                            Err(e) => tracing::warn!(error = %e, "not pushed over SDS"),
                        }
                    }
                    failures = 0;
                    info = CertInfo::from_pem(&answer.cert_pem).map_err(|e| e.to_string())?;
                    identity_due = tokio::time::Instant::now()
                        + policy.delay(
                            info.not_before,
                            info.not_after,
                            time::OffsetDateTime::now_utc(),
                            random_unit(),
                        );
                }
                Err(e) => {
                    let now = time::OffsetDateTime::now_utc();
                    // A refresh that failed while the certificate ran out (ZTS back only after
                    // it expired, or a call that outlived it) says nothing of a registration,
                    // the next attempt: made at once, not after a backoff step spent learning
                    // that the expired certificate proves nothing. Once only: that next attempt
                    // is a registration.
                    let wait = if refreshed_until.is_some_and(|end| end <= now) {
                        Duration::ZERO
                    } else {
                        backoff.delay_before_expiry(failures, random_unit(), info.not_after, now)
                    };
                    identity_due = tokio::time::Instant::now() + wait;
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, retry_in = ?wait, "refresh failed; keeping the current files");
                }
            }
        }
    }

    /// After a rotation: role certificates and tokens for the new identity, before the set
    /// is written (a failure keeps the earlier ones; they are retried).
    async fn rotate_authz(&self, answer: &IdentityResponse) {
        let Some(authz) = &self.authz else { return };
        let key_pem = answer.key_pem.clone().unwrap_or_default();
        match authz.rotate(&key_pem, &answer.cert_pem).await {
            Ok(failures) if failures.is_empty() => {}
            Ok(failures) => {
                tracing::warn!(failed = %describe(&failures), "role certificates or tokens not renewed with the new identity; retrying")
            }
            Err(e) => tracing::warn!(error = %e, "the new identity cannot be presented to ZTS"),
        }
    }

    /// Renews the targets' role certificates and tokens that are due; rewrites the set when
    /// one changed. Failures keep the old files.
    async fn renew_authz(&self) {
        let Some(authz) = &self.authz else { return };
        let (changed, failed) = authz.renew().await;
        if !failed.is_empty() {
            tracing::warn!(failed = %describe(&failed), "role certificates or tokens not renewed; keeping the current files");
        }
        if changed > 0 && !authz.targets().is_empty() {
            match self.rewrite_with_identity_on_disk() {
                Ok(()) => tracing::info!(renewed = changed, "role certificates and tokens renewed"),
                Err(e) => {
                    tracing::warn!(error = %e, "renewed role certificates and tokens not written")
                }
            }
        }
    }
}

/// Sorts the answer to one of the refresher's calls: an error is `Ok(Err)` (retried after the
/// backoff, the files kept) for everything but a socket path that can never be connected to,
/// which ends the sidecar (`Err`).
///
/// A refusal is retried too, unlike in `init`: ZTS answers 403 not only when its provider
/// callback denies but whenever the callback cannot be asked ("unable to verify attestation
/// data"), so a refusal says nothing about whether the next attempt will pass. Exiting would not
/// stop the retries either — kubelet restarts a sidecar — it would only add its crash-loop
/// backoff (up to five minutes) while the certificate runs out. A pod that is really gone is
/// stopped by kubelet; one whose certificate expires registers anew.
fn retry_unless_misconfigured(
    called: Result<IdentityResponse, AgentError>,
) -> Result<Result<IdentityResponse, String>, String> {
    match called {
        Ok(answer) => Ok(Ok(answer)),
        Err(e @ AgentError::BadEndpoint(_)) => Err(format!("{e} (not retried: it cannot heal)")),
        Err(e) if e.is_transient() => Ok(Err(e.to_string())),
        Err(e) => Ok(Err(format!(
            "{e} (retried: ZTS refuses also while it cannot ask the provider)"
        ))),
    }
}
