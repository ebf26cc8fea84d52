//! How identities are served: the socket's calls ([`routes`], [`socket`], [`pod_keys`]), the
//! CSI driver's ([`csi`]) and the `CONNECT` tunnel to ZTS ([`tunnel`]). Each call takes its
//! volume's lock, checks who is calling (`crate::attest`), hands the issuance to the manager
//! (`crate::manager`) and answers in its own terms: a walk through the three rooms in that
//! order, never back.

pub mod csi;
pub mod pod_keys;
pub mod routes;
pub mod socket;
pub mod tunnel;

use crate::attest::Attestor;
use crate::manager::Manager;
use crate::metrics::AgentMetrics;
use athenz_core::agent_api::{IdentityResponse, KeySource};
use athenz_core::volume::VolumeId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Inits of one volume within this time of a successful one get that answer instead of a new
/// registration: concurrent callers (an init container retried by kubelet while the first call is
/// still running) see one consistent identity, and ZTS sees one register.
pub const COALESCE: Duration = Duration::from_secs(5);

/// The latest init answer of a volume, kept for [`COALESCE`], with the public key (DER) of the
/// pod's CSR when the pod made the key: a repeated init gets it only for the same key.
#[derive(Default)]
pub struct RecentInit(pub(crate) Option<(std::time::Instant, IdentityResponse, Option<Vec<u8>>)>);

/// Everything the agent's doors share.
pub struct Agent {
    /// Who is calling.
    pub attestor: Attestor,
    /// What is issued and held.
    pub manager: Manager,
    /// Metrics.
    pub metrics: AgentMetrics,
    /// Where socket-mode pods' keys are made (`--key-source`).
    pub key_source: KeySource,
    /// ZTS's base URL, as pods that refresh through the tunnel are told it.
    pub zts_url: String,
    /// The bundle that verifies ZTS, as pods are told it (and find it beside the socket).
    pub zts_ca: Arc<crate::zts_ca::ZtsCa>,
    /// The `CONNECT` tunnel to ZTS.
    pub tunnel: tunnel::Tunnel,
    /// The node's own identity (whether identities can be issued now).
    pub node: Arc<crate::node_identity::NodeIdentity>,
    /// One lock per volume id, held by every call for it (socket, CSI publish and rotation),
    /// with its latest init answer for [`COALESCE`]: a volume has at most one issuance at a
    /// time.
    pub locks: Mutex<HashMap<VolumeId, Arc<Mutex<RecentInit>>>>,
}

impl Agent {
    /// The pod of a socket caller's volume, as the kubelet lists it with its IP (the SIA runs in
    /// the pod's network, so the identity names it).
    async fn socket_pod(
        &self,
        data: &athenz_core::volume::VolumeData,
        registration: athenz_core::issuance::Registration,
    ) -> Result<athenz_core::subject::PodSubject, crate::failure::Failure> {
        self.attestor
            .attest(crate::attest::Claim::KubeletList {
                volume: data,
                ip: crate::attest::PodIp::Required,
                registration,
            })
            .await
    }

    /// Volume `id`'s lock; a lock nobody holds is forgotten once its answer is stale, so the
    /// map does not grow with every pod ever seen (and keys do not stay in memory).
    pub async fn lock_for(&self, id: &VolumeId) -> Arc<Mutex<RecentInit>> {
        let mut locks = self.locks.lock().await;
        locks.retain(|_, l| {
            Arc::strong_count(l) > 1
                || l.try_lock().is_ok_and(|r| {
                    r.0.as_ref()
                        .is_some_and(|(at, _, _)| at.elapsed() < COALESCE)
                })
        });
        Arc::clone(locks.entry(id.clone()).or_default())
    }
}
