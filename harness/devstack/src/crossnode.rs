//! What a compromised node can try for a pod scheduled elsewhere (docs/design.md §4.9, §6): bypass
//! its agent and use its own node certificate directly — ask the jwt-service for the pod's JWT,
//! then register the pod's identity with ZTS (or refresh it with the pod's stolen pair). The
//! jwt-service writes the caller's node into the JWT, so the callback refuses (`pod_node`). The
//! demo shows it; the end-to-end tests assert it, between the local stack's nodes and between
//! real kubelets (where the node certificate is taken from a node's running agent).

use crate::kube::NewPod;
use crate::stack_json::{NodeInfo, StackInfo};
use anyhow::{Context, bail};
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_core::identity_jwt::{JwtRequest, JwtResponse};
use athenz_core::names::{CsrIdentity, DomainMapper, PodIdentityInput};
use athenz_core::secret::Secret;
use athenz_core::subject::PodSubject;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::{
    InstanceRef, InstanceRefreshInformation, InstanceRegisterInformation, ZtsClient,
    ZtsClientConfig,
};
use std::net::SocketAddr;
use std::time::Duration;

/// A node's own credentials, used directly against the jwt-service and ZTS.
pub struct DirectAccess {
    /// The node whose certificate this is (for messages).
    pub node_name: String,
    /// The jwt-service's base URL.
    pub jwt_service_url: String,
    /// Where the jwt-service's host name is reached, when it is not resolvable here (a
    /// cluster Service's name, reached at its ClusterIP from the host).
    pub jwt_service_address: Option<(String, SocketAddr)>,
    /// ZTS's base URL (`.../zts/v1`).
    pub zts_url: String,
    /// What verifies the jwt-service and ZTS.
    pub cas: Vec<rustls_pki_types::CertificateDer<'static>>,
    /// The provider the identities are registered through.
    pub provider: String,
    /// The provider's DNS suffix (the CSR's SAN names).
    pub dns_suffix: String,
    /// The node's certificate chain, PEM.
    pub cert_pem: String,
    /// Its key, PEM.
    pub key_pem: Secret,
}

/// The pod subject of `pod` (uid `uid`) as its own node's agent would attest it.
pub fn subject_of(info: &StackInfo, pod: &NewPod, uid: &str) -> anyhow::Result<PodSubject> {
    let mapper = DomainMapper::new(&info.admin_domain, Vec::<String>::new())?;
    Ok(PodSubject::new(
        pod.namespace.clone(),
        pod.name.clone(),
        uid.to_owned(),
        mapper.namespace_to_domain(&pod.namespace)?,
        pod.service_account.clone(),
        Some(pod.ip.as_str()),
    )?)
}

