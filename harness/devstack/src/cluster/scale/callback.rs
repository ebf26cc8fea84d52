//! The callback at scale, and ZTS's side of it: the release's `athenz-callback` (from the
//! image's binaries) against the real API server, as the callback's service account (deploy/'s
//! RBAC), its pod cache on as shipped; and a stand-in for ZTS that confirms a sample of the pods
//! as ZTS would, each over a new mutual-TLS connection as `sys.auth.zts`, with an identity JWT
//! signed by a jwt-service key the callback trusts, while the pod is pending with its IP (the
//! moment the pod's SIA registers).

use crate::procs::{Command, Process, free_port};
use anyhow::Context;
use athenz_core::contracts::subject::PodSubject;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, pem_certificates};
use athenz_core::identity_jwt::{DEFAULT_AUDIENCE, DEFAULT_ISSUER, IdentityClaims};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use athenz_jwt_service::signer::JwtSigner;
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The callback's service account, as deploy/ names it.
pub const CALLBACK_USER: &str = "system:serviceaccount:k8s-admin:athenz-callback";
/// The key id the stand-in jwt-service signs with (the callback reads `v<N>.pem` files).
const KEY_ID: &str = "v1";
/// How long one confirmation may take before it counts as failed.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// What ZTS's side needs to call the running callback.
pub struct Callback {
    /// `https://127.0.0.1:<port>/instance`.
    url: String,
    /// Makes a new client (so a new connection) for each confirmation, as ZTS does.
    zts: Arc<rustls::ClientConfig>,
    signer: JwtSigner,
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
    /// account's) and `extra_args` after the shipped ones, its certificates and keys under `dir`;
    /// waits until it is ready. Returns its process and its ops address (its metrics) beside
    /// what ZTS's side needs.
    pub async fn start(
        (name, binary): (&str, &Path),
        kubeconfig: &Path,
        extra_args: &[String],
        dir: &Path,
        logs: &Path,
    ) -> anyhow::Result<(Process, String, Self)> {
        let dir = dir.join("callback");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca = CertAuthority::new_root("scale ZTS CA").context("the ZTS CA")?;
        let files = ca
            .write_service_cert(
                &dir,
                "callback",
                &LeafSpec {
                    ip_addresses: vec![[127, 0, 0, 1].into()],
                    ..LeafSpec::service(PROVIDER, &[])
                },
            )
            .context("the callback's certificate")?;
        let signer = JwtSigner::from_pem(
            PrivateKey::generate(KeyAlgorithm::P256)?
                .to_pkcs8_pem()?
                .expose()
                .as_bytes(),
        )
        .map_err(anyhow::Error::msg)?;
        let keys = dir.join("jwt-public");
        std::fs::create_dir_all(&keys)?;
        std::fs::write(
            keys.join(format!("{KEY_ID}.pem")),
            signer.public_key_pem().map_err(anyhow::Error::msg)?,
        )?;
        let (port, ops) = (free_port()?, free_port()?);
        let args = vec![
            format!("--listen=127.0.0.1:{port}"),
            format!("--ops-listen=127.0.0.1:{ops}"),
            format!("--tls-cert={}", files.cert.display()),
            format!("--tls-key={}", files.key.display()),
            format!("--client-ca={}", files.ca.display()),
            "--allowed-principals=sys.auth.zts".to_owned(),
            format!("--provider={PROVIDER}"),
            format!("--public-keys-dir={}", keys.display()),
            format!("--dns-suffix={DNS_SUFFIX}"),
            format!("--admin-domain={ADMIN_DOMAIN}"),
        ];
        let mut command = Command::new(name, binary, [args, extra_args.to_vec()].concat());
        command.env = vec![("KUBECONFIG".to_owned(), kubeconfig.display().to_string())];
        let mut process = Process::start(command, logs)?;
        process
            .wait_http_ok(&format!("http://127.0.0.1:{ops}/readyz"))
            .await?;
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
            signer,
        };
        Ok((process, format!("http://127.0.0.1:{ops}"), callback))
    }

    /// ZTS's confirmation of `pod`'s launch: how long the callback took to confirm it (a
    /// refusal is an error naming the callback's answer).
    pub async fn confirm(&self, pod: &PendingPod) -> anyhow::Result<Duration> {
        let body = self.confirmation(pod)?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured((*self.zts).clone())
            .timeout(CONFIRM_TIMEOUT)
            .build()
            .context("ZTS's client")?;
        let started = Instant::now();
        let response = client
            .post(&self.url)
            .body(body)
            .send()
            .await
            .with_context(|| format!("confirming {}/{}", pod.namespace, pod.name))?;
        let took = started.elapsed();
        let status = response.status();
        anyhow::ensure!(
            status.is_success(),
            "the callback refused {}/{}: {status}: {}",
            pod.namespace,
            pod.name,
            response.text().await.unwrap_or_default()
        );
        Ok(took)
    }

    /// What ZTS posts for `pod`: the SIA's attributes and the agent's identity JWT.
    fn confirmation(&self, pod: &PendingPod) -> anyhow::Result<String> {
        let domain = pod.namespace.replace('-', ".");
        let service = super::fleet::SERVICE_ACCOUNT;
        let subject = PodSubject::new(
            pod.namespace.clone(),
            pod.name.clone(),
            pod.uid.clone(),
            domain.clone(),
            service.to_owned(),
            Some(&pod.ip.to_string()),
        )?;
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let claims = IdentityClaims {
            iss: DEFAULT_ISSUER.to_owned(),
            aud: DEFAULT_AUDIENCE.to_owned(),
            sub: subject.to_uri(),
            iat: now,
            nbf: now,
            exp: now + 600,
            jti: athenz_core::random::hex_name::<16>(),
            node: pod.node.clone(),
        };
        let identity = CsrIdentity::for_pod(&PodIdentityInput {
            domain: &domain,
            service,
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
            domain,
            service: service.to_owned(),
            attestation_data: Secret::new(
                self.signer
                    .sign(KEY_ID, &claims)
                    .map_err(anyhow::Error::msg)?,
            ),
            attributes,
        };
        serde_json::to_string(&confirmation).context("a confirmation")
    }
}

/// The release's binaries (deploy/image.sh's `target/image/bin`).
pub fn default_release_bin() -> PathBuf {
    super::super::workspace_path("target/image/bin")
}
