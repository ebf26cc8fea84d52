//! `init` and `refresh`.

use crate::Settings;
use crate::client::{AgentClient, AgentError};
use crate::sds::{Publisher, Sds, Snapshot};
use athenz_core::agent_api::{IdentityResponse, RefreshRequest};
use athenz_core::crypto::CertInfo;
use athenz_core::files::{
    CA_FILE, CERT_FILE, Credentials, FileSet, KEY_FILE, Owner, write_credentials,
};
use athenz_core::refresh::{Backoff, RefreshPolicy, random_unit};
use athenz_core::secret::Secret;
use athenz_core::volume::VolumeId;
use std::future::Future;
use std::time::{Duration, Instant};

/// A configured SIA.
pub struct Sia {
    settings: Settings,
    client: AgentClient,
    set: FileSet,
    owner: Option<Owner>,
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
        Ok(Self {
            client: AgentClient::new(settings.endpoint.clone(), id, settings.request_timeout),
            set: FileSet::new(&settings.out_dir),
            owner,
            settings,
        })
    }

    fn write(&self, answer: &IdentityResponse) -> Result<(), String> {
        write_credentials(
            &self.set,
            &Credentials {
                key_pem: Some(&answer.key_pem),
                cert_pem: &answer.cert_pem,
                ca_pem: &answer.ca_cert_pem,
                ntoken: &answer.ntoken,
            },
            self.owner,
        )
        .map_err(|e| e.to_string())
    }

    /// Gets the identity and writes it, retrying transient failures until `--init-timeout`.
    pub async fn init(&self) -> Result<(), String> {
        let deadline = Instant::now() + self.settings.init_timeout;
        let backoff = Backoff {
            base: Duration::from_millis(250),
            max: Duration::from_secs(10),
        };
        let mut attempt = 0;
        loop {
            match self.client.init().await {
                Ok(answer) => {
                    self.write(&answer)?;
                    tracing::info!(expires = %answer.expires_at, out_dir = %self.settings.out_dir.display(), "identity written");
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
    /// right after it is written.
    pub async fn refresh(&self, shutdown: impl Future<Output = ()>) -> Result<(), String> {
        let Some(socket) = &self.settings.sds_socket else {
            return self.refresh_files(shutdown, None).await;
        };
        let (sds, publisher) = Sds::new(self.current_snapshot()?);
        let stop = athenz_core::daemon::Shutdown::new();
        let server = crate::sds::serve(socket, self.owner.and_then(|o| o.gid), sds, stop.wait())?;
        tracing::info!(socket = %socket.display(), "serving SDS");
        let outcome = self.refresh_files(shutdown, Some(&publisher)).await;
        stop.trigger();
        let _ = server.await;
        outcome
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
        let mut wait = policy.delay(
            info.not_before,
            info.not_after,
            time::OffsetDateTime::now_utc(),
            random_unit(),
        );
        let mut failures = 0u32;
        loop {
            tracing::debug!(?wait, "next refresh");
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
            let outcome = match self.current() {
                Ok((pair, _)) => match self.client.refresh(&pair).await {
                    Ok(answer) => Ok(answer),
                    // refused for good (the pod replaced or being deleted, its certificate no
                    // longer accepted): say so and stop, rather than retry for ever
                    Err(e) if !e.is_transient() => {
                        return Err(format!("{e} (not retried: it cannot heal)"));
                    }
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e),
            };
            match outcome.and_then(|answer| self.write(&answer).map(|()| answer)) {
                Ok(answer) => {
                    tracing::info!(expires = %answer.expires_at, "identity refreshed");
                    if let Some(sds) = sds {
                        match Snapshot::new(
                            answer.key_pem.clone(),
                            answer.cert_pem.clone(),
                            answer.ca_cert_pem.clone(),
                        ) {
                            Ok(snapshot) => sds.publish(snapshot),
                            Err(e) => tracing::warn!(error = %e, "not pushed over SDS"),
                        }
                    }
                    failures = 0;
                    info = CertInfo::from_pem(&answer.cert_pem).map_err(|e| e.to_string())?;
                    wait = policy.delay(
                        info.not_before,
                        info.not_after,
                        time::OffsetDateTime::now_utc(),
                        random_unit(),
                    );
                }
                Err(e) => {
                    wait = backoff.delay(failures, random_unit());
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, retry_in = ?wait, "refresh failed; keeping the current files");
                }
            }
        }
    }
}
