//! The agent's socket API (DESIGN.md 4.2): `POST /v1/init/{id}`, `POST /v1/refresh/{id}`,
//! `GET /healthz`. Every id is parsed before any file is touched; calls for one id are serialised;
//! ZTS calls across ids are bounded.

use crate::kubelet::{Absent, PodCache};
use athenz_core::agent_api::{AgentRoute, IdentityResponse, RefreshRequest};
use athenz_core::crypto::{CertInfo, PrivateKey, build_csr, key_matches_cert};
use athenz_core::http::{
    Body, ConnInfo, Handler, Peer, error_response, json_response, unavailable_response,
};
use athenz_core::identity_jwt::{JWT_PATH, JwtRequest, JwtResponse};
use athenz_core::names::{CsrIdentity, DomainMapper, PodIdentityInput};
use athenz_core::peer::PeerCheck;
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::volume::{
    VolumeData, VolumeError, VolumeId, VolumePaths, VolumeState, VolumeStatusRecord, VolumesDir,
    read_json_file, write_json_file,
};
use athenz_core::zts::{
    InstanceIdentity, InstanceRef, InstanceRefreshInformation, InstanceRegisterInformation,
    ZtsClient, ZtsError,
};
use athenz_csi_driver::Issued;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Semaphore};

/// How long a client is told to wait before retrying a transient failure.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// Inits of one volume within this time of a successful one get that answer instead of a new
/// registration: concurrent callers (an init container retried by kubelet while the first call is
/// still running) see one consistent identity, and ZTS sees one register.
const COALESCE: Duration = Duration::from_secs(5);

/// A failed call: status and message.
#[derive(Debug)]
pub struct Failure {
    /// The HTTP status the socket API answers with.
    pub status: StatusCode,
    /// Why.
    pub message: String,
}

fn fail(status: StatusCode, message: impl Into<String>) -> Failure {
    Failure {
        status,
        message: message.into(),
    }
}

impl Failure {
    fn into_response(self) -> Response<Body> {
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            unavailable_response(self.message, RETRY_AFTER)
        } else {
            error_response(self.status, self.message)
        }
    }
}

/// What a pod is told when ZTS did not issue: a refusal (any 4xx but 429, or a client
/// certificate refused in the handshake) is 403, final; only unavailability (no answer, 429,
/// 5xx) is 503, "try again"; an answer that is not ZTS's API is 502.
fn zts_failure(e: ZtsError) -> Failure {
    match &e {
        _ if e.is_transient() => fail(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        ZtsError::Rejected { status, .. } if (400..500).contains(status) => {
            fail(StatusCode::FORBIDDEN, e.to_string())
        }
        ZtsError::CertificateRefused(_) => fail(StatusCode::FORBIDDEN, e.to_string()),
        _ => fail(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

/// Labels of the upstream latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UpstreamLabels {
    /// `kubelet`, `dns`, `jwt_service`, `zts_register` or `zts_refresh`.
    pub upstream: &'static str,
}

/// The agent's own metrics (request counts and latencies come from the HTTP layer).
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    upstream: prometheus_client::metrics::family::Family<
        UpstreamLabels,
        prometheus_client::metrics::histogram::Histogram,
    >,
    cached_pods: prometheus_client::metrics::gauge::Gauge,
    cert_expiry: prometheus_client::metrics::gauge::Gauge,
    peer_checks: prometheus_client::metrics::family::Family<
        PeerCheckLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    keys_taken: prometheus_client::metrics::family::Family<
        KeySourceLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    key_pool_ready: prometheus_client::metrics::gauge::Gauge,
}

/// Labels of the pod-key counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KeySourceLabels {
    /// `pool` (made ahead) or `on_path` (made while the pod waited).
    pub source: &'static str,
}

/// Labels of the peer-check counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PeerCheckLabels {
    /// `match`, `mismatch` (another pod or none) or `unknown` (the caller could not be identified).
    pub outcome: &'static str,
    /// `enforce` or `log`.
    pub mode: &'static str,
}

