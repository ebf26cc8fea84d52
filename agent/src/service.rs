//! The agent's socket API (docs/design.md §4.2): `POST /v1/init/{id}`, `POST /v1/refresh/{id}`,
//! `GET /healthz`. Every id is parsed before any file is touched; calls for one id are serialised;
//! ZTS calls across ids are bounded.

use crate::failure::{Failure, fail, zts_failure};
use crate::kubelet::{Absent, PodCache};
use crate::manager::queue::Priority;
pub use crate::metrics::AgentMetrics;
use crate::metrics::PeerCheckLabels;
pub use crate::service_dns::ServiceDns;
use athenz_core::agent_api::{IdentityResponse, InitRequest, KeySource};
use athenz_core::crypto::{CertInfo, CsrInfo, PrivateKey, build_csr};
use athenz_core::http::ConnInfo;
use athenz_core::names::{CsrIdentity, NamespaceDomains, PodIdentityInput};
use athenz_core::peer::PeerCheck;
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::tls;
use athenz_core::volume::{
    VolumeData, VolumeError, VolumeId, VolumePaths, VolumeState, VolumeStatusRecord, VolumesDir,
    read_json_file, write_json_record,
};
use athenz_core::zts::{InstanceIdentity, InstanceRegisterInformation, ZtsClient};
use athenz_csi_driver::Issued;
use http::StatusCode;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Inits of one volume within this time of a successful one get that answer instead of a new
/// registration: concurrent callers (an init container retried by kubelet while the first call is
/// still running) see one consistent identity, and ZTS sees one register.
const COALESCE: Duration = Duration::from_secs(5);

/// Whether the identity names the pod's IP, and whether it may be issued before the pod has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodIp {
    /// The socket API: the SIA runs inside the pod's network, so a missing IP is transient.
    Required,
    /// CSI files mode with `ipSAN: "true"`: the volume is published before the sandbox has an
    /// IP; the first certificate carries none and is re-issued once the kubelet lists one.
    Optional,
    /// CSI files mode without `ipSAN`: the certificate never names the pod's IP, so one
    /// issuance at publish serves until the refresh is due.
    Omitted,
}

impl PodIp {
    /// What a files-mode volume asks for (`volumeAttributes.ipSAN`).
    pub fn for_files_volume(data: &VolumeData) -> Self {
        if data.csi.as_ref().is_some_and(|c| c.ip_san) {
            Self::Optional
        } else {
            Self::Omitted
        }
    }
}

/// Who confirms, on this node, the pod a registration is for. ZTS's callback checks the pod
/// again with the API server whatever this says (docs/design.md §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodCheck {
    /// The kubelet's pod list: the socket API (the list says which pod the calling process's
    /// volume is for, and its IP), and a files-mode volume registered again (its pod may be
    /// gone).
    KubeletList(Absent),
    /// The kubelet's own `NodePublishVolume` call, which named the pod: a CSI files-mode
    /// volume's first registration reads no list (`crate::pod_subject` says why).
    KubeletCall,
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
    /// When this node started (Unix seconds): a listed IP from an older sandbox is stale.
    pub node_boot: i64,
    /// Namespace → domain (with the annotations the install honours).
    pub domains: NamespaceDomains,
    /// Our provider.
    pub provider: String,
    /// SAN DNS suffix.
    pub dns_suffix: String,
    /// The optional service IP lookup (`None`: no lookup).
    pub service_dns: Option<ServiceDns>,
    /// Pods' keys (RSA ones made ahead).
    pub keys: Arc<crate::key_pool::KeyPool>,
    /// The jwt-service client (mutual TLS with the node's certificate).
    pub jwt: crate::jwt_client::JwtClient,
    /// ZTS.
    pub zts: ZtsClient,
    /// The CA bundle Athenz issues instance certificates under: presented certificates must
    /// chain to it.
    pub athenz_ca: tls::IssuerCheck,
    /// The node's own identity (the jwt-service client certificate).
    pub node: Arc<crate::node_identity::NodeIdentity>,
    /// Whether callers must be processes of the volume's pod.
    pub peer_check: PeerCheck,
    /// Every identity issued for a pod holds one of its slots, from the JWT to ZTS's answer:
    /// bounded in all and by priority (docs/design.md §4.2).
    pub queue: Arc<crate::manager::queue::Queue>,
    /// One lock per volume id, holding its latest init answer for [`COALESCE`].
    pub locks: Mutex<HashMap<VolumeId, Arc<Mutex<RecentInit>>>>,
    /// Where socket-mode pods' keys are made (`--key-source`).
    pub key_source: KeySource,
    /// ZTS's base URL, as pods that refresh through the tunnel are told it.
    pub zts_url: String,
    /// The bundle that verifies ZTS, as pods are told it (and find it beside the socket).
    pub zts_ca: Arc<crate::zts_ca::ZtsCa>,
    /// The `CONNECT` tunnel to ZTS.
    pub tunnel: crate::tunnel::Tunnel,
    /// Files-mode identities issued when their pod was bound, waiting for its publish (empty
    /// unless `--csi-early-issue`).
    pub(crate) early: Arc<crate::early_issue::EarlyIssues<Registered>>,
}

