//! Which pod a call is for, and who says so: the kubelet's pod list (the socket API, and a
//! files-mode volume registered again), or the kubelet's own `NodePublishVolume` call (a CSI
//! files-mode volume's first registration); then the Service IP its certificate may name.
//!
//! A files-mode publish comes from the kubelet itself (its plugin socket is reachable by root
//! on this node only) and names the pod it mounts for (podInfoOnMount: namespace, name, uid,
//! service account), and the certificate it gets names no IP. The kubelet's list would say the
//! same thing the same kubelet just said, and cost the kubelet a serialisation of every pod on
//! the node and this agent a parse, on the path of every new pod. So that registration reads
//! no list: its JWT and Service lookup start at once. Nothing is trusted that was not before:
//! ZTS's callback checks every registration's pod with the API server (uid, service account,
//! not terminating, and scheduled on the node whose agent asked: docs/design.md §4.4), the
//! check a node cannot get around, where this agent's own check only repeats its kubelet.

use crate::failure::{Failure, fail};
use crate::kubelet::Absent;
use crate::manager::queue::Priority;
use crate::service::{Admitted, Agent, IssuanceSlot, PodIp};
use athenz_core::subject::PodSubject;
use athenz_core::volume::VolumeData;
use http::StatusCode;
use std::net::IpAddr;

impl Agent {
    /// The pod of a volume, checked by the kubelet's list ([`Agent::checked_subject`]), and the
    /// Service IP its certificate may name.
    pub(crate) async fn pod_subject(
        &self,
        data: &VolumeData,
        ip: PodIp,
        absent: Absent,
    ) -> Result<(PodSubject, Option<IpAddr>), Failure> {
        let subject = self.checked_subject(data, ip, absent).await?;
        let service_ip = self.service_ip(&subject).await;
        Ok((subject, service_ip))
    }

    /// The subject a CSI files-mode volume's record names (what kubelet's publish said), when
    /// it makes a valid one: never with [`PodIp::Required`], whose IP only the list knows.
    pub(crate) async fn subject_from_volume(
        &self,
        data: &VolumeData,
        ip: PodIp,
    ) -> Option<PodSubject> {
        if ip == PodIp::Required {
            return None;
        }
        let domain = self.domains.domain_of(&data.namespace).await.ok()?;
        PodSubject::new(
            data.namespace.clone(),
            data.pod_name.clone(),
            data.pod_uid.clone(),
            domain,
            data.service_account.clone(),
            None,
        )
        .ok()
    }

    /// The subject of a pod the API server bound to this node (crate::early_issue), when it
    /// makes a valid one: named as a publish for it will name it, with no IP (a files-mode
    /// volume's first certificate has none).
    pub(crate) async fn subject_of_bound(
        &self,
        pod: &crate::early_issue::BoundPod,
    ) -> Option<PodSubject> {
        let namespace = pod.namespace()?;
        let domain = self.domains.domain_of(namespace).await.ok()?;
        PodSubject::new(
            namespace.to_owned(),
            pod.name()?.to_owned(),
            pod.uid()?.to_owned(),
            domain,
            pod.service_account.clone(),
            None,
        )
        .ok()
    }

    /// What the issuance of `subject`, vouched for by the kubelet's call, needs before its CSR:
    /// the JWT (once a slot of `priority` is free, or in the `held` one) and the Service IP,
    /// asked for at once.
    pub(crate) async fn admit_vouched<'a>(
        &'a self,
        subject: PodSubject,
        priority: Priority,
        held: Option<IssuanceSlot<'a>>,
    ) -> Result<Admitted<'a>, Failure> {
        let signing = async {
            let slot = match held {
                Some(slot) => slot,
                None => self.issuance_slot(priority).await,
            };
            let jwt = self.identity_jwt(&subject).await?;
            Ok::<_, Failure>((slot, jwt))
        };
        let (service_ip, signed) = tokio::join!(self.service_ip(&subject), signing);
        let (slot, jwt) = signed?;
        Ok(Admitted {
            subject,
            service_ip,
            slot,
            jwt,
        })
    }

    /// The pod of a volume as the kubelet lists it, checked: on this node, same uid, not
    /// terminating, and with an IP if `ip` is [`PodIp::Required`] (a CSI files-mode volume is
    /// published before the pod has one). With [`PodIp::Omitted`] the subject names no IP
    /// whatever the pod has.
    async fn checked_subject(
        &self,
        data: &VolumeData,
        ip: PodIp,
        absent: Absent,
    ) -> Result<PodSubject, Failure> {
        let started = std::time::Instant::now();
        let found = self
            .pods
            .find(
                &data.namespace,
                &data.pod_name,
                &data.pod_uid,
                self.pod_wait,
                absent,
                match ip {
                    PodIp::Required => crate::kubelet::IpWait::Wait,
                    PodIp::Optional | PodIp::Omitted => crate::kubelet::IpWait::DontWait,
                },
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
                        "pod {}/{} is not on this node ({})",
                        data.namespace,
                        data.pod_name,
                        self.node.node_name()
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
            return Err(fail(
                StatusCode::FORBIDDEN,
                format!("pod {}/{} is being deleted", data.namespace, data.pod_name),
            ));
        }
        // an IP from a sandbox older than the node died with it: until the kubelet reports the
        // new one, the pod has no IP this agent may name
        let stale = pod.ip.is_some() && !pod.sandbox.ip_is_current(self.node_boot);
        let pod_ip = pod.ip.as_deref().filter(|_| !stale && ip != PodIp::Omitted);
        if pod_ip.is_none() && ip == PodIp::Required {
            return Err(fail(
                StatusCode::SERVICE_UNAVAILABLE,
                if stale {
                    "the pod's listed IP is its sandbox's from before this node started; waiting \
                     for the kubelet to report the new one"
                } else {
                    "the pod has no IP yet"
                },
            ));
        }
        let domain = self
            .domains
            .domain_of(&data.namespace)
            .await
            .map_err(|e| match e {
                athenz_core::names::DomainLookupError::Refused(_) => {
                    fail(StatusCode::FORBIDDEN, e.to_string())
                }
                athenz_core::names::DomainLookupError::Unavailable { .. } => {
                    fail(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                }
            })?;
        let account = pod.service_account.clone();
        PodSubject::new(
            data.namespace.clone(),
            data.pod_name.clone(),
            data.pod_uid.clone(),
            domain,
            account,
            pod_ip,
        )
        .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))
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
}
