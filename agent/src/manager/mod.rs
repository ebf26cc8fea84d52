//! What is issued and held (docs/design.md §4.2, "One identity manager"): every identity this
//! agent issues for a pod, early or on demand, and the records it keeps of them. A request
//! arrives with its pod already attested (`crate::attest`) and a [`Priority`]; the manager
//! takes a slot of its one [`queue::Queue`], asks the jwt-service and ZTS, checks the answer and
//! records it in the volume. Every door holds the volume's lock while it calls
//! (`crate::serve::Agent::lock_for`), so a volume has at most one issuance at a time; an
//! identity issued before its volume exists (early issuance) waits in [`early`] for its
//! publish.
//!
//! | module | job |
//! |---|---|
//! | [`queue`] | the slots, by priority, with their bounds |
//! | `register` | a new instance: the CSR (and the key the agent makes), ZTS's register |
//! | `refresh` | a presented pair checked to be the volume's latest, then ZTS's refresh |
//! | `held` | certificates a pod got from ZTS itself: checked, recorded, and its next JWT |
//! | `record` | the volume's records: its refresh state and its status |
//! | [`early`] | identities issued when their pod is bound here, held for their publish |

pub mod early;
mod held;
pub mod queue;
mod record;
mod refresh;
mod register;

pub use queue::Priority;
pub use refresh::{PresentedPair, check_volume_identity};
pub use register::Registered;

use crate::failure::{Failure, fail};
use crate::metrics::AgentMetrics;
use crate::service_dns::ServiceDns;
use athenz_core::agent_api::KeySource;
use athenz_core::crypto::{CsrInfo, PrivateKey};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::tls;
use athenz_core::volume::VolumesDir;
use athenz_core::zts::ZtsClient;
use http::StatusCode;
use std::net::IpAddr;
use std::sync::Arc;

/// Issues pods' identities and keeps their records.
pub struct Manager {
    /// Metrics.
    pub metrics: AgentMetrics,
    /// Volumes on this node.
    pub volumes: VolumesDir,
    /// Our provider.
    pub provider: String,
    /// SAN DNS suffix.
    pub dns_suffix: String,
    /// The optional Service IP lookup (`None`: no lookup).
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
    /// Every issuance holds one of its slots, from the JWT to ZTS's answer.
    pub queue: Arc<queue::Queue>,
    /// Files-mode identities issued when their pod was bound, waiting for its publish (empty
    /// unless `--csi-early-issue`).
    pub early: Arc<early::EarlyIssues<Registered>>,
    /// How many early issuances may start (`--early-issue-rate`, `--early-issue-burst`).
    pub warmup_rate: std::sync::Mutex<crate::rate::TokenBucket>,
}

/// Where the key of an identity being issued comes from.
#[derive(Debug, Clone, Copy)]
pub enum KeyRequest<'a> {
    /// The agent makes it (pool or on the request path) and hands it over.
    Agent,
    /// The pod made it and sent this CSR, already read and signature-checked.
    Pod(&'a CsrInfo),
}

/// What an issued certificate must be for.
pub struct KeyFor {
    /// The key, when the agent made it (and hands it over).
    made_here: Option<PrivateKey>,
    /// The public key the CSR carried, DER SubjectPublicKeyInfo.
    public_key_der: Vec<u8>,
    source: KeySource,
}

/// A slot of [`Manager::queue`], with the key pool held back while it is held.
pub type IssuanceSlot<'a> = (queue::Slot, crate::key_pool::Busy<'a>);

impl Manager {
    /// One of the slots that bound identities issued at once (from the JWT to ZTS's answer),
    /// in `priority`'s turn.
    ///
    /// While one is held the key pool does not refill, nor while a real-time request waits for
    /// one: pods waiting now come first. Work nobody waits for yet does not hold it back.
    pub async fn slot(&self, priority: Priority) -> IssuanceSlot<'_> {
        if priority == Priority::RealTime {
            let busy = self.keys.busy();
            (self.queue.slot(priority).await, busy)
        } else {
            let slot = self.queue.slot(priority).await;
            (slot, self.keys.busy())
        }
    }

    /// An early issuance's turn under the warm-up rate, once it holds its slot: however fast
    /// pods are bound here (and deleted again), early issuances start at most at that rate;
    /// the rest wait in the queue, where their pod's deletion cancels them, or are overtaken by
    /// their publish.
    pub async fn warmup_pace(&self) {
        loop {
            let taken = self
                .warmup_rate
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(std::time::Instant::now());
            match taken {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// An identity JWT for `subject` from the jwt-service, its time observed.
    async fn identity_jwt(&self, subject: &PodSubject) -> Result<Secret, Failure> {
        let started = std::time::Instant::now();
        let jwt = self.jwt.jwt(subject).await;
        self.metrics.observe("jwt_service", started);
        jwt
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

    /// What the certificate of `subject` must say (docs/design.md §3).
    fn expected_identity(
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

    /// What `subject`'s certificate must say, its Service looked up (a pod making its own key
    /// is told it).
    pub async fn identity_of(&self, subject: &PodSubject) -> Result<CsrIdentity, Failure> {
        let service_ip = self.service_ip(subject).await;
        self.expected_identity(subject, service_ip)
    }
}
