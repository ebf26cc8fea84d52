//! The agent's side of the CSI driver (docs/design.md §4.10): how a files-mode volume gets and
//! renews its identity. The CSI caller is the kubelet, which vouches for the pod (its pod info
//! names the volume's pod), so there is no peer check; everything else is the socket API's path:
//! the pod as the kubelet lists it, the jwt-service, ZTS, the refresh checks and state.json.
//! [`start`] binds the CSI socket (and kubelet's registration socket) for the agent.
//! A publish is real time; a rotation's re-issue is background work (`crate::manager::queue`).

use super::Agent;
use super::RecentInit;
use crate::Config;
use crate::attest::{Claim, PodIp};
use crate::failure::Failure;
use crate::manager::early::{BoundPod, PodNames, Started};
use crate::manager::{KeyRequest, Priority};
use athenz_core::daemon::StartError;
use athenz_core::issuance::{Issued, Registration};
use athenz_core::volume::VolumesDir;
use athenz_core::volume::{VolumeData, VolumeId};
use athenz_csi_driver::{CurrentPair, IssueError, Issuer};
use http::StatusCode;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Issues files-mode identities through the agent.
pub struct AgentIssuer {
    /// The agent.
    pub agent: Arc<Agent>,
}

fn issue_error(f: Failure) -> IssueError {
    IssueError {
        // the agent's "try again" (no node identity yet, upstream away, kubelet slow) and its
        // own trouble are transient; its refusals (400/403/404) are not
        transient: f.status.is_server_error() || f.status == StatusCode::TOO_MANY_REQUESTS,
        message: f.message,
    }
}

impl Issuer for AgentIssuer {
    type VolumeLock = tokio::sync::OwnedMutexGuard<RecentInit>;

    async fn lock_volume(&self, id: &VolumeId) -> Self::VolumeLock {
        self.agent.lock_for(id).await.lock_owned().await
    }

    async fn issue(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        registration: Registration,
    ) -> Result<Issued, IssueError> {
        let (attest, manager) = (&self.agent.attestor, &self.agent.manager);
        let issued = match registration {
            // the kubelet waits on a publish, which names the pod itself
            Registration::First => {
                let subject = attest
                    .attest(Claim::KubeletCall { volume: data })
                    .await
                    .map_err(issue_error)?;
                manager.publish(id, data, subject).await
            }
            // the rotation's, ahead of time: its pod may have gone since
            Registration::Again => {
                let subject = attest
                    .attest(Claim::KubeletList {
                        volume: data,
                        ip: PodIp::for_files_volume(data),
                        registration,
                    })
                    .await
                    .map_err(issue_error)?;
                // files mode: no process in the pod, so the key is made here whatever
                // --key-source says
                manager
                    .register(id, data, subject, KeyRequest::Agent, Priority::Background)
                    .await
            }
        };
        issued.map_err(issue_error)
    }

    async fn reissue(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        current: &CurrentPair,
    ) -> Result<Issued, IssueError> {
        let (attest, manager) = (&self.agent.attestor, &self.agent.manager);
        // the pod had its identity, so the kubelet listed it: missing from a new list, it is gone
        let subject = attest
            .attest(Claim::KubeletList {
                volume: data,
                ip: PodIp::for_files_volume(data),
                registration: Registration::Again,
            })
            .await
            .map_err(issue_error)?;
        manager
            .refresh(
                id,
                &current.key_pem,
                &current.cert_pem,
                subject,
                Priority::Background,
            )
            .await
            .map_err(issue_error)
    }

    async fn pod_ip(&self, data: &VolumeData) -> Result<Option<IpAddr>, IssueError> {
        self.agent
            .attestor
            .listed_ip(data)
            .await
            .map_err(|e| IssueError {
                transient: true,
                message: e.to_string(),
            })
    }

    fn ready(&self) -> bool {
        self.agent.node.is_valid()
    }
}

/// The server ends a watch within 290 s; a connection silent longer than this is dead.
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(300);

