//! Which pod a volume's call is for: the subject the kubelet's list confirms (docs/design.md
//! §4.2), the Service IP its certificate may name, and, for a CSI files-mode issuance, the JWT
//! asked for while the kubelet is asked.
//!
//! A files-mode volume's record already names its subject: kubelet's `NodePublishVolume`
//! carried the pod's namespace, name, uid and service account (podInfoOnMount), and such a
//! certificate names no IP. So its JWT and its Service lookup need not wait for the kubelet's
//! list: the three run at once and the list still decides. A refusal drops the JWT unused; a
//! list that names another subject (an IP the kubelet lists by now, for an `ipSAN` volume) gets
//! a JWT of its own. Where the subject names the pod's IP (the socket API) only the list knows
//! it, and the steps run one after another.

use crate::failure::{Failure, fail};
use crate::kubelet::Absent;
use crate::service::{Agent, IssuanceSlot, PodIp};
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::volume::VolumeData;
use http::StatusCode;
use std::net::IpAddr;

/// A pod confirmed by the kubelet's list, with what its issuance needs before the CSR.
pub(crate) struct Admitted<'a> {
    /// The subject as the kubelet's list confirms it.
    pub subject: PodSubject,
    /// The Service IP the certificate names, if that option is on and DNS answered.
    pub service_ip: Option<IpAddr>,
    /// The issuance slot, held until ZTS answers.
    pub slot: IssuanceSlot<'a>,
    /// The identity JWT for `subject`.
    pub jwt: Secret,
}

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

    /// The subject a volume's own record names, when it cannot depend on the kubelet's list:
    /// never with [`PodIp::Required`], whose IP only the list knows. `None` also when the
    /// record does not make a valid subject (the list's answer then decides, one step after
    /// another).
    pub(crate) fn subject_from_volume(&self, data: &VolumeData, ip: PodIp) -> Option<PodSubject> {
        if ip == PodIp::Required {
            return None;
        }
        let domain = self.mapper.namespace_to_domain(&data.namespace).ok()?;
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

    /// Checks the pod with the kubelet while the JWT for `expected` (from
    /// [`Agent::subject_from_volume`]) and its Service IP are asked for: the issuance's steps
    /// before the CSR in the time of the longest. The list's refusal is the answer whatever the
    /// others did; a list naming another subject than `expected` gets its own JWT and lookup.
    pub(crate) async fn admit_while_signing(
        &self,
        data: &VolumeData,
        ip: PodIp,
        absent: Absent,
        expected: PodSubject,
    ) -> Result<Admitted<'_>, Failure> {
        let signing = async {
            let slot = self.issuance_slot().await?;
            let jwt = self.identity_jwt(&expected).await;
            Ok::<_, Failure>((slot, jwt))
        };
        let (checked, service_ip, signed) = tokio::join!(
            self.checked_subject(data, ip, absent),
            self.service_ip(&expected),
            signing
        );
        let subject = checked?;
        let (slot, jwt) = signed?;
        if subject == expected {
            return Ok(Admitted {
                subject,
                service_ip,
                slot,
                jwt: jwt?,
            });
        }
        tracing::debug!(
            namespace = %subject.namespace,
            pod = %subject.name,
            "the kubelet's list names another subject than the volume's record: signing that one"
        );
        let service_ip =
            if (&subject.service, &subject.namespace) == (&expected.service, &expected.namespace) {
                service_ip
            } else {
                self.service_ip(&subject).await
            };
        let jwt = self.identity_jwt(&subject).await?;
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
            .mapper
            .namespace_to_domain(&data.namespace)
            .map_err(|e| fail(StatusCode::FORBIDDEN, e.to_string()))?;
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
