//! What a compromised node can try for a pod scheduled elsewhere (DESIGN.md 4.9, 6): bypass its
//! agent and use its own node certificate directly — ask the jwt-service for the pod's JWT, then
//! register the pod's identity with ZTS. The jwt-service writes the caller's node into the JWT,
//! so the callback refuses (`pod_node`). The demo shows it; the end-to-end tests assert it.

use crate::kube::NewPod;
use crate::stack::{NodeInfo, StackInfo};
use anyhow::{Context, bail};
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_core::identity_jwt::{JwtRequest, JwtResponse};
use athenz_core::names::{CsrIdentity, DomainMapper, PodIdentityInput};
use athenz_core::subject::PodSubject;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::{InstanceRegisterInformation, ZtsClient, ZtsClientConfig};
use std::time::Duration;

/// The pod subject of `pod` (uid `uid`) as its own node's agent would attest it.
pub fn subject_of(info: &StackInfo, pod: &NewPod, uid: &str) -> anyhow::Result<PodSubject> {
    let mapper = DomainMapper::new(&info.admin_domain, Vec::<String>::new())?;
    Ok(PodSubject::new(
        pod.namespace.clone(),
        pod.name.clone(),
        uid.to_owned(),
        mapper.namespace_to_domain(&pod.namespace)?,
        pod.service_account.clone(),
        &pod.ip,
    )?)
}

/// Node `node`'s certificate, used directly: a JWT for `subject` from the jwt-service, then a
/// ZTS registration of the pod's identity. `Ok` is ZTS's refusal (what must happen); an issued
/// certificate is an error.
pub async fn register_with_node_certificate(
    info: &StackInfo,
    node: &NodeInfo,
    subject: &PodSubject,
) -> anyhow::Result<String> {
    let cas = pem_certificates(
        &std::fs::read_to_string(&node.credentials.ca).context("reading the stack's CA")?,
    )?;
    let chain = std::fs::read_to_string(&node.credentials.cert)
        .with_context(|| format!("reading {}", node.credentials.cert.display()))?;
    let key = std::fs::read_to_string(&node.credentials.key)
        .with_context(|| format!("reading {}", node.credentials.key.display()))?;
    let identity = ClientIdentity::Fixed(tls::certified_key_from_pem(&chain, &key)?);
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls::client_config(&cas, Some(identity))?)
        .timeout(Duration::from_secs(10))
        .build()?;
    let response = client
        .post(format!("{}/v1/jwt", info.jwt_service.url))
        .json(&JwtRequest {
            subject: subject.clone(),
        })
        .send()
        .await
        .context("asking the jwt-service")?;
    if !response.status().is_success() {
        bail!(
            "the jwt-service refused node {}: {}",
            node.name,
            response.status()
        );
    }
    let jwt: JwtResponse = response.json().await.context("the jwt-service's answer")?;
    let pod_key = PrivateKey::generate(KeyAlgorithm::P256)?;
    let csr = build_csr(
        &CsrIdentity::for_pod(&PodIdentityInput {
            domain: &subject.domain,
            service: &subject.service,
            provider: &info.provider,
            dns_suffix: &info.dns_suffix,
            instance_id: &subject.uid,
            pod_ip: subject.ip,
            service_ip: None,
        })?,
        &pod_key,
    )?;
    let zts = ZtsClient::new(ZtsClientConfig {
        url: info.zts.url.clone(),
        ca_certs: cas,
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    })?;
    match zts
        .register(&InstanceRegisterInformation {
            provider: info.provider.clone(),
            domain: subject.domain.clone(),
            service: subject.service.clone(),
            attestation_data: jwt.jwt,
            csr,
            ..Default::default()
        })
        .await
    {
        Ok(_) => bail!(
            "ZTS issued {}/{}'s identity to node {}",
            subject.namespace,
            subject.name,
            node.name
        ),
        Err(refusal) => Ok(refusal.to_string()),
    }
}
