//! Athenz's own ZTS as a process: the server built from Athenz's source by
//! `harness/peers/athenz/zts/build` (docs/real-zts.md), run in Athenz's Jetty container with
//! its own TLS, its key-store certificate signer, its file certificate records, and our
//! domain-files store in place of ZMS. It takes the same [`DevZtsConfig`] the dev ZTS takes,
//! so the same test or node can run against either, and a [`CertAuthority`] to sign with, so a
//! test mints client identities ZTS trusts as it does with the dev ZTS.

pub mod domains;
mod files;
mod hosts;

use crate::pki::{CertAuthority, PkiError};
use crate::zts::DevZtsConfig;
use files::Layout;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The Athenz version `harness/peers/athenz/zts/build` builds.
pub const ATHENZ_VERSION: &str = "1.12.44";

/// How long ZTS may take to answer its status after start: a JVM, Jetty and the war's
/// deployment; about 15 s on this machine's 2 cores, far longer on a loaded one.
const START_TIMEOUT: Duration = Duration::from_secs(240);

/// How often ZTS looks for changed domain files (`athenz.zts.zms_domain_update_timeout`;
/// Athenz's default is 60 s).
pub const DOMAIN_POLL: Duration = Duration::from_secs(5);

/// New settings for a running ZTS's domains ([`run_standalone`]), and whom to tell once ZTS
/// has had the time to load them (or why they could not be written).
pub struct DomainUpdate {
    /// The settings, as a whole.
    pub settings: DevZtsConfig,
    /// Told when done.
    pub done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

/// Why real ZTS could not be set up or started.
#[derive(Debug, thiserror::Error)]
pub enum RealZtsError {
    /// The build has not run.
    #[error(
        "real ZTS is not built: {} is missing (run harness/peers/athenz/zts/build --source DIR; docs/real-zts.md)",
        .0.display()
    )]
    NotBuilt(PathBuf),
    /// A tool is not installed.
    #[error("{tool} could not be run (is it installed?): {source}")]
    MissingTool {
        tool: String,
        source: std::io::Error,
    },
    /// A tool failed.
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
    /// The settings cannot be said as Athenz domain data, or a file is unusable.
    #[error("{0}")]
    Data(String),
    /// A file could not be written or read.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// Test PKI.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// ZTS did not come up.
    #[error("ZTS did not answer {url}/oauth2/keys within {} s; the end of its log ({}):\n{tail}", START_TIMEOUT.as_secs(), log.display())]
    NotReady {
        url: String,
        log: PathBuf,
        tail: String,
    },
    /// ZTS exited.
    #[error("ZTS exited ({status}) while starting; the end of its log ({}):\n{tail}", log.display())]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
}

/// Where `harness/peers/athenz/zts/build` leaves the runnable tree: `$ATHENZ_ZTS_HOME`, else
/// under the workspace's target directory.
pub fn default_home() -> PathBuf {
    if let Some(home) = std::env::var_os("ATHENZ_ZTS_HOME") {
        return PathBuf::from(home);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target")
                .to_path_buf()
        },
        PathBuf::from,
    );
    target
        .join("athenz-zts")
        .join(format!("athenz-zts-{ATHENZ_VERSION}"))
}

/// What real ZTS runs with.
pub struct RealZtsConfig<'a> {
    /// The built tree (`default_home()`).
    pub home: PathBuf,
    /// Its work directory: keys, stores, properties, domains, records, log (0700).
    pub work: PathBuf,
    /// The settings, as the dev ZTS takes them.
    pub settings: &'a DevZtsConfig,
    /// The CA ZTS signs certificates with (its key-store signer) and issues its own TLS
    /// certificate from; the CA's root is what clients trust.
    pub signer: &'a CertAuthority,
}

/// A running real ZTS; stopped (SIGTERM, then SIGKILL) when stopped or dropped.
pub struct RealZts {
    url: String,
    root_pem: String,
    log: PathBuf,
    child: Option<tokio::process::Child>,
    /// The built tree and the work directory, for [`RealZts::update_domains`].
    home: PathBuf,
    work: PathBuf,
    /// Keeps the hosts file's provider names current while ZTS runs.
    hosts_refresher: Option<tokio::task::JoinHandle<()>>,
}