impl AgentMetrics {
    /// Registers the metrics.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self {
            upstream: prometheus_client::metrics::family::Family::new_with_constructor(|| {
                prometheus_client::metrics::histogram::Histogram::new([
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ])
            }),
            cached_pods: Default::default(),
            cert_expiry: Default::default(),
            peer_checks: Default::default(),
            keys_taken: Default::default(),
            key_pool_ready: Default::default(),
        };
        registry.register(
            "pod_keys",
            "Pod keys handed out, by where they were made",
            m.keys_taken.clone(),
        );
        registry.register(
            "key_pool_ready",
            "RSA keys made ahead and ready",
            m.key_pool_ready.clone(),
        );
        registry.register(
            "peer_checks",
            "Callers on the socket checked against their volume's pod, by outcome",
            m.peer_checks.clone(),
        );
        registry.register(
            "upstream_duration_seconds",
            "Upstream call latency",
            m.upstream.clone(),
        );
        registry.register(
            "kubelet_cached_pods",
            "Pods in the cached kubelet list",
            m.cached_pods.clone(),
        );
        registry.register(
            "last_certificate_expiry_seconds",
            "Expiry (Unix time) of the last certificate issued",
            m.cert_expiry.clone(),
        );
        m
    }

    fn key_taken(&self, source: crate::key_pool::KeySource, ready: usize) {
        self.keys_taken
            .get_or_create(&KeySourceLabels {
                source: source.label(),
            })
            .inc();
        self.key_pool_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    fn observe(&self, upstream: &'static str, started: std::time::Instant) {
        self.upstream
            .get_or_create(&UpstreamLabels { upstream })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Looks up a pod's Kubernetes service in DNS.
pub struct ServiceDns {
    cluster_domain: String,
    resolver: Option<hickory_resolver::TokioResolver>,
}

impl ServiceDns {
    /// Looks names up under `cluster_domain`, through `server` or the system resolver.
    pub fn new(cluster_domain: String, server: Option<std::net::SocketAddr>) -> Self {
        use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
        let resolver = server.map(|addr| {
            let config = ResolverConfig::from_parts(
                None,
                Vec::new(),
                NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true),
            );
            let mut builder = hickory_resolver::TokioResolver::builder_with_config(
                config,
                hickory_resolver::name_server::TokioConnectionProvider::default(),
            );
            builder.options_mut().timeout = Duration::from_secs(2);
            builder.options_mut().attempts = 1;
            // no answer cache: a Service deleted since the last lookup must not put its old IP
            // in a CSR the callback would then refuse; one query per init is cheap
            builder.options_mut().cache_size = 0;
            builder.build()
        });
        Self {
            cluster_domain,
            resolver,
        }
    }

    /// The first address of `<service>.<namespace>.svc.<cluster-domain>`, within 2 s.
    pub async fn lookup(&self, service: &str, namespace: &str) -> Option<IpAddr> {
        let name = format!("{service}.{namespace}.svc.{}", self.cluster_domain);
        match &self.resolver {
            Some(resolver) => {
                let lookup = tokio::time::timeout(
                    Duration::from_secs(3),
                    resolver.lookup_ip(format!("{name}.")),
                )
                .await;
                lookup.ok()?.ok()?.iter().next()
            }
            None => {
                let lookup = tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::net::lookup_host(format!("{name}:0")),
                )
                .await;
                lookup.ok()?.ok()?.next().map(|a| a.ip())
            }
        }
    }
}

/// Whether an identity may be issued to a pod that has no IP yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodIp {
    /// The socket API: the SIA runs inside the pod's network, so a missing IP is transient.
    Required,
    /// CSI files mode: the volume is published before the sandbox has an IP; the first
    /// certificate carries none and is re-issued once the kubelet lists one.
    Optional,
}