/// The latest init answer of a volume, kept for [`COALESCE`], with the public key (DER) of the
/// pod's CSR when the pod made the key: a repeated init gets it only for the same key.
#[derive(Default)]
pub struct RecentInit(pub(crate) Option<(std::time::Instant, IdentityResponse, Option<Vec<u8>>)>);

/// Where the key of an identity being issued comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyRequest<'a> {
    /// The agent makes it (pool or on the request path) and hands it over.
    Agent,
    /// The pod made it and sent this CSR, already read and signature-checked.
    Pod(&'a CsrInfo),
}

/// A slot of [`Agent::queue`], with the key pool held back while it is held.
pub(crate) type IssuanceSlot<'a> = (crate::manager::queue::Slot, crate::key_pool::Busy<'a>);

/// A pod confirmed on this node, with what its issuance needs before the CSR.
pub(crate) struct Admitted<'a> {
    /// The subject.
    pub(crate) subject: PodSubject,
    /// The Service IP the certificate names, if that option is on and DNS answered.
    pub(crate) service_ip: Option<IpAddr>,
    /// The issuance slot, held until ZTS answers.
    pub(crate) slot: IssuanceSlot<'a>,
    /// The identity JWT for `subject`.
    pub(crate) jwt: Secret,
}

/// What an issued certificate must be for.
pub(crate) struct KeyFor {
    /// The key, when the agent made it (and hands it over).
    made_here: Option<PrivateKey>,
    /// The public key the CSR carried, DER SubjectPublicKeyInfo.
    public_key_der: Vec<u8>,
    source: KeySource,
}

/// A registration ZTS answered, held in memory until a volume records it.
pub(crate) struct Registered {
    /// Whom it is for.
    pub(crate) subject: PodSubject,
    /// Its key.
    pub(crate) key: KeyFor,
    /// ZTS's answer.
    pub(crate) identity: InstanceIdentity,
}

/// A volume's refresh state, once written, names the pod it was first issued for: no other
/// pod's registration may replace it.
fn check_volume_pod(paths: &VolumePaths, data: &VolumeData) -> Result<(), Failure> {
    match read_json_file::<VolumeState>(&paths.state_json) {
        Ok(state) if state.pod_uid != data.pod_uid => Err(fail(
            StatusCode::FORBIDDEN,
            "this volume was initialised for another pod",
        )),
        _ => Ok(()),
    }
}

impl Agent {
    /// An identity JWT for `subject` from the jwt-service, its time observed.
    pub(crate) async fn identity_jwt(&self, subject: &PodSubject) -> Result<Secret, Failure> {
        let started = std::time::Instant::now();
        let jwt = self.jwt.jwt(subject).await;
        self.metrics.observe("jwt_service", started);
        jwt
    }

    pub(crate) async fn lock_for(&self, id: &VolumeId) -> Arc<Mutex<RecentInit>> {
        let mut locks = self.locks.lock().await;
        // forget locks nobody holds once their answer is stale, so the map does not grow with
        // every pod ever seen (and keys do not stay in memory)
        locks.retain(|_, l| {
            Arc::strong_count(l) > 1
                || l.try_lock().is_ok_and(|r| {
                    r.0.as_ref()
                        .is_some_and(|(at, _, _)| at.elapsed() < COALESCE)
                })
        });
        Arc::clone(locks.entry(id.clone()).or_default())
    }

    pub(crate) fn volume(&self, id: &VolumeId) -> Result<(VolumePaths, VolumeData), Failure> {
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

    /// The caller is a process of the volume's pod (docs/design.md §4.2): its cgroup names the pod
    /// UID the volume was mounted for. `log` mode lets a mismatch through and logs it.
    pub(crate) fn check_peer(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        conn: &ConnInfo,
    ) -> Result<(), Failure> {
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

    /// What the certificate of `subject` must say (docs/design.md §3).
    pub(crate) fn expected_identity(
        &self,
        subject: &PodSubject,
        service_ip: Option<IpAddr>,
    ) -> Result<CsrIdentity, Failure> {
        CsrIdentity::for_pod(&PodIdentityInput {
            domain: &subject.domain,
            service: &subject.service,
            provider: &self.provider,
            dns_suffix: &self.dns_suffix,
            instance_id: &subject.uid,
            pod_ip: subject.ip,
            service_ip,
        })
        .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))
    }

