//! What a compromised node can try for a pod scheduled elsewhere (docs/design.md §4.9, §6): bypass
//! its agent and use its own node certificate directly — ask the jwt-service for the pod's JWT,
//! then register the pod's identity with ZTS. The jwt-service writes the caller's node into the
//! JWT, so the callback refuses (`pod_node`). The demo shows it; the end-to-end tests assert it.

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
        Some(pod.ip.as_str()),
    )?)
}

/// A JWT for `subject` from the jwt-service, asked with node `node`'s own certificate.
pub async fn jwt_with_node_certificate(
    info: &StackInfo,
    node: &NodeInfo,
    subject: &PodSubject,
) -> anyhow::Result<Secret> {
    let cas = stack_cas(node)?;
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
    Ok(jwt.jwt)
}

fn stack_cas(node: &NodeInfo) -> anyhow::Result<Vec<rustls_pki_types::CertificateDer<'static>>> {
    Ok(pem_certificates(
        &std::fs::read_to_string(&node.credentials.ca).context("reading the stack's CA")?,
    )?)
}

/// A fresh key and the CSR of `subject`'s pod identity.
fn pod_csr(info: &StackInfo, subject: &PodSubject) -> anyhow::Result<String> {
    let pod_key = PrivateKey::generate(KeyAlgorithm::P256)?;
    Ok(build_csr(
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
    )?)
}

fn zts(info: &StackInfo, node: &NodeInfo) -> anyhow::Result<ZtsClient> {
    Ok(ZtsClient::new(ZtsClientConfig {
        url: info.zts.url.clone(),
        ca_certs: stack_cas(node)?,
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    })?)
}

/// Node `node`'s certificate, used directly: a JWT for `subject` from the jwt-service, then a
/// ZTS registration of the pod's identity. `Ok` is ZTS's refusal (what must happen); an issued
/// certificate is an error.
pub async fn register_with_node_certificate(
    info: &StackInfo,
    node: &NodeInfo,
    subject: &PodSubject,
) -> anyhow::Result<String> {
    let jwt = jwt_with_node_certificate(info, node, subject).await?;
    let registered = zts(info, node)?
        .register(&InstanceRegisterInformation {
            provider: info.provider.clone(),
            domain: subject.domain.clone(),
            service: subject.service.clone(),
            attestation_data: jwt,
            csr: pod_csr(info, subject)?,
            ..Default::default()
        })
        .await;
    match registered {
        Ok(_) => bail!(
            "ZTS issued {}/{}'s identity to node {}",
            subject.namespace,
            subject.name,
            node.name
        ),
        Err(refusal) => Ok(refusal.to_string()),
    }
}

/// Node `node`'s certificate for a JWT, then a ZTS refresh of `subject`'s identity presenting
/// the pod's own pair from `credentials_dir` (as if the node had stolen it). `Ok` is ZTS's
/// refusal; a refreshed certificate is an error.
pub async fn refresh_with_node_certificate(
    info: &StackInfo,
    node: &NodeInfo,
    subject: &PodSubject,
    credentials_dir: &std::path::Path,
) -> anyhow::Result<String> {
    let jwt = jwt_with_node_certificate(info, node, subject).await?;
    let read = |name: &str| {
        std::fs::read_to_string(credentials_dir.join(name))
            .with_context(|| format!("reading the pod's {name}"))
    };
    let presented =
        tls::certified_key_from_pem(&read("service.cert.pem")?, &read("service.key.pem")?)?;
    let refreshed = zts(info, node)?
        .refresh_instance(
            &InstanceRef {
                provider: &info.provider,
                domain: &subject.domain,
                service: &subject.service,
                instance_id: &subject.uid,
            },
            &InstanceRefreshInformation {
                attestation_data: Some(jwt),
                csr: Some(pod_csr(info, subject)?),
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
            node.name
        ),
        Err(refusal) => Ok(refusal.to_string()),
    }
}