/// What the agent needs to issue identities.
pub struct Agent {
    /// Metrics.
    pub metrics: AgentMetrics,
    /// Volumes on this node.
    pub volumes: VolumesDir,
    /// The node's pods.
    pub pods: PodCache,
    /// How long to wait for the kubelet to list a pod.
    pub pod_wait: Duration,
    /// Namespace ↔ domain.
    pub mapper: DomainMapper,
    /// Our provider.
    pub provider: String,
    /// SAN DNS suffix.
    pub dns_suffix: String,
    /// The optional service IP lookup (`None`: no lookup).
    pub service_dns: Option<ServiceDns>,
    /// Pods' keys (RSA ones made ahead).
    pub keys: Arc<crate::key_pool::KeyPool>,
    /// The jwt-service client (mutual TLS with the node's certificate).
    pub jwt_client: reqwest::Client,
    /// `https://.../v1/jwt`.
    pub jwt_url: String,
    /// ZTS.
    pub zts: ZtsClient,
    /// The CA bundle Athenz issues instance certificates under: presented certificates must
    /// chain to it.
    pub athenz_ca: tls::IssuerCheck,
    /// The node's own identity (the jwt-service client certificate).
    pub node: Arc<crate::node_identity::NodeIdentity>,
    /// Whether callers must be processes of the volume's pod.
    pub peer_check: PeerCheck,
    /// Bound on identities issued at once (jwt-service call, key, ZTS call).
    pub issuance_slots: Semaphore,
    /// One lock per volume id, holding its latest init answer for [`COALESCE`].
    pub locks: Mutex<HashMap<VolumeId, Arc<Mutex<RecentInit>>>>,
}

/// The latest init answer of a volume, kept for [`COALESCE`].
#[derive(Default)]
pub struct RecentInit(Option<(std::time::Instant, IdentityResponse)>);

impl Agent {
    pub(crate) async fn lock_for(&self, id: &VolumeId) -> Arc<Mutex<RecentInit>> {
        let mut locks = self.locks.lock().await;
        // forget locks nobody holds once their answer is stale, so the map does not grow with
        // every pod ever seen (and keys do not stay in memory)
        locks.retain(|_, l| {
            Arc::strong_count(l) > 1
                || l.try_lock()
                    .is_ok_and(|r| r.0.as_ref().is_some_and(|(at, _)| at.elapsed() < COALESCE))
        });
        Arc::clone(locks.entry(id.clone()).or_default())
    }

    fn volume(&self, id: &VolumeId) -> Result<(VolumePaths, VolumeData), Failure> {
        let paths = self.volumes.volume(id);
        let data: VolumeData = match read_json_file(&paths.data_json) {
            Ok(d) => d,
            Err(VolumeError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(fail(StatusCode::NOT_FOUND, format!("unknown volume {id}")));
            }
            Err(e) => return Err(fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        };
        data.validate().map_err(|e| {
            fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("volume {id}: {e}"),
            )
        })?;
        Ok((paths, data))
    }