/// The agent's Kubernetes API client (`--kube-api-url`, else the in-cluster configuration),
/// made at start so a missing configuration stops the agent naming `setting`, the feature
/// that needs it; a read may take `read_timeout` (a watch's, longer than a request's).
pub(crate) async fn kube_client(
    config: &Config,
    setting: &'static str,
    read_timeout: Duration,
) -> Result<kube::Client, StartError> {
    let mut kube_config = match &config.kube_api_url {
        Some(url) => kube::Config::new(
            url.parse::<http::Uri>()
                .map_err(|e| StartError::new(setting, format!("URL {url:?}: {e}")))?,
        ),
        None => kube::Config::infer().await.map_err(|e| {
            StartError::new(setting, format!("no in-cluster config or kubeconfig: {e}"))
        })?,
    };
    kube_config.connect_timeout = Some(config.upstream_timeout);
    kube_config.read_timeout = Some(read_timeout);
    kube_config.write_timeout = Some(config.upstream_timeout);
    kube::Client::try_from(kube_config).map_err(|e| StartError::new(setting, e))
}

/// Starts the watch of this node's pending pods that issues files-mode identities when their
/// pod is bound (`--csi-early-issue`, crate::manager::early). The API client is made now, so a
/// missing in-cluster configuration stops the agent at start; the watch's own errors (no RBAC,
/// the API away) only leave every publish to issue itself, and are logged.
pub(crate) async fn watch_bound_pods(
    config: &Config,
    agent: &Arc<Agent>,
) -> Result<tokio::task::JoinHandle<()>, StartError> {
    let client = kube_client(
        config,
        "--csi-early-issue/--kube-api-url (CSI_EARLY_ISSUE/KUBE_API_URL)",
        WATCH_READ_TIMEOUT,
    )
    .await?;
    let issuer = Arc::clone(agent);
    tracing::info!(node = %config.node_name, "issuing files-mode identities when their pods are bound here");
    Ok(crate::manager::early::spawn_watch(
        client,
        config.node_name.clone(),
        Arc::clone(&agent.manager.early),
        move |pod: &BoundPod, started: Started| {
            let names = PodNames {
                namespace: pod.namespace()?.to_owned(),
                name: pod.name()?.to_owned(),
                service_account: pod.service_account.clone(),
            };
            let agent = Arc::clone(&issuer);
            let pod = pod.clone();
            Some((names, async move {
                // its turn first: a pod bound and deleted at once costs nothing but its place
                // in the queue (the store cancels it), not a lookup
                let slot = agent.manager.slot(Priority::Warmup).await;
                agent.manager.warmup_pace().await;
                started.mark();
                // its domain may be its namespace's annotation, read from the API
                let registered = match agent.attestor.attest(Claim::ApiBinding { pod: &pod }).await
                {
                    Ok(subject) => agent.manager.register_ahead(subject, slot).await,
                    Err(refused) => Err(refused),
                };
                registered
                    .map_err(|f| {
                        tracing::info!(status = f.status.as_u16(), error = %f.message, "issuing ahead of the publish failed; the publish issues itself");
                    })
                    .ok()
            }))
        },
    ))
}