impl RealZts {
    /// Writes its files and starts it, on `settings.listen` (port 0: a free port); returns once
    /// it serves its JWKS.
    pub async fn start(config: RealZtsConfig<'_>) -> Result<Self, RealZtsError> {
        let war = config.home.join("webapps/zts.war");
        if !war.is_file() {
            return Err(RealZtsError::NotBuilt(war));
        }
        let layout = Layout {
            work: config.work.clone(),
        };
        for dir in [
            "keys",
            "certs",
            "conf",
            "domains/signed",
            "var",
            "logs",
            "tmp",
        ] {
            let path = layout.path(dir);
            std::fs::create_dir_all(&path).map_err(|source| RealZtsError::Io {
                what: format!("creating {}", path.display()),
                source,
            })?;
        }
        files::set_private(&config.work)?;
        let listen = free_port(config.settings.listen)?;
        let url = format!("https://{}/zts/v1", url_host(listen));
        let (zts_public, zms_public) = files::write_keys(&layout)?;
        files::write_stores(&layout, config.signer, config.settings, listen)?;
        files::write_athenz_conf(&layout, &url, &zts_public, &zms_public)?;
        files::write_properties(&layout, &config.home, config.settings, listen, &url)?;
        files::write_domains(&layout, &config.home, config.settings)?;

        let hosts = hosts::HostsFile::for_settings(config.settings, layout.path("conf/hosts"));
        if let Some(hosts) = &hosts {
            hosts.refresh().await?;
        }

        let log = layout.path("zts.log");
        let out = std::fs::File::create(&log).map_err(|source| RealZtsError::Io {
            what: format!("creating {}", log.display()),
            source,
        })?;
        let err = out.try_clone().map_err(|source| RealZtsError::Io {
            what: format!("opening {}", log.display()),
            source,
        })?;
        let p = |relative: &str| layout.path(relative).display().to_string();
        let hosts_flag = hosts
            .as_ref()
            .map(|h| format!("-Djdk.net.hosts.file={}", h.path().display()));
        let child = tokio::process::Command::new("java")
            .args(hosts_flag)
            .args([
                // a bounded heap: ZTS's working set for a test's domains is far below it
                "-Xmx512m".to_owned(),
                format!("-Djava.io.tmpdir={}", p("tmp")),
                format!("-Dathenz.root_dir={}", config.work.display()),
                format!("-Dathenz.zts.root_dir={}", config.work.display()),
                format!("-Dathenz.jetty_home={}", config.home.display()),
                format!("-Dathenz.prop_file={}", p("conf/athenz.properties")),
                format!("-Dathenz.zts.prop_file={}", p("conf/zts.properties")),
                format!("-Dathenz.athenz_conf={}", p("conf/athenz.conf")),
                format!("-Dlogback.configurationFile={}", p("conf/logback.xml")),
                format!("-Djavax.net.ssl.trustStore={}", p("certs/truststore.jks")),
                format!(
                    "-Djavax.net.ssl.trustStorePassword={}",
                    files::STORE_PASSWORD
                ),
                "-cp".to_owned(),
                format!("{}/lib/jars/*", config.home.display()),
                "com.yahoo.athenz.container.AthenzJettyContainer".to_owned(),
            ])
            .current_dir(&config.work)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| RealZtsError::MissingTool {
                tool: "java".into(),
                source,
            })?;
        let mut zts = Self {
            url,
            root_pem: config.signer.root_pem().to_owned(),
            log,
            child: Some(child),
            home: config.home.clone(),
            work: config.work.clone(),
            hosts_refresher: hosts.map(hosts::HostsFile::spawn_refresher),
        };
        zts.wait_ready().await?;
        Ok(zts)
    }

    async fn wait_ready(&mut self) -> Result<(), RealZtsError> {
        let ca = reqwest::Certificate::from_pem(self.root_pem.as_bytes())
            .map_err(|e| RealZtsError::Data(format!("the signer's root: {e}")))?;
        let http = reqwest::Client::builder()
            .tls_certs_only([ca])
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| RealZtsError::Data(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(RealZtsError::Exited {
                    status,
                    log: self.log.clone(),
                    tail: self.log_tail(40),
                });
            }
            // its JWKS: served to anyone once ZTS is up (its /status asks for credentials)
            let answer = http
                .get(format!("{}/oauth2/keys?rfc=true", self.url))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(RealZtsError::NotReady {
            url: self.url.clone(),
            log: self.log.clone(),
            tail: self.log_tail(40),
        })
    }

    /// Base URL, ending in `/zts/v1`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The root clients trust for ZTS and for the certificates it issues.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Writes and signs the domains of `settings` again, as a ZMS administrator changes them
    /// (a tenant domain or service added), and returns once ZTS has had the time to load them:
    /// its next look at the directory, within [`DOMAIN_POLL`], and a second more. Returns how
    /// many domains were written. A domain no longer named keeps its file, as a domain outlives
    /// its last instance in ZMS.
    pub async fn update_domains(&self, settings: &DevZtsConfig) -> Result<usize, RealZtsError> {
        let layout = Layout {
            work: self.work.clone(),
        };
        let home = self.home.clone();
        let settings = settings.clone();
        let written =
            tokio::task::spawn_blocking(move || files::write_domains(&layout, &home, &settings))
                .await
                .map_err(|e| RealZtsError::Data(format!("signing the domains: {e}")))??;
        tokio::time::sleep(DOMAIN_POLL + Duration::from_secs(1)).await;
        Ok(written)
    }

    /// SIGTERM, up to 30 s for Jetty to stop, then SIGKILL.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take()
            && crate::process::terminate(&mut child, Duration::from_secs(30))
                .await
                .is_none()
        {
            let _ = child.kill().await;
        }
    }
}

