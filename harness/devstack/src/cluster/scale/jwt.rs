//! The jwt-service in the run, and the trust it shares with the callback: one CA for the run
//! (ZTS's and the agents' certificates), the release's `athenz-jwt-service` signing with a key
//! whose public half the callback reads. Each confirmed pod's identity JWT is asked of it by
//! the pod's node's agent (a node certificate of its own, a connection kept per node, as an
//! agent keeps one), so what ZTS's stand-in hands the callback is what a cluster's would.
//! The jwt-service makes no API call: it is in the run for its own cost, beside ours.

use crate::procs::{Command, Process, free_port};
use anyhow::Context;
use athenz_core::contracts::subject::PodSubject;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, pem_certificates};
use athenz_core::identity_jwt::{JwtRequest, JwtResponse};
use athenz_core::names::{CsrIdentity, principal};
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_jwt_service::signer::JwtSigner;
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The agents' service name under the admin domain, as deploy/ names it.
pub const AGENT_SERVICE: &str = "athenz-agent";
/// The signing key's id (the jwt-service and the callback read `v<N>.pem`).
const KEY_ID: &str = "v1";
/// How long one JWT may take before the confirmation counts as failed.
const JWT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the run's parts trust: its CA and the JWT signing key's two halves.
pub struct RunTrust {
    pub ca: CertAuthority,
    /// `v1.pem`, the private key (the jwt-service's `--keys-dir`).
    pub signing_dir: PathBuf,
    /// `v1.pem`, its public key (the callback's `--public-keys-dir`).
    pub public_dir: PathBuf,
}

impl RunTrust {
    /// A CA and a P-256 signing key, written under `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        let ca = CertAuthority::new_root("scale run CA").context("the run's CA")?;
        let key = PrivateKey::generate(KeyAlgorithm::P256)?;
        let signing_dir = dir.join("jwt-signing");
        let public_dir = dir.join("jwt-public");
        for made in [&signing_dir, &public_dir] {
            std::fs::create_dir_all(made)
                .with_context(|| format!("creating {}", made.display()))?;
        }
        let private = key.to_pkcs8_pem()?;
        let public = JwtSigner::from_pem(private.expose().as_bytes())
            .map_err(anyhow::Error::msg)?
            .public_key_pem()
            .map_err(anyhow::Error::msg)?;
        let path = signing_dir.join(format!("{KEY_ID}.pem"));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| file.write_all(private.expose().as_bytes()))
            .with_context(|| format!("writing {}", path.display()))?;
        let path = public_dir.join(format!("{KEY_ID}.pem"));
        std::fs::write(&path, public).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            ca,
            signing_dir,
            public_dir,
        })
    }

    /// A TLS server's flags as our daemons take them: a certificate for `common_name` on
    /// 127.0.0.1 from the run's CA (written under `dir` as `name`), a loopback port for it and
    /// one for its ops endpoint, clients allowed by `allowed`. Returns the flags and the port.
    pub fn loopback_server(
        &self,
        (dir, name): (&Path, &str),
        common_name: &str,
        allowed: &str,
    ) -> anyhow::Result<(Vec<String>, u16, u16)> {
        let files = self
            .ca
            .write_service_cert(
                dir,
                name,
                &LeafSpec {
                    ip_addresses: vec![[127, 0, 0, 1].into()],
                    ..LeafSpec::service(common_name, &[])
                },
            )
            .with_context(|| format!("the {name}'s certificate"))?;
        let (port, ops) = (free_port()?, free_port()?);
        let args = vec![
            format!("--listen=127.0.0.1:{port}"),
            format!("--ops-listen=127.0.0.1:{ops}"),
            format!("--tls-cert={}", files.cert.display()),
            format!("--tls-key={}", files.key.display()),
            format!("--client-ca={}", files.ca.display()),
            format!("--allowed-principals={allowed}"),
        ];
        Ok((args, port, ops))
    }

    /// The agents' principal (`<admin domain>.athenz-agent`).
    pub fn agent_principal() -> String {
        principal(ADMIN_DOMAIN, AGENT_SERVICE)
    }
}