    /// The CSR to send ZTS and the key it is for: the agent's own key and CSR, or the pod's CSR
    /// once it says exactly what `identity` says (400 naming each difference otherwise).
    pub(crate) async fn csr(
        &self,
        identity: &CsrIdentity,
        key: KeyRequest<'_>,
    ) -> Result<(KeyFor, String), Failure> {
        match key {
            // checked against `identity` by the caller, before the JWT was asked for
            KeyRequest::Pod(csr) => {
                let pem = athenz_core::crypto::der_to_pem_labelled(&csr.der, "CERTIFICATE REQUEST");
                let key = KeyFor {
                    made_here: None,
                    public_key_der: csr.public_key_der.clone(),
                    source: KeySource::Pod,
                };
                Ok((key, pem))
            }
            KeyRequest::Agent => {
                let (key, source) = self
                    .keys
                    .take()
                    .await
                    .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                self.metrics.key_taken(source, self.keys.ready());
                let csr = build_csr(identity, &key)
                    .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                let key = KeyFor {
                    public_key_der: key.public_key_der(),
                    made_here: Some(key),
                    source: KeySource::Agent,
                };
                Ok((key, csr))
            }
        }
    }

    /// Builds the answer and saves the state.
    pub(crate) fn finish(
        &self,
        paths: &VolumePaths,
        subject: &PodSubject,
        key: &KeyFor,
        identity: &InstanceIdentity,
        previous_serial: Option<String>,
    ) -> Result<Issued, Failure> {
        let leaf = identity
            .x509_certificate
            .as_deref()
            .ok_or_else(|| fail(StatusCode::BAD_GATEWAY, "ZTS sent no certificate"))?;
        let info = CertInfo::from_pem(leaf)
            .map_err(|e| fail(StatusCode::BAD_GATEWAY, format!("ZTS's certificate: {e}")))?;
        if info.public_key_der != key.public_key_der {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                "ZTS's certificate is not for the key sent",
            ));
        }
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
            key_source: Some(key.source),
        };
        self.metrics
            .cert_expiry
            .set(info.not_after.unix_timestamp());
        write_json_record(&paths.state_json, &state)
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let key_pem = key
            .made_here
            .as_ref()
            .map(PrivateKey::to_pkcs8_pem)
            .transpose()
            .map_err(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let answer = IdentityResponse::from_instance_identity(identity, leaf, &info, key_pem);
        Ok(Issued { answer, cert: info })
    }

    /// One of the slots that bound identities issued at once (from the JWT to ZTS's answer),
    /// in `priority`'s turn.
    ///
    /// While one is held the key pool does not refill, nor while a real-time request waits for
    /// one: pods waiting now come first. Work nobody waits for yet does not hold it back.
    pub(crate) async fn issuance_slot(&self, priority: Priority) -> IssuanceSlot<'_> {
        if priority == Priority::RealTime {
            let busy = self.keys.busy();
            (self.queue.slot(priority).await, busy)
        } else {
            let slot = self.queue.slot(priority).await;
            (slot, self.keys.busy())
        }
    }

    /// `POST /v1/init/{id}`: with the pod's CSR when the agent runs with pod-made keys, with
    /// none (`{}`) when it makes the key.
    pub async fn init(
        &self,
        id: &VolumeId,
        body: &[u8],
        conn: &ConnInfo,
    ) -> Result<IdentityResponse, Failure> {
        // the caller first: nothing of the request is read for a process that is not the pod
        let lock = self.lock_for(id).await;
        let mut recent = lock.lock().await;
        let (paths, data) = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        // an empty body is `{}`: what clients before pod-made keys could send
        let body = if body.is_empty() { b"{}" } else { body };
        let request: InitRequest = serde_json::from_slice(body).map_err(|e| {
            fail(
                StatusCode::BAD_REQUEST,
                format!("invalid init request: {e}"),
            )
        })?;
        let csr = match (self.key_source, &request.csr) {
            (KeySource::Pod, Some(pem)) => Some(
                CsrInfo::from_pem(pem)
                    .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("the pod's CSR: {e}")))?,
            ),
            (KeySource::Pod, None) => {
                return Err(fail(
                    StatusCode::BAD_REQUEST,
                    "this agent runs with --key-source pod (KEY_SOURCE): an init must carry the \
                     pod's CSR and no key is handed out; run the SIA with --key-source pod",
                ));
            }
            (KeySource::Agent, Some(_)) => {
                return Err(fail(
                    StatusCode::BAD_REQUEST,
                    "this agent runs with --key-source agent (KEY_SOURCE): it makes the pod's \
                     key, so an init carries no CSR; run the SIA with --key-source agent",
                ));
            }
            (KeySource::Agent, None) => None,
        };
        let public_key = csr.as_ref().map(|c| c.public_key_der.clone());
        if let Some((at, answer, key)) = &recent.0
            && at.elapsed() < COALESCE
            && *key == public_key
        {
            return Ok(answer.clone());
        }
        let key = match &csr {
            Some(csr) => KeyRequest::Pod(csr),
            None => KeyRequest::Agent,
        };
        let answer = self
            .register(
                &paths,
                &data,
                PodIp::Required,
                PodCheck::KubeletList(Absent::MayAppear),
                key,
                Priority::RealTime,
            )
            .await?
            .answer;
        self.metrics.issued("init", self.key_source);
        recent.0 = Some((std::time::Instant::now(), answer.clone(), public_key));
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
        check: PodCheck,
        key: KeyRequest<'_>,
        priority: Priority,
    ) -> Result<Issued, Failure> {
        check_volume_pod(paths, data)?;
        // One slot per identity being issued, held from the JWT to ZTS's answer: it bounds the
        // connections to the jwt-service and ZTS (and their TLS buffers in this process) however
        // many pods start at once, and a JWT is used moments after it is signed.
        let admitted = match (check, key, self.subject_from_volume(data, ip).await) {
            // kubelet's publish named the pod: no list is read (crate::pod_subject says why)
            (PodCheck::KubeletCall, KeyRequest::Agent, Some(subject)) => {
                self.admit_vouched(subject, priority, None).await?
            }
            (check, _, _) => {
                let absent = match check {
                    PodCheck::KubeletList(absent) => absent,
                    PodCheck::KubeletCall => Absent::MayAppear,
                };
                let (subject, service_ip) = self.pod_subject(data, ip, absent).await?;
                // the pod's CSR is checked before anything leaves the node: a refusal costs no
                // JWT
                if let KeyRequest::Pod(csr) = key {
                    let identity = self.expected_identity(&subject, service_ip)?;
                    crate::csr_check::check(csr, &identity)?;
                }
                let slot = self.issuance_slot(priority).await;
                let jwt = self.identity_jwt(&subject).await?;
                Admitted {
                    subject,
                    service_ip,
                    slot,
                    jwt,
                }
            }
        };
        let registered = self.register_admitted(admitted, key).await?;
        self.finish_registered(paths, registered)
    }

    /// Registers a pod that something on this node already vouched for (the kubelet's
    /// publish, or the API server binding the pod here: `crate::early_issue`), with a key the
    /// agent makes, and keeps the answer in memory: nothing is written until
    /// [`Agent::record_registered`] gives it a volume.
    pub(crate) async fn register_vouched(
        &self,
        subject: PodSubject,
        slot: IssuanceSlot<'_>,
    ) -> Result<Registered, Failure> {
        let admitted = self
            .admit_vouched(subject, slot.0.priority(), Some(slot))
            .await?;
        self.register_admitted(admitted, KeyRequest::Agent).await
    }

    /// ZTS's registration of an admitted pod: the CSR (and the key when the agent makes it),
    /// then `postInstanceRegisterInformation`.
    async fn register_admitted(
        &self,
        admitted: Admitted<'_>,
        key: KeyRequest<'_>,
    ) -> Result<Registered, Failure> {
        let Admitted {
            subject,
            service_ip,
            slot: _slot,
            jwt,
        } = admitted;
        let identity = self.expected_identity(&subject, service_ip)?;
        let (key, csr) = self.csr(&identity, key).await?;
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
        Ok(Registered {
            subject,
            key,
            identity: registered.identity,
        })
    }

    /// Records a registration made before its volume existed as volume `paths` of pod `data`'s
    /// (refused if the volume already holds another pod's identity).
    pub(crate) fn record_registered(
        &self,
        paths: &VolumePaths,
        data: &VolumeData,
        registered: Registered,
    ) -> Result<Issued, Failure> {
        check_volume_pod(paths, data)?;
        self.finish_registered(paths, registered)
    }

    /// Builds the answer of a registration and saves its state.
    fn finish_registered(
        &self,
        paths: &VolumePaths,
        registered: Registered,
    ) -> Result<Issued, Failure> {
        // a registration starts a new record in ZTS: no earlier certificate refreshes
        self.finish(
            paths,
            &registered.subject,
            &registered.key,
            &registered.identity,
            None,
        )
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
}