impl Drop for RealZts {
    fn drop(&mut self) {
        if let Some(refresher) = self.hosts_refresher.take() {
            refresher.abort();
        }
    }
}

/// Runs real ZTS until `shutdown` completes, as `zts::run_standalone` runs the dev ZTS: a fresh
/// test CA signs (its root in `state_dir/ca.pem`), ZTS's files under `state_dir/athenz-zts`,
/// and `state_dir/zts.json` ({url, ca}) written once it serves. Each update `updates` sends
/// becomes its domains ([`RealZts::update_domains`]); a failed update is logged, told to its
/// sender, and ZTS keeps what it had.
pub async fn run_standalone(
    settings: DevZtsConfig,
    home: PathBuf,
    state_dir: &Path,
    mut updates: Option<tokio::sync::mpsc::Receiver<DomainUpdate>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RealZtsError> {
    let signer = CertAuthority::new_root("Athenz ZTS Test Root")?
        .new_intermediate("Athenz ZTS Test Signer")?;
    let ca = state_dir.join("ca.pem");
    crate::pki::write_file(&ca, signer.root_pem().as_bytes(), 0o644)?;
    let zts = RealZts::start(RealZtsConfig {
        home,
        work: state_dir.join("athenz-zts"),
        settings: &settings,
        signer: &signer,
    })
    .await?;
    let info = crate::zts::StandaloneInfo {
        url: zts.url().to_owned(),
        ca,
    };
    let json = serde_json::to_vec_pretty(&info).map_err(|e| RealZtsError::Data(e.to_string()))?;
    crate::pki::write_file(&state_dir.join("zts.json"), &json, 0o644)?;
    tracing::info!(url = %info.url, log = %zts.log().display(), "Athenz's ZTS ready");
    tokio::pin!(shutdown);
    loop {
        let next = async {
            match updates.as_mut() {
                Some(updates) => updates.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => break,
            update = next => match update {
                Some(DomainUpdate { settings, done }) => {
                    let outcome = zts.update_domains(&settings).await;
                    match &outcome {
                        Ok(count) => tracing::info!(domains = count, "Athenz's ZTS: domains updated"),
                        Err(e) => tracing::error!(error = %e, "Athenz's ZTS: updating its domains"),
                    }
                    if let Some(done) = done {
                        let _ = done.send(outcome.map(|_| ()).map_err(|e| e.to_string()));
                    }
                }
                // the sender is gone: no more updates, run until shutdown
                None => updates = None,
            },
        }
    }
    zts.stop().await;
    Ok(())
}

/// `listen`, its port chosen now when 0 (Jetty takes a fixed port; the moment between choosing
/// and Jetty binding it is the only race, and loopback ports are not contended here).
fn free_port(listen: SocketAddr) -> Result<SocketAddr, RealZtsError> {
    if listen.port() != 0 {
        return Ok(listen);
    }
    let probe = std::net::TcpListener::bind(listen).map_err(|source| RealZtsError::Io {
        what: format!("choosing a port on {}", listen.ip()),
        source,
    })?;
    probe.local_addr().map_err(|source| RealZtsError::Io {
        what: "reading the chosen port".into(),
        source,
    })
}

fn url_host(listen: SocketAddr) -> SocketAddr {
    if listen.ip().is_unspecified() {
        SocketAddr::new(std::net::IpAddr::from([127, 0, 0, 1]), listen.port())
    } else {
        listen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unbuilt_zts_is_named_with_how_to_build_it() {
        let dir = tempfile::tempdir().unwrap();
        let signer = CertAuthority::new_root("t").unwrap();
        let err = RealZts::start(RealZtsConfig {
            home: dir.path().join("nothing"),
            work: dir.path().join("work"),
            settings: &DevZtsConfig::default(),
            signer: &signer,
        })
        .await
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("nothing/webapps/zts.war is missing")
                && err.contains("harness/peers/athenz/zts/build --source"),
            "{err}"
        );
        assert!(!dir.path().join("work").exists(), "nothing written");
    }
}
