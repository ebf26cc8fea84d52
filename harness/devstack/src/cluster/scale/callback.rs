//! The callback at scale, and ZTS's side of it: the release's `athenz-callback` (from the
//! image's binaries) against the real API server, as the callback's service account (deploy/'s
//! RBAC), its pod cache on as shipped; and a stand-in for ZTS that confirms a sample of the pods
//! as ZTS would, each over a new mutual-TLS connection as `sys.auth.zts`, with the identity JWT
//! the jwt-service signed for the pod's node's agent ([`super::jwt`]), while the pod is pending
//! with its IP (the moment the pod's SIA registers); and node agents' registrations, each
//! attested by the agent pod's projected service-account token, which the callback has the API
//! server review.

use super::jwt::RunTrust;
use crate::procs::{Command, Process};
use anyhow::Context;
use athenz_core::contracts::subject::PodSubject;
use athenz_core::crypto::{KeyAlgorithm, pem_certificates};
use athenz_core::names::{CsrIdentity, DomainMapper, PodIdentityInput};
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::pki::LeafSpec;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The callback's service account, as deploy/ names it.
pub const CALLBACK_USER: &str = "system:serviceaccount:k8s-admin:athenz-callback";
/// How long one confirmation may take before it counts as failed.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// What ZTS's side needs to call the running callback.
pub struct Callback {
    /// `https://127.0.0.1:<port>/instance`.
    url: String,
    /// Makes a new client (so a new connection) for each confirmation, as ZTS does.
    zts: Arc<rustls::ClientConfig>,
}

/// A pod as ZTS's confirmation names it.
#[derive(Debug, Clone)]
pub struct PendingPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub ip: IpAddr,
}

impl Callback {
    /// Starts the callback from `binary` as process `name` with `kubeconfig` (its service
    /// account's) and `extra_args` after the shipped ones, its certificate from the run's CA
    /// under `dir`, trusting the run's JWT key; waits until it is ready. Returns its process and its ops address (its metrics) beside
    /// what ZTS's side needs.
    pub async fn start(
        (name, binary): (&str, &Path),
        kubeconfig: &Path,
        extra_args: &[String],
        (trust, dir): (&RunTrust, &Path),
        logs: &Path,
    ) -> anyhow::Result<(Process, String, Self)> {
        let dir = dir.join("callback");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (args, port, ops) =
            trust.loopback_server((&dir, "callback"), PROVIDER, "sys.auth.zts")?;
        let args = [
            args,
            vec![
                format!("--provider={PROVIDER}"),
                format!("--public-keys-dir={}", trust.public_dir.display()),
                format!("--dns-suffix={DNS_SUFFIX}"),
                format!("--admin-domain={ADMIN_DOMAIN}"),
            ],
            extra_args.to_vec(),
        ]
        .concat();
        let mut command = Command::new(name, binary, args);
        command.env = vec![("KUBECONFIG".to_owned(), kubeconfig.display().to_string())];
        let mut process = Process::start(command, logs)?;
        process
            .wait_http_ok(&format!("http://127.0.0.1:{ops}/readyz"))
            .await?;
        let ca = &trust.ca;
        let issued = ca
            .issue(&LeafSpec::service("sys.auth.zts", &[]), KeyAlgorithm::P256)
            .context("ZTS's client certificate")?;
        let zts = tls::client_config(
            &pem_certificates(ca.root_pem())?,
            Some(ClientIdentity::Fixed(tls::certified_key_from_pem(
                &issued.chain_pem,
                issued.key_pem.expose(),
            )?)),
        )?;
        let callback = Self {
            url: format!("https://127.0.0.1:{port}/instance"),
            zts: Arc::new(zts),
        };
        Ok((process, format!("http://127.0.0.1:{ops}"), callback))
    }

