//! The pod a volume was mounted for, as the kubelet lists it now: on this node, the same uid,
//! not terminating, and with an IP when the identity must name one.

use super::{Attestor, PodIp};
use crate::failure::{Failure, fail};
use crate::kubelet::IpWait;
use athenz_core::issuance::Registration;
use athenz_core::subject::PodSubject;
use athenz_core::volume::VolumeData;
use http::StatusCode;
use std::net::IpAddr;

impl Attestor {
    /// The pod of `data` as the kubelet lists it, checked: on this node, same uid, not
    /// terminating, and with an IP if `ip` is [`PodIp::Required`] (a CSI files-mode volume is
    /// published before the pod has one). With [`PodIp::Omitted`] the subject names no IP
    /// whatever the pod has.
    pub(super) async fn listed(
        &self,
        data: &VolumeData,
        ip: PodIp,
        registration: Registration,
    ) -> Result<PodSubject, Failure> {
        let started = std::time::Instant::now();
        let found = self
            .pods
            .find(
                &data.namespace,
                &data.pod_name,
                &data.pod_uid,
                self.pod_wait,
                registration,
                match ip {
                    PodIp::Required => IpWait::Wait,
                    PodIp::Optional | PodIp::Omitted => IpWait::DontWait,
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
                        data.namespace, data.pod_name, self.node_name
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
        let domain = self.domain_of(&data.namespace).await?;
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

    /// The pod's IP as the kubelet lists it now (`None`: none yet, not listed, or another pod
    /// by that name); an IP from a sandbox older than the node is not the pod's
    /// (`kubelet::Sandbox`).
    pub async fn listed_ip(
        &self,
        data: &VolumeData,
    ) -> Result<Option<IpAddr>, crate::kubelet::KubeletError> {
        let pod = self.pods.current(&data.namespace, &data.pod_name).await?;
        Ok(pod
            .filter(|p| p.uid == data.pod_uid && p.sandbox.ip_is_current(self.node_boot))
            .and_then(|p| p.ip.as_deref().and_then(|ip| ip.parse().ok())))
    }
}