/// A CSI server ready to run until its stop signal.
pub(crate) type CsiServe = Box<
    dyn FnOnce(
            std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send,
>;

/// Binds the CSI socket, resumes the files-mode volumes an earlier run left mounted, and
/// registers the CSI metrics (kept current from the rotation tasks).
pub(crate) fn start(
    config: &Config,
    path: &std::path::Path,
    agent: &Arc<Agent>,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<CsiServe, StartError> {
    use athenz_csi_driver::driver::{Driver, DriverConfig};
    use athenz_csi_driver::rotation::{IpWatch, Rotation};
    let setting = "--csi-socket (CSI_SOCKET)";
    if config.csi_tmpfs_bytes < 64 * 1024 {
        return Err(StartError::new(
            "--csi-tmpfs-bytes (CSI_TMPFS_BYTES)",
            "must be at least 65536",
        ));
    }
    let issuer = Arc::new(AgentIssuer {
        agent: Arc::clone(agent),
    });
    let policy = athenz_core::refresh::RefreshPolicy {
        max_delay: config.csi_refresh_interval,
        min_delay: config.csi_refresh_interval.min(Duration::from_secs(10)),
        ..Default::default()
    };
    let rotation = Arc::new(Rotation::new(
        Arc::clone(&issuer),
        policy,
        athenz_core::refresh::Backoff::default(),
        IpWatch::default(),
    ));
    let driver = Arc::new(Driver::new(
        DriverConfig {
            node_id: config.node_name.clone(),
            host: athenz_core::volume_mount::HostDirs::new(
                VolumesDir::new(&config.volumes_dir),
                config.agent_dir.clone(),
            ),
            tmpfs_bytes: config.csi_tmpfs_bytes,
            issue_timeout: config.csi_issue_timeout,
        },
        issuer,
        rotation,
    ));
    let resumed = driver.resume();
    let listener =
        athenz_csi_driver::server::bind(path).map_err(|e| StartError::new(setting, e))?;
    let registration = match &config.csi_registration_dir {
        Some(dir) => {
            let endpoint = config.csi_kubelet_socket.as_deref().unwrap_or(path);
            let registered = prometheus_client::metrics::gauge::Gauge::<i64>::default();
            registry.register(
                "csi_registered",
                "1 once kubelet registered the CSI driver, 0 if it refused, -1 before it answered",
                registered.clone(),
            );
            let listener =
                athenz_csi_driver::registration::bind(dir, athenz_csi_driver::DRIVER_NAME)
                    .map_err(|e| {
                        StartError::new("--csi-registration-dir (CSI_REGISTRATION_DIR)", e)
                    })?;
            tracing::info!(socket = %athenz_csi_driver::registration::socket_in(dir, athenz_csi_driver::DRIVER_NAME).display(), endpoint = %endpoint.display(), "registering the CSI driver with kubelet");
            Some((
                listener,
                athenz_csi_driver::registration::PluginRegistration::new(
                    endpoint.display().to_string(),
                    registered,
                ),
            ))
        }
        None => None,
    };
    let volumes = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    let abnormal = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    registry.register(
        "csi_files_volumes",
        "CSI files-mode volumes this agent rotates",
        volumes.clone(),
    );
    registry.register(
        "csi_abnormal_volumes",
        "CSI files-mode volumes whose certificate expired or whose last refresh failed",
        abnormal.clone(),
    );
    let expiries = prometheus_client::metrics::family::Family::default();
    registry.register(
        "csi_volume_certificate_expiry_seconds",
        "expiry (Unix time) of the certificate in each CSI files-mode volume, by its pod (the earliest-expiring 512)",
        expiries.clone(),
    );
    let mut expiries = crate::volume_expiry::VolumeExpiryGauge::new(expiries);
    tracing::info!(socket = %path.display(), resumed, "CSI driver csi.athenz.io listening");
    Ok(Box::new(move |stop| {
        Box::pin(async move {
            // the gauges are refreshed from the reload thread, whose ticks wake no runtime
            let counts = {
                let driver = Arc::clone(&driver);
                athenz_core::periodic::every(Duration::from_secs(5), move || {
                    let rotation = driver.rotation();
                    let (tracked, bad) = rotation.counts();
                    volumes.set(i64::try_from(tracked).unwrap_or(i64::MAX));
                    abnormal.set(i64::try_from(bad).unwrap_or(i64::MAX));
                    expiries.update(&rotation.expiries(crate::volume_expiry::MAX_SERIES));
                })
            };
            // one stop for both servers
            let stopping = athenz_core::daemon::Shutdown::new();
            let relay = {
                let stopping = stopping.clone();
                tokio::spawn(async move {
                    stop.await;
                    stopping.trigger();
                })
            };
            let registering = registration.map(|(listener, registration)| {
                tokio::spawn(athenz_csi_driver::registration::serve(
                    listener,
                    registration,
                    stopping.wait(),
                ))
            });
            athenz_csi_driver::server::serve(
                listener,
                athenz_csi_driver::service::CsiService::new(Arc::clone(&driver)),
                stopping.wait(),
            )
            .await;
            // the next agent may be of a release that does not open the seals (a rollback)
            let handed = driver.hand_over().await;
            if handed.failed.is_empty() {
                tracing::info!(
                    opened = handed.opened,
                    "files-mode volumes handed over: seals opened"
                );
            } else {
                tracing::warn!(opened = handed.opened, failed = ?handed.failed, "files-mode volumes handed over, some seals not opened");
            }
            let _ = relay.await;
            if let Some(registering) = registering {
                let _ = registering.await;
            }
            counts.abort();
        })
    }))
}