    /// ZTS's confirmation of `pod`'s launch, attested by `jwt` (its node's agent's): how long
    /// the callback took to confirm it (a refusal is an error naming the callback's answer).
    pub async fn confirm(&self, pod: &PendingPod, jwt: Secret) -> anyhow::Result<Duration> {
        let body = pod_confirmation(pod, jwt)?;
        self.post(&body, &format!("{}/{}", pod.namespace, pod.name))
            .await
    }

    /// ZTS's confirmation of `node`'s agent's registration, attested by `token` (the agent
    /// pod's projected token for the node audience): how long the callback took, a TokenReview
    /// and its agent pod's and node's reads included.
    pub async fn confirm_node(&self, node: &str, token: Secret) -> anyhow::Result<Duration> {
        let identity =
            CsrIdentity::for_node(&RunTrust::agent_principal(), PROVIDER, DNS_SUFFIX, node)?;
        let mut attributes = BTreeMap::new();
        attributes.insert("instanceId".to_owned(), node.to_owned());
        attributes.insert("sanDNS".to_owned(), identity.dns_names.join(","));
        attributes.insert("sanURI".to_owned(), identity.uris.join(","));
        let confirmation = InstanceConfirmation {
            provider: PROVIDER.to_owned(),
            domain: ADMIN_DOMAIN.to_owned(),
            service: super::jwt::AGENT_SERVICE.to_owned(),
            attestation_data: token,
            attributes,
        };
        let body = serde_json::to_string(&confirmation).context("a node confirmation")?;
        self.post(&body, &format!("node {node}")).await
    }

    /// Posts `body` over a new connection, as ZTS does; how long the answer took.
    async fn post(&self, body: &str, what: &str) -> anyhow::Result<Duration> {
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured((*self.zts).clone())
            .timeout(CONFIRM_TIMEOUT)
            .build()
            .context("ZTS's client")?;
        let started = Instant::now();
        let response = client
            .post(&self.url)
            .body(body.to_owned())
            .send()
            .await
            .with_context(|| format!("confirming {what}"))?;
        let took = started.elapsed();
        let status = response.status();
        anyhow::ensure!(
            status.is_success(),
            "the callback refused {what}: {status}: {}",
            response.text().await.unwrap_or_default()
        );
        Ok(took)
    }
}

impl PendingPod {
    /// The pod as its node's agent attests it (the subject of its identity JWT).
    pub fn subject(&self) -> anyhow::Result<PodSubject> {
        Ok(PodSubject::new(
            self.namespace.clone(),
            self.name.clone(),
            self.uid.clone(),
            DomainMapper::new(ADMIN_DOMAIN, Vec::<String>::new())?
                .namespace_to_domain(&self.namespace)?,
            super::fleet::SERVICE_ACCOUNT.to_owned(),
            Some(&self.ip.to_string()),
        )?)
    }
}

/// What ZTS posts for `pod`: the SIA's attributes and its node's agent's identity JWT.
fn pod_confirmation(pod: &PendingPod, jwt: Secret) -> anyhow::Result<String> {
    let subject = pod.subject()?;
    let identity = CsrIdentity::for_pod(&PodIdentityInput {
        domain: &subject.domain,
        service: &subject.service,
        provider: PROVIDER,
        dns_suffix: DNS_SUFFIX,
        instance_id: &pod.uid,
        pod_ip: Some(pod.ip),
        service_ip: None,
    })?;
    let mut attributes = BTreeMap::new();
    attributes.insert("instanceId".to_owned(), pod.uid.clone());
    attributes.insert("sanDNS".to_owned(), identity.dns_names.join(","));
    attributes.insert("sanIP".to_owned(), pod.ip.to_string());
    attributes.insert("sanURI".to_owned(), identity.uris.join(","));
    let confirmation = InstanceConfirmation {
        provider: PROVIDER.to_owned(),
        domain: subject.domain,
        service: subject.service,
        attestation_data: jwt,
        attributes,
    };
    serde_json::to_string(&confirmation).context("a confirmation")
}

/// The release's binaries (deploy/image.sh's `target/image/bin`).
pub fn default_release_bin() -> PathBuf {
    super::super::workspace_path("target/image/bin")
}
