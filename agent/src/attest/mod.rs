//! Who is calling (docs/design.md §4.2): which pod a request is for, and who on this node says
//! so. Three vouchers, one shape: a [`Claim`] names a pod and what vouches for it, and
//! [`Attestor::attest`] answers with the pod's subject or a refusal naming why. A socket caller
//! is first checked to be a process of its volume's pod ([`Attestor::check_peer`]), before
//! anything of its request is read.
//!
//! A files-mode publish comes from the kubelet itself (its plugin socket is reachable by root
//! on this node only) and names the pod it mounts for (podInfoOnMount: namespace, name, uid,
//! service account), and the certificate it gets names no IP. The kubelet's list would say the
//! same thing the same kubelet just said, and cost the kubelet a serialisation of every pod on
//! the node and this agent a parse, on the path of every new pod. So that claim
//! ([`Claim::KubeletCall`]) reads no list. Nothing is trusted that was not before: ZTS's
//! callback checks every registration's pod with the API server (uid, service account, not
//! terminating, and scheduled on the node whose agent asked: docs/design.md §4.4), the check a
//! node cannot get around, where this agent's own check only repeats its kubelet. The API
//! server's binding ([`Claim::ApiBinding`], early issuance) is the fact the kubelet's call rests
//! on, one step earlier.

mod kubelet_list;
mod peer;

use crate::failure::{Failure, fail};
use crate::kubelet::PodCache;
use crate::manager::early::BoundPod;
use crate::metrics::AgentMetrics;
use athenz_core::http::ConnInfo;
use athenz_core::issuance::Registration;
use athenz_core::names::{DomainLookupError, NamespaceDomains};
use athenz_core::peer::PeerCheck;
use athenz_core::subject::PodSubject;
use athenz_core::volume::{VolumeData, VolumeError, VolumeId, VolumesDir, read_json_file};
use http::StatusCode;
use std::time::Duration;

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

/// A pod, and what on this node vouches that a request is for it.
#[derive(Debug, Clone, Copy)]
pub enum Claim<'a> {
    /// The kubelet's pod list: the pod `volume` was mounted for, as listed now (the socket's
    /// calls, where the list also gives the pod's IP; a files-mode volume registered again,
    /// whose pod may be gone).
    KubeletList {
        /// The volume's record.
        volume: &'a VolumeData,
        /// Whether the subject names the pod's IP.
        ip: PodIp,
        /// A first registration's pod may not be listed yet; one registered before must be.
        registration: Registration,
    },
    /// The kubelet's own `NodePublishVolume` call named the pod (a files-mode volume's first
    /// registration): the volume's record, no list read, no IP named.
    KubeletCall {
        /// The volume's record, as the publish wrote it.
        volume: &'a VolumeData,
    },
    /// The API server bound the pod to this node (early issuance): named as its publish will
    /// name it, with no IP.
    ApiBinding {
        /// The pod as the watch delivered it.
        pod: &'a BoundPod,
    },
}

/// Answers "which pod is this, and may it have an identity here".
pub struct Attestor {
    /// Metrics (kubelet latency, peer checks).
    pub metrics: AgentMetrics,
    /// The node's pods as the kubelet lists them.
    pub pods: PodCache,
    /// How long to wait for the kubelet to list a pod.
    pub pod_wait: Duration,
    /// When this node started (Unix seconds): a listed IP from an older sandbox is stale.
    pub node_boot: i64,
    /// Namespace → domain (with the annotations the install honours).
    pub domains: NamespaceDomains,
    /// Whether socket callers must be processes of the volume's pod.
    pub peer_check: PeerCheck,
    /// This node's name, for refusals.
    pub node_name: String,
    /// Volumes on this node: what each mount recorded names the pod its callers must be in.
    pub volumes: VolumesDir,
}

impl Attestor {
    /// What volume `id`'s mount recorded (the pod it is for): 404 for an unknown volume.
    pub fn volume(&self, id: &VolumeId) -> Result<VolumeData, Failure> {
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
        Ok(data)
    }

    /// The socket caller on `conn`, checked to be a process of volume `id`'s pod
    /// ([`Attestor::check_peer`]): the volume's record, before anything of the request is read.
    pub fn caller(&self, id: &VolumeId, conn: &ConnInfo) -> Result<VolumeData, Failure> {
        let data = self.volume(id)?;
        self.check_peer(id, &data, conn)?;
        Ok(data)
    }

    /// The subject of the pod `claim` names, once what vouches for it agrees.
    pub async fn attest(&self, claim: Claim<'_>) -> Result<PodSubject, Failure> {
        match claim {
            Claim::KubeletList {
                volume,
                ip,
                registration,
            } => self.listed(volume, ip, registration).await,
            Claim::KubeletCall { volume } => {
                self.named(
                    &volume.namespace,
                    &volume.pod_name,
                    &volume.pod_uid,
                    &volume.service_account,
                )
                .await
            }
            Claim::ApiBinding { pod } => {
                let (Some(namespace), Some(name), Some(uid)) =
                    (pod.namespace(), pod.name(), pod.uid())
                else {
                    return Err(fail(
                        StatusCode::BAD_REQUEST,
                        "the API server's pod lacks its namespace, name or uid",
                    ));
                };
                self.named(namespace, name, uid, &pod.service_account).await
            }
        }
    }

    /// The subject of a pod named by something this node trusts, with no IP.
    async fn named(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        service_account: &str,
    ) -> Result<PodSubject, Failure> {
        let domain = self.domain_of(namespace).await?;
        PodSubject::new(
            namespace.to_owned(),
            name.to_owned(),
            uid.to_owned(),
            domain,
            service_account.to_owned(),
            None,
        )
        .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))
    }

    /// The Athenz domain of `namespace` (403 refused, 503 its annotation cannot be read now).
    async fn domain_of(&self, namespace: &str) -> Result<String, Failure> {
        self.domains
            .domain_of(namespace)
            .await
            .map_err(|e| match e {
                DomainLookupError::Refused(_) => fail(StatusCode::FORBIDDEN, e.to_string()),
                DomainLookupError::Unavailable { .. } => {
                    fail(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                }
            })
    }
}
