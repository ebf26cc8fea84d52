//! A new instance: the pod's identity JWT, the CSR (and the key, when the agent makes it), ZTS's
//! `postInstanceRegisterInformation`, and its record in the volume.

use super::{IssuanceSlot, KeyFor, KeyRequest, Manager, Priority};
use crate::failure::{Failure, fail, zts_failure};
use athenz_core::agent_api::KeySource;
use athenz_core::crypto::build_csr;
use athenz_core::issuance::Issued;
use athenz_core::names::CsrIdentity;
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::volume::{VolumeData, VolumeId};
use athenz_core::zts::{InstanceIdentity, InstanceRegisterInformation};
use http::StatusCode;
use std::net::IpAddr;

/// A registration ZTS answered, held in memory until a volume records it.
pub struct Registered {
    /// Whom it is for.
    pub(super) subject: PodSubject,
    /// Its key.
    pub(super) key: KeyFor,
    /// ZTS's answer.
    pub(super) identity: InstanceIdentity,
}

/// What a registration needs before its CSR: the Service IP its certificate may name, its
/// slot (held until ZTS answers) and the identity JWT.
struct Admitted<'a> {
    service_ip: Option<IpAddr>,
    slot: IssuanceSlot<'a>,
    jwt: Secret,
}

impl Manager {
    /// Registers a new instance for `subject` as volume `id` of pod `data` and records it: a
    /// socket init, a files-mode publish or its registration again. A pod's CSR is checked
    /// against what its certificate must say before a JWT is asked for: a refusal costs no JWT.
    pub async fn register(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        subject: PodSubject,
        key: KeyRequest<'_>,
        priority: Priority,
    ) -> Result<Issued, Failure> {
        let paths = self.volumes.volume(id);
        self.check_volume_pod(&paths, data)?;
        let admitted = match key {
            KeyRequest::Pod(csr) => {
                let service_ip = self.service_ip(&subject).await;
                crate::csr_check::check(csr, &self.expected_identity(&subject, service_ip)?)?;
                let slot = self.slot(priority).await;
                let jwt = self.identity_jwt(&subject).await?;
                Admitted {
                    service_ip,
                    slot,
                    jwt,
                }
            }
            KeyRequest::Agent => self.admit(&subject, priority, None).await?,
        };
        let registered = self.zts_register(subject, admitted, key).await?;
        self.write_registered(&paths, registered)
    }

    /// A files-mode volume's first identity, for `subject` named by the kubelet's publish: the
    /// one issued when its pod was bound, if there is one for this very pod (waiting for it
    /// while it is under way), else registered now in real time with a key made here (nothing
    /// runs in the pod).
    pub async fn publish(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        subject: PodSubject,
    ) -> Result<Issued, Failure> {
        let pod = super::early::PodNames {
            namespace: data.namespace.clone(),
            name: data.pod_name.clone(),
            service_account: data.service_account.clone(),
        };
        match self.early.take(&data.pod_uid, &pod).await {
            Some(registered) => self.record_registered(id, data, registered),
            None => {
                self.register(id, data, subject, KeyRequest::Agent, Priority::RealTime)
                    .await
            }
        }
    }

    /// Registers `subject` before its volume exists (early issuance), in the warm-up `slot`
    /// taken before anything else was asked, with a key the agent makes; nothing is written
    /// until its publish ([`Manager::publish`]) gives it a volume.
    pub async fn register_ahead(
        &self,
        subject: PodSubject,
        slot: IssuanceSlot<'_>,
    ) -> Result<Registered, Failure> {
        let priority = slot.0.priority();
        let admitted = self.admit(&subject, priority, Some(slot)).await?;
        self.zts_register(subject, admitted, KeyRequest::Agent)
            .await
    }

    /// Records a registration made before its volume existed as volume `id` of pod `data`'s
    /// (refused if the volume already holds another pod's identity).
    fn record_registered(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        registered: Registered,
    ) -> Result<Issued, Failure> {
        let paths = self.volumes.volume(id);
        self.check_volume_pod(&paths, data)?;
        self.write_registered(&paths, registered)
    }

    /// The JWT (in the `held` slot, or once one of `priority` is free) and the Service IP,
    /// asked for at once.
    async fn admit<'a>(
        &'a self,
        subject: &PodSubject,
        priority: Priority,
        held: Option<IssuanceSlot<'a>>,
    ) -> Result<Admitted<'a>, Failure> {
        let signing = async {
            let slot = match held {
                Some(slot) => slot,
                None => self.slot(priority).await,
            };
            let jwt = self.identity_jwt(subject).await?;
            Ok::<_, Failure>((slot, jwt))
        };
        let (service_ip, signed) = tokio::join!(self.service_ip(subject), signing);
        let (slot, jwt) = signed?;
        Ok(Admitted {
            service_ip,
            slot,
            jwt,
        })
    }

    /// ZTS's registration of an admitted pod: the CSR (and the key when the agent makes it),
    /// then `postInstanceRegisterInformation`.
    async fn zts_register(
        &self,
        subject: PodSubject,
        admitted: Admitted<'_>,
        key: KeyRequest<'_>,
    ) -> Result<Registered, Failure> {
        let Admitted {
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

    /// The CSR to send ZTS and the key it is for: the agent's own key and CSR, or the pod's CSR
    /// (checked against `identity` by the caller, before the JWT was asked for).
    pub(super) async fn csr(
        &self,
        identity: &CsrIdentity,
        key: KeyRequest<'_>,
    ) -> Result<(KeyFor, String), Failure> {
        match key {
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
}