    /// The caller is a process of the volume's pod (DESIGN.md 4.2): its cgroup names the pod
    /// UID the volume was mounted for. `log` mode lets a mismatch through and logs it.
    fn check_peer(&self, id: &VolumeId, data: &VolumeData, conn: &ConnInfo) -> Result<(), Failure> {
        let mode = match self.peer_check {
            PeerCheck::Off => return Ok(()),
            PeerCheck::Enforce => "enforce",
            PeerCheck::Log => "log",
        };
        let caller = match &conn.peer_process {
            Some(Ok(process)) => process.pod_uid().map_err(|e| e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("the caller is not a local process".to_owned()),
        };
        let (outcome, refusal) = match caller {
            Ok(uid) if uid == data.pod_uid => ("match", None),
            Ok(uid) => (
                "mismatch",
                Some(format!(
                    "the caller runs in pod {uid}, but volume {id} belongs to pod {}",
                    data.pod_uid
                )),
            ),
            Err(why) => (
                "unknown",
                Some(format!(
                    "cannot tell which pod the caller runs in ({why}); volume {id} belongs to pod {}",
                    data.pod_uid
                )),
            ),
        };
        self.metrics
            .peer_checks
            .get_or_create(&PeerCheckLabels { outcome, mode })
            .inc();
        match refusal {
            None => Ok(()),
            Some(why) if self.peer_check == PeerCheck::Log => {
                tracing::warn!(%id, peer = ?conn.peer, reason = %why, "peer check failed (log mode: allowed)");
                Ok(())
            }
            Some(why) => Err(fail(StatusCode::FORBIDDEN, why)),
        }
    }

    /// The pod of a volume, checked: on this node, same uid, not terminating, and with an IP
    /// unless `ip` is [`PodIp::Optional`] (a CSI files-mode volume is published before the pod
    /// has one).
    pub(crate) async fn pod_subject(
        &self,
        data: &VolumeData,
        ip: PodIp,
        absent: Absent,
    ) -> Result<(PodSubject, Option<IpAddr>), Failure> {
        let started = std::time::Instant::now();
        let found = self
            .pods
            .find(
                &data.namespace,
                &data.pod_name,
                &data.pod_uid,
                self.pod_wait,
                absent,
            )
            .await;
        self.metrics.observe("kubelet", started);
        self.metrics
            .cached_pods
            .set(i64::try_from(self.pods.cached_pods()).unwrap_or(i64::MAX));
        let pod = found
            .map_err(|e| fail(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
            .ok_or_else(|| {
                fail(
                    StatusCode::FORBIDDEN,
                    format!(
                        "pod {}/{} is not on this node",
                        data.namespace, data.pod_name
                    ),
                )
            })?;
        if pod.uid != data.pod_uid {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!(
                    "pod {}/{} is not the pod this volume was mounted for",
                    data.namespace, data.pod_name
                ),
            ));
        }
        if pod.terminating {
            return Err(fail(StatusCode::FORBIDDEN, "the pod is being deleted"));
        }
        let pod_ip = pod.ip.as_deref();
        if pod_ip.is_none() && ip == PodIp::Required {
            return Err(fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "the pod has no IP yet",
            ));
        }
        let domain = self
            .mapper
            .namespace_to_domain(&data.namespace)
            .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))?;
        let account = pod.service_account.clone();
        let subject = PodSubject::new(
            data.namespace.clone(),
            data.pod_name.clone(),
            data.pod_uid.clone(),
            domain,
            account,
            pod_ip,
        )
        .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))?;
        let service_ip = self.service_ip(&subject).await;
        Ok((subject, service_ip))
    }

    /// `<service>.<namespace>.svc.<cluster-domain>` in DNS, when that option is on. A failed
    /// lookup only leaves the SAN out: the pod still gets its identity.
    async fn service_ip(&self, subject: &PodSubject) -> Option<IpAddr> {
        let dns = self.service_dns.as_ref()?;
        let started = std::time::Instant::now();
        let ip = dns.lookup(&subject.service, &subject.namespace).await;
        self.metrics.observe("dns", started);
        ip
    }

    async fn jwt(&self, subject: &PodSubject) -> Result<Secret, Failure> {
        let started = std::time::Instant::now();
        let result = self.jwt_call(subject).await;
        self.metrics.observe("jwt_service", started);
        result
    }

    async fn jwt_call(&self, subject: &PodSubject) -> Result<Secret, Failure> {
        if !self.node.is_valid() {
            return Err(fail(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the agent has no valid node identity for {} yet (ZTS or the callback unreachable?)",
                    self.node.node_name()
                ),
            ));
        }
        let resp = self
            .jwt_client
            .post(&self.jwt_url)
            .json(&JwtRequest {
                subject: subject.clone(),
            })
            .send()
            .await
            .map_err(|e| {
                fail(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("jwt-service: {}", athenz_core::client::error_chain(&e)),
                )
            })?;
        let status = resp.status();
        let body = athenz_core::client::read_limited(resp, 64 * 1024)
            .await
            .map_err(|e| fail(StatusCode::SERVICE_UNAVAILABLE, format!("jwt-service: {e}")))?;
        if !status.is_success() {
            let why = String::from_utf8_lossy(&body).into_owned();
            // its refusal is final (403); its trouble is "try again" (503)
            return Err(fail(
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::FORBIDDEN
                },
                format!("jwt-service answered {status}: {why}"),
            ));
        }
        serde_json::from_slice::<JwtResponse>(&body)
            .map(|r| r.jwt)
            .map_err(|e| {
                fail(
                    StatusCode::BAD_GATEWAY,
                    format!("jwt-service answered: {e}"),
                )
            })
    }

    async fn csr(
        &self,
        subject: &PodSubject,
        service_ip: Option<IpAddr>,
    ) -> Result<(PrivateKey, String), Failure> {
        let identity = CsrIdentity::for_pod(&PodIdentityInput {
            domain: &subject.domain,
            service: &subject.service,
            provider: &self.provider,
            dns_suffix: &self.dns_suffix,
            instance_id: &subject.uid,
            pod_ip: subject.ip,
            service_ip,
        })
        .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))?;
        let (key, source) = self
            .keys
            .take()
            .await
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        self.metrics.key_taken(source, self.keys.ready());
        let csr = build_csr(&identity, &key)
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok((key, csr))
    }

    /// Builds the answer and saves the state.
    fn finish(
        &self,
        paths: &VolumePaths,
        subject: &PodSubject,
        key: &PrivateKey,
        identity: &InstanceIdentity,
        previous_serial: Option<String>,
    ) -> Result<Issued, Failure> {
        let leaf = identity
            .x509_certificate
            .as_deref()
            .ok_or_else(|| fail(StatusCode::BAD_GATEWAY, "ZTS sent no certificate"))?;
        let info = CertInfo::from_pem(leaf)
            .map_err(|e| fail(StatusCode::BAD_GATEWAY, format!("ZTS's certificate: {e}")))?;
        if !key_matches_cert(key, &info) {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                "ZTS's certificate is not for the key sent",
            ));
        }
        let signer = identity.x509_certificate_signer.clone().unwrap_or_default();
        // certPEM: the leaf, then the chain; an unreadable bundle still leaves the leaf usable
        let cert_pem = athenz_core::crypto::leaf_with_chain(leaf, &signer)
            .unwrap_or_else(|_| format!("{}\n", leaf.trim_end()));
        let state = VolumeState {
            provider: self.provider.clone(),
            instance_id: subject.uid.clone(),
            domain: subject.domain.clone(),
            service: subject.service.clone(),
            pod_uid: subject.uid.clone(),
            cert_serial: info.serial_hex.clone(),
            previous_cert_serial: previous_serial.filter(|s| *s != info.serial_hex),
            cert_expiry: info.not_after,
            updated_at: time::OffsetDateTime::now_utc(),
        };
        self.metrics
            .cert_expiry
            .set(info.not_after.unix_timestamp());
        write_json_file(&paths.state_json, &state, 0o600)
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let answer = IdentityResponse {
            key_pem: key
                .to_pkcs8_pem()
                .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
            cert_pem,
            ca_cert_pem: signer,
            ntoken: identity.service_token.clone().unwrap_or_default(),
            expires_at: info
                .not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        };
        Ok(Issued { answer, cert: info })
    }

    /// One of the slots that bound identities issued at once (from the JWT to ZTS's answer).
    ///
    /// While one is held the key pool does not refill: pods waiting now come first.
    async fn issuance_slot(
        &self,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, crate::key_pool::Busy<'_>), Failure> {
        let busy = self.keys.busy();
        let slot = self
            .issuance_slots
            .acquire()
            .await
            .map_err(|_| fail(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?;
        Ok((slot, busy))
    }

    /// `POST /v1/init/{id}`.
    pub async fn init(&self, id: &VolumeId, conn: &ConnInfo) -> Result<IdentityResponse, Failure> {
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        let (paths, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        if let Some((at, answer)) = &recent.0
            && at.elapsed() < COALESCE
        {
            return Ok(answer.clone());
        }
        let answer = self
            .register(&paths, &data, PodIp::Required, Absent::MayAppear)
            .await?
            .answer;
        recent.0 = Some((std::time::Instant::now(), answer.clone()));
        Ok(answer)
    }

    /// Registers a new instance for volume `paths` of pod `data` and saves its refresh state:
    /// the work of an init once the caller is known to be the pod (and of a CSI files-mode
    /// publish, where the kubelet is the caller).
    pub(crate) async fn register(
        &self,
        paths: &VolumePaths,
        data: &VolumeData,
        ip: PodIp,
        absent: Absent,
    ) -> Result<Issued, Failure> {
        if let Ok(state) = read_json_file::<VolumeState>(&paths.state_json)
            && state.pod_uid != data.pod_uid
        {
            return Err(fail(
                StatusCode::FORBIDDEN,
                "this volume was initialised for another pod",
            ));
        }
        let (subject, service_ip) = self.pod_subject(data, ip, absent).await?;
        // One slot per identity being issued, held from the JWT to ZTS's answer: it bounds the
        // connections to the jwt-service and ZTS (and their TLS buffers in this process) however
        // many pods start at once, and a JWT is used moments after it is signed.
        let _slot = self.issuance_slot().await?;
        let jwt = self.jwt(&subject).await?;
        let (key, csr) = self.csr(&subject, service_ip).await?;
        let started = std::time::Instant::now();
        let registered = self
            .zts
            .register(&InstanceRegisterInformation {
                provider: self.provider.clone(),
                domain: subject.domain.clone(),
                service: subject.service.clone(),
                attestation_data: jwt,
                csr,
                token: Some(true),
                ..Default::default()
            })
            .await;
        self.metrics.observe("zts_register", started);
        let registered = registered.map_err(zts_failure)?;
        // a registration starts a new record in ZTS: no earlier certificate refreshes
        self.finish(paths, &subject, &key, &registered.identity, None)
    }

    /// A certificate presented for refresh is one this agent got from Athenz for this volume and
    /// may still use (DESIGN.md 6): valid now, chaining to the Athenz CA, and the latest issued
    /// for the volume or the one presented for the last refresh. Checked before anything leaves the node, so a pod
    /// cannot use the agent to show ZTS a certificate it made itself, or one it was issued long
    /// ago, and a refusal is final (403), not "try again".
    fn check_presented(
        &self,
        chain: &[rustls_pki_types::CertificateDer<'static>],
        info: &CertInfo,
        state: &VolumeState,
    ) -> Result<(), Failure> {
        let now = time::OffsetDateTime::now_utc();
        if info.not_after <= now {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!("the certificate expired at {}", info.not_after),
            ));
        }
        if info.not_before > now {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!("the certificate is not valid before {}", info.not_before),
            ));
        }
        self.athenz_ca.check(chain).map_err(|e| {
            fail(
                StatusCode::FORBIDDEN,
                format!("the certificate was not issued by the Athenz CA: {e}"),
            )
        })?;
        if info.serial_hex != state.cert_serial
            && state.previous_cert_serial.as_deref() != Some(info.serial_hex.as_str())
        {
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!(
                    "the certificate (serial {}) has been superseded: the latest issued for this volume is {}",
                    info.serial_hex, state.cert_serial
                ),
            ));
        }
        Ok(())
    }

    /// Keeps the volume's `status.json` (what `athenz-identity-agent status` shows) in step with
    /// the last call: the failure the pod was given, or none after a success. Only an existing
    /// volume has a record; writes happen only when the record changes.
    pub fn record_outcome(&self, id: &VolumeId, failure: Option<&Failure>) {
        let paths = self.volumes.volume(id);
        if !paths.dir.is_dir() {
            return;
        }
        let now = time::OffsetDateTime::now_utc();
        let updated = VolumeStatusRecord::update(&paths.status_json, |r| match failure {
            Some(f) => r.set_error(&format!("{} {}", f.status.as_u16(), f.message), now),
            None => r.last_error = None,
        });
        if let Err(e) = updated {
            tracing::debug!(%id, error = %e, "status record not written");
        }
    }

    /// `POST /v1/refresh/{id}`.
    pub async fn refresh(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<IdentityResponse, Failure> {
        let request = parse_refresh_request(body)?;
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        // a refresh supersedes any coalesced init answer
        recent.0 = None;
        let (paths, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        self.refresh_pair(
            id,
            &paths,
            &data,
            &request.key_pem,
            &request.cert_pem,
            PodIp::Required,
        )
        .await
        .map(|issued| issued.answer)
    }

    /// Refreshes volume `id` with the pair it presents: checked to be this volume's latest
    /// identity before anything leaves the node, then shown to ZTS. The work of a refresh once
    /// the caller is known to be the pod (and of a CSI files-mode rotation).
    pub(crate) async fn refresh_pair(
        &self,
        id: &VolumeId,
        paths: &VolumePaths,
        data: &VolumeData,
        key_pem: &Secret,
        cert_pem: &str,
        ip: PodIp,
    ) -> Result<Issued, Failure> {
        let state: VolumeState = read_json_file(&paths.state_json).map_err(|_| {
            fail(
                StatusCode::NOT_FOUND,
                format!("volume {id} has not been initialised"),
            )
        })?;
        // the presented pair must be this volume's identity, before anything leaves the node
        let PresentedPair { info, presented } = PresentedPair::parse(key_pem.expose(), cert_pem)?;
        let principal = athenz_core::names::principal(&state.domain, &state.service);
        let instance_uri = athenz_core::names::instance_id_uri(&state.provider, &state.instance_id);
        if info.common_name != principal || !info.uris.contains(&instance_uri) {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "the certificate is not this volume's identity",
            ));
        }
        self.check_presented(&presented.cert, &info, &state)?;
        // the pod had its identity, so the kubelet listed it: missing from a new list, it is gone
        let (subject, service_ip) = self.pod_subject(data, ip, Absent::Gone).await?;
        if subject.uid != state.pod_uid {
            return Err(fail(StatusCode::FORBIDDEN, "the pod was replaced"));
        }
        let _slot = self.issuance_slot().await?;
        let jwt = self.jwt(&subject).await?;
        let (new_key, csr) = self.csr(&subject, service_ip).await?;
        let started = std::time::Instant::now();
        let identity = self
            .zts
            .refresh_instance(
                &InstanceRef {
                    provider: &state.provider,
                    domain: &state.domain,
                    service: &state.service,
                    instance_id: &state.instance_id,
                },
                &InstanceRefreshInformation {
                    attestation_data: Some(jwt),
                    csr: Some(csr),
                    token: Some(true),
                    ..Default::default()
                },
                ClientIdentity::Fixed(presented),
            )
            .await;
        self.metrics.observe("zts_refresh", started);
        let identity = identity.map_err(zts_failure)?;
        // as ZTS does: the certificate just presented stays usable once (its answer may be lost)
        self.finish(paths, &subject, &new_key, &identity, Some(info.serial_hex))
    }
}