impl DirectAccess {
    /// Node `node` of the local stack, with the certificate its agent was given.
    pub fn of_stack(info: &StackInfo, node: &NodeInfo) -> anyhow::Result<Self> {
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        };
        Ok(Self {
            node_name: node.name.clone(),
            jwt_service_url: info.jwt_service.url.clone(),
            jwt_service_address: None,
            zts_url: info.zts.url.clone(),
            cas: pem_certificates(&read(&node.credentials.ca)?)?,
            provider: info.provider.clone(),
            dns_suffix: info.dns_suffix.clone(),
            cert_pem: read(&node.credentials.cert)?,
            key_pem: Secret::new(read(&node.credentials.key)?),
        })
    }

    /// A JWT for `subject` from the jwt-service, asked with the node's certificate.
    pub async fn jwt(&self, subject: &PodSubject) -> anyhow::Result<Secret> {
        let identity = ClientIdentity::Fixed(tls::certified_key_from_pem(
            &self.cert_pem,
            self.key_pem.expose(),
        )?);
        let mut client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls::client_config(&self.cas, Some(identity))?)
            .timeout(Duration::from_secs(10));
        if let Some((host, address)) = &self.jwt_service_address {
            client = client.resolve(host, *address);
        }
        let url = format!("{}/v1/jwt", self.jwt_service_url.trim_end_matches('/'));
        let response = client
            .build()?
            .post(url)
            .json(&JwtRequest {
                subject: subject.clone(),
            })
            .send()
            .await
            .context("asking the jwt-service")?;
        if !response.status().is_success() {
            bail!(
                "the jwt-service refused node {}: {}",
                self.node_name,
                response.status()
            );
        }
        let jwt: JwtResponse = response.json().await.context("the jwt-service's answer")?;
        Ok(jwt.jwt)
    }

    /// A fresh key and the CSR of `subject`'s pod identity.
    fn pod_csr(&self, subject: &PodSubject) -> anyhow::Result<String> {
        let pod_key = PrivateKey::generate(KeyAlgorithm::P256)?;
        Ok(build_csr(
            &CsrIdentity::for_pod(&PodIdentityInput {
                domain: &subject.domain,
                service: &subject.service,
                provider: &self.provider,
                dns_suffix: &self.dns_suffix,
                instance_id: &subject.uid,
                pod_ip: subject.ip,
                service_ip: None,
            })?,
            &pod_key,
        )?)
    }

    fn zts(&self) -> anyhow::Result<ZtsClient> {
        Ok(ZtsClient::new(ZtsClientConfig {
            url: self.zts_url.clone(),
            ca: athenz_core::tls::ServerCaBundle::fixed(self.cas.clone())?,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        })?)
    }

    /// A JWT for `subject`, then a ZTS registration of the pod's identity. `Ok` is ZTS's
    /// refusal (what must happen); an issued certificate is an error.
    pub async fn register(&self, subject: &PodSubject) -> anyhow::Result<String> {
        let jwt = self.jwt(subject).await?;
        let registered = self
            .zts()?
            .register(&InstanceRegisterInformation {
                provider: self.provider.clone(),
                domain: subject.domain.clone(),
                service: subject.service.clone(),
                attestation_data: jwt,
                csr: self.pod_csr(subject)?,
                ..Default::default()
            })
            .await;
        match registered {
            Ok(_) => bail!(
                "ZTS issued {}/{}'s identity to node {}",
                subject.namespace,
                subject.name,
                self.node_name
            ),
            Err(refusal) => Ok(refusal.to_string()),
        }
    }

    /// A ZTS registration of node `node`'s agent identity (`principal`, the node name as its
    /// instance id) attested with `token` (another node's agent token, say). `Ok` is ZTS's
    /// refusal; an issued certificate is an error.
    pub async fn register_node_identity(
        &self,
        principal: &str,
        node: &str,
        token: &str,
    ) -> anyhow::Result<String> {
        let (domain, service) = principal
            .rsplit_once('.')
            .with_context(|| format!("{principal} is not <domain>.<service>"))?;
        let key = PrivateKey::generate(KeyAlgorithm::P256)?;
        let csr = build_csr(
            &CsrIdentity::for_node(principal, &self.provider, &self.dns_suffix, node)?,
            &key,
        )?;
        let registered = self
            .zts()?
            .register(&InstanceRegisterInformation {
                provider: self.provider.clone(),
                domain: domain.to_owned(),
                service: service.to_owned(),
                attestation_data: Secret::new(token),
                csr,
                ..Default::default()
            })
            .await;
        match registered {
            Ok(_) => bail!(
                "ZTS issued node {node}'s identity to a token of {}",
                self.node_name
            ),
            Err(refusal) => Ok(refusal.to_string()),
        }
    }

    /// A JWT for `subject`, then a ZTS refresh of its identity presenting the pod's own pair
    /// (as if the node had stolen it). `Ok` is ZTS's refusal; a refreshed certificate is an
    /// error.
    pub async fn refresh(
        &self,
        subject: &PodSubject,
        pod_cert_pem: &str,
        pod_key_pem: &str,
    ) -> anyhow::Result<String> {
        let jwt = self.jwt(subject).await?;
        let presented = tls::certified_key_from_pem(pod_cert_pem, pod_key_pem)?;
        let refreshed = self
            .zts()?
            .refresh_instance(
                &InstanceRef {
                    provider: &self.provider,
                    domain: &subject.domain,
                    service: &subject.service,
                    instance_id: &subject.uid,
                },
                &InstanceRefreshInformation {
                    attestation_data: Some(jwt),
                    csr: Some(self.pod_csr(subject)?),
                    ..Default::default()
                },
                ClientIdentity::Fixed(presented),
            )
            .await;
        match refreshed {
            Ok(_) => bail!(
                "ZTS refreshed {}/{}'s identity for node {}",
                subject.namespace,
                subject.name,
                self.node_name
            ),
            Err(refusal) => Ok(refusal.to_string()),
        }
    }
}

/// Node `node`'s certificate, used directly: a JWT for `subject` from the jwt-service, then a
/// ZTS registration of the pod's identity ([`DirectAccess::register`]).
pub async fn register_with_node_certificate(
    info: &StackInfo,
    node: &NodeInfo,
    subject: &PodSubject,
) -> anyhow::Result<String> {
    DirectAccess::of_stack(info, node)?.register(subject).await
}

/// Node `node`'s certificate for a JWT, then a ZTS refresh of `subject`'s identity presenting
/// the pod's own pair from `credentials_dir` ([`DirectAccess::refresh`]).
pub async fn refresh_with_node_certificate(
    info: &StackInfo,
    node: &NodeInfo,
    subject: &PodSubject,
    credentials_dir: &std::path::Path,
) -> anyhow::Result<String> {
    let read = |name: &str| {
        std::fs::read_to_string(credentials_dir.join(name))
            .with_context(|| format!("reading the pod's {name}"))
    };
    DirectAccess::of_stack(info, node)?
        .refresh(
            subject,
            &read("service.cert.pem")?,
            &read("service.key.pem")?,
        )
        .await
}