/// The running jwt-service, asked as each node's agent.
pub struct JwtService {
    url: String,
    roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    trust: Arc<RunTrust>,
    /// One client per node, made on first use (its node certificate, its connection).
    agents: Mutex<HashMap<String, reqwest::Client>>,
}

impl JwtService {
    /// Starts the release's jwt-service `binary` as deploy/ configures it (the agents'
    /// principal allowed, the provider's instance-id URIs naming the caller's node).
    pub async fn start(
        binary: &Path,
        trust: Arc<RunTrust>,
        dir: &Path,
        logs: &Path,
    ) -> anyhow::Result<(Process, Self)> {
        let dir = dir.join("jwt-service");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (mut args, port, ops) = trust.loopback_server(
            (&dir, "jwt-service"),
            &principal(ADMIN_DOMAIN, "athenz-jwt-service"),
            &RunTrust::agent_principal(),
        )?;
        args.push(format!("--keys-dir={}", trust.signing_dir.display()));
        args.push(format!("--provider={PROVIDER}"));
        let mut process = Process::start(Command::new("athenz-jwt-service", binary, args), logs)?;
        process
            .wait_http_ok(&format!("http://127.0.0.1:{ops}/readyz"))
            .await?;
        let roots = pem_certificates(trust.ca.root_pem())?;
        let service = Self {
            url: format!("https://127.0.0.1:{port}/v1/jwt"),
            roots,
            trust,
            agents: Mutex::new(HashMap::new()),
        };
        Ok((process, service))
    }

    /// `subject`'s identity JWT, asked by `node`'s agent; how long the jwt-service took.
    pub async fn jwt_for(
        &self,
        subject: &PodSubject,
        node: &str,
    ) -> anyhow::Result<(Secret, Duration)> {
        let client = self.agent(node)?;
        let started = Instant::now();
        let response = client
            .post(&self.url)
            .json(&JwtRequest {
                subject: subject.clone(),
            })
            .send()
            .await
            .with_context(|| format!("asking the jwt-service as {node}'s agent"))?;
        let status = response.status();
        anyhow::ensure!(
            status.is_success(),
            "the jwt-service refused {node}'s agent: {status}: {}",
            response.text().await.unwrap_or_default()
        );
        let answer: JwtResponse = response.json().await.context("the jwt-service's answer")?;
        Ok((answer.jwt, started.elapsed()))
    }

    /// `node`'s agent's client: a node certificate as the agent's own (its principal, the
    /// provider's instance-id URI naming the node).
    fn agent(&self, node: &str) -> anyhow::Result<reqwest::Client> {
        let mut agents = self
            .agents
            .lock()
            .map_err(|_| anyhow::anyhow!("the agents' clients' lock was poisoned"))?;
        if let Some(client) = agents.get(node) {
            return Ok(client.clone());
        }
        let principal = RunTrust::agent_principal();
        let names = CsrIdentity::for_node(&principal, PROVIDER, DNS_SUFFIX, node)?;
        let issued = self
            .trust
            .ca
            .issue(
                &LeafSpec {
                    uris: names.uris.clone(),
                    ..LeafSpec::service(
                        &principal,
                        &names
                            .dns_names
                            .iter()
                            .map(String::as_str)
                            .collect::<Vec<_>>(),
                    )
                },
                KeyAlgorithm::P256,
            )
            .with_context(|| format!("{node}'s agent certificate"))?;
        let identity = ClientIdentity::Fixed(tls::certified_key_from_pem(
            &issued.chain_pem,
            issued.key_pem.expose(),
        )?);
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls::client_config(&self.roots, Some(identity))?)
            .timeout(JWT_TIMEOUT)
            .build()
            .context("an agent's client of the jwt-service")?;
        agents.insert(node.to_owned(), client.clone());
        Ok(client)
    }
}