/// The key and certificate a pod presents for refresh, parsed: what the socket API reads from a
/// pod before anything else is looked at. Pure, so the fuzz target `agent_request` drives it.
pub struct PresentedPair {
    /// The leaf certificate's fields.
    pub info: CertInfo,
    /// The pair in the form ZTS will be shown it (leaf + chain, with the key).
    pub presented: Arc<tls::CertifiedKey>,
}

impl PresentedPair {
    /// Parses `cert_pem` (leaf alone or leaf + chain) and `key_pem`; 400 unless both parse and
    /// the key is the certificate's.
    pub fn parse(key_pem: &str, cert_pem: &str) -> Result<Self, Failure> {
        let info = CertInfo::from_pem(cert_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, e.to_string()))?;
        let key = PrivateKey::from_pem(key_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, e.to_string()))?;
        if !key_matches_cert(&key, &info) {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "the key does not belong to the certificate",
            ));
        }
        let presented = tls::certified_key_from_pem(cert_pem, key_pem)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, e.to_string()))?;
        Ok(Self { info, presented })
    }
}

/// Reads a refresh body (DESIGN.md 4.2): strict JSON, 400 naming the fault otherwise.
pub fn parse_refresh_request(body: &[u8]) -> Result<RefreshRequest, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("invalid refresh request: {e}"),
        )
    })
}

/// The socket handler.
pub struct AgentHandler {
    /// The agent.
    pub agent: Arc<Agent>,
}

impl Handler for AgentHandler {
    async fn handle(&self, req: Request<Bytes>, conn: Arc<ConnInfo>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if path == "/healthz" {
            return json_response(StatusCode::OK, &"ok");
        }
        let route = match AgentRoute::parse(&path) {
            None => return error_response(StatusCode::NOT_FOUND, "no such route"),
            Some(Err(e)) => return error_response(StatusCode::BAD_REQUEST, e.to_string()),
            Some(Ok(r)) => r,
        };
        if req.method() != Method::POST {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        }
        let (pid, uid) = match conn.peer {
            Peer::Unix { pid, uid, .. } => (pid, Some(uid)),
            Peer::Tcp(_) => (None, None),
        };
        let (verb, result) = match &route {
            AgentRoute::Init(id) => ("init", self.agent.init(id, &conn).await),
            AgentRoute::Refresh(id) => ("refresh", self.agent.refresh(id, req.body(), &conn).await),
        };
        let volume_id = match &route {
            AgentRoute::Init(id) | AgentRoute::Refresh(id) => id,
        };
        self.agent.record_outcome(volume_id, result.as_ref().err());
        let id = volume_id.to_string();
        match result {
            Ok(answer) => {
                tracing::info!(verb, %id, ?pid, ?uid, expires = %answer.expires_at, "identity issued");
                json_response(StatusCode::OK, &answer)
            }
            Err(failure) => {
                tracing::info!(verb, %id, ?pid, ?uid, status = %failure.status, reason = %failure.message, "refused");
                failure.into_response()
            }
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        match AgentRoute::parse(req.uri.path()) {
            Some(Ok(AgentRoute::Init(_))) => "init",
            Some(Ok(AgentRoute::Refresh(_))) => "refresh",
            _ if req.uri.path() == "/healthz" => "healthz",
            _ => "other",
        }
    }
}

/// The jwt-service URL for a base URL.
pub fn jwt_url(base: &str) -> String {
    format!("{}{JWT_PATH}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(status: u16) -> ZtsError {
        ZtsError::Rejected {
            status,
            code: i32::from(status),
            message: format!("ZTS says {status}: pod_exists: no such pod"),
        }
    }

    /// ZTS's own codes, as Athenz answers them: a provider's 504 or no answer is 504 and,
    /// with overload (503, 429) and server errors (500, 502), means "try again"; every other
    /// answer is a verdict the pod must see with ZTS's message (which names the check).
    #[test]
    fn zts_answers_are_sorted_into_try_again_and_final() {
        for status in [429, 500, 502, 503, 504] {
            let failure = zts_failure(rejected(status));
            assert_eq!(failure.status, StatusCode::SERVICE_UNAVAILABLE, "{status}");
        }
        let unreachable = zts_failure(ZtsError::Unreachable("connection refused".into()));
        assert_eq!(unreachable.status, StatusCode::SERVICE_UNAVAILABLE);
        for status in [400, 401, 403, 404] {
            let failure = zts_failure(rejected(status));
            assert_eq!(failure.status, StatusCode::FORBIDDEN, "{status}");
            assert!(
                failure.message.contains("pod_exists"),
                "{}",
                failure.message
            );
        }
        let refused = zts_failure(ZtsError::CertificateRefused("bad certificate".into()));
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
    }
}
