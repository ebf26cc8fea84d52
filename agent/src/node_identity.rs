//! The agent's own identity (docs/design.md §4.9): one per node, attested by the agent pod's
//! projected service-account token, so no key is shared between nodes or kept in a Secret.
//!
//! One task owns it: register with ZTS (instance id = the node name), then refresh at the usual
//! fraction of the lifetime with the current certificate and a fresh token (the kubelet rotates
//! the token file, so it is read for every attempt), backing off after failures. The key is made
//! in memory; with `--node-identity-dir` the pair is also kept there (0600), so an agent that
//! restarts within the certificate's life serves at once without ZTS. While ZTS is away the
//! agent keeps serving with the certificate it has, until that expires; `/readyz` says whether it
//! holds a valid one.
//!
//! A pod that asks while no valid certificate is held does not wait for the task's next attempt:
//! after a long outage that attempt can be a full backoff (a minute) away, and the pod's own retry
//! another backoff after that, so the two waits would stack. The pod's request starts the attempt
//! itself ([`NodeIdentity::ensure_valid`]). How attempts are shared and spaced is `renewal`'s job.

use athenz_core::crypto::{
    CertInfo, KeyAlgorithm, PrivateKey, build_csr, key_matches_cert, leaf_with_chain,
};
use athenz_core::http::Readiness;
use athenz_core::names::CsrIdentity;
use athenz_core::refresh::{Backoff, RefreshPolicy};
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity, InMemoryIdentity};
use athenz_core::zts::{
    InstanceIdentity, InstanceRef, InstanceRefreshInformation, InstanceRegisterInformation,
    ZtsClient, ZtsError,
};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use time::OffsetDateTime;

mod renewal;

/// Largest token file read (a projected token is about 1 KiB).
const MAX_TOKEN_FILE: u64 = 16 * 1024;
/// Names of the kept pair under `--node-identity-dir`.
const KEY_FILE: &str = "node.key.pem";
const CERT_FILE: &str = "node.cert.pem";

/// Why the node identity could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum NodeIdentityError {
    /// The token file is missing, unreadable or empty.
    #[error("the node token {path}: {reason}")]
    Token {
        /// The file.
        path: PathBuf,
        reason: String,
    },
    /// ZTS (or the callback behind it) refused or failed.
    #[error("ZTS: {0}")]
    Zts(#[from] ZtsError),
    /// ZTS's answer is unusable.
    #[error("ZTS's answer: {0}")]
    Answer(String),
    /// Key, CSR or names.
    #[error("{0}")]
    Local(String),
}

/// What the identity is made of.
#[derive(Debug, Clone)]
pub struct NodeIdentitySettings {
    /// `<admin-domain>.athenz-agent` (or as configured).
    pub principal: String,
    /// The provider (the callback's service).
    pub provider: String,
    /// DNS suffix of the SANs.
    pub dns_suffix: String,
    /// This node's name: the instance id.
    pub node_name: String,
    /// The projected service-account token, re-read for every attempt.
    pub token_file: PathBuf,
    /// Where the pair is kept across restarts (`None`: memory only).
    pub keep_dir: Option<PathBuf>,
    /// When to refresh.
    pub policy: RefreshPolicy,
    /// How to back off after a failure.
    pub backoff: Backoff,
}

/// A pair the agent holds, with its TLS form made once (presented to the jwt-service, and to
/// ZTS when refreshing).
struct Held {
    key: PrivateKey,
    /// Leaf, then chain.
    cert_pem: String,
    info: CertInfo,
    certified: Arc<tls::CertifiedKey>,
}

impl Held {
    fn new(key: PrivateKey, cert_pem: String, info: CertInfo) -> Result<Self, NodeIdentityError> {
        let key_pem = key
            .to_pkcs8_pem()
            .map_err(|e| NodeIdentityError::Local(e.to_string()))?;
        let certified = tls::certified_key_from_pem(&cert_pem, key_pem.expose())
            .map_err(|e| NodeIdentityError::Answer(e.to_string()))?;
        Ok(Self {
            key,
            cert_pem,
            info,
            certified,
        })
    }
}

/// The node's identity and the task that keeps it.
pub struct NodeIdentity {
    settings: NodeIdentitySettings,
    domain: String,
    service: String,
    csr_identity: CsrIdentity,
    zts: ZtsClient,
    tls: Arc<InMemoryIdentity>,
    held: Mutex<Option<Arc<Held>>>,
    /// The attempt under way and the backoff gate after the last failure.
    attempts: Mutex<renewal::Attempts>,
    /// Tells the task that a caller's attempt installed a new certificate, so its pending
    /// backoff is moot.
    renewed_on_demand: tokio::sync::Notify,
    readiness: Readiness,
    expiry: prometheus_client::metrics::gauge::Gauge,
    renewals: prometheus_client::metrics::family::Family<
        RenewalLabels,
        prometheus_client::metrics::counter::Counter,
    >,
}

/// Labels of the renewal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct RenewalLabels {
    /// `register` or `refresh`.
    pub kind: &'static str,
    /// `ok` or `error`.
    pub outcome: &'static str,
}

impl NodeIdentity {
    /// Checks the settings; `readiness` follows whether a valid certificate is held.
    pub fn new(
        settings: NodeIdentitySettings,
        zts: ZtsClient,
        readiness: Readiness,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Self, NodeIdentityError> {
        let csr_identity = CsrIdentity::for_node(
            &settings.principal,
            &settings.provider,
            &settings.dns_suffix,
            &settings.node_name,
        )
        .map_err(|e| NodeIdentityError::Local(e.to_string()))?;
        let (domain, service) =
            athenz_core::names::split_service_name("node principal", &settings.principal)
                .map_err(|e| NodeIdentityError::Local(e.to_string()))?;
        let this = Self {
            domain: domain.to_owned(),
            service: service.to_owned(),
            csr_identity,
            zts,
            tls: Arc::default(),
            held: Mutex::new(None),
            attempts: Mutex::default(),
            renewed_on_demand: tokio::sync::Notify::new(),
            readiness,
            expiry: Default::default(),
            renewals: Default::default(),
            settings,
        };
        registry.register(
            "node_certificate_expiry_seconds",
            "Expiry (Unix time) of the agent's own node certificate",
            this.expiry.clone(),
        );
        registry.register(
            "node_identity_renewals",
            "Node identity registrations and refreshes, by outcome",
            this.renewals.clone(),
        );
        this.readiness.set(false);
        Ok(this)
    }

    /// The client identity presented to the jwt-service: always the current node certificate.
    pub fn client_identity(&self) -> ClientIdentity {
        ClientIdentity::InMemory(Arc::clone(&self.tls))
    }

    /// Whether a certificate valid now is held.
    pub fn is_valid(&self) -> bool {
        self.held()
            .is_some_and(|h| h.info.is_valid_at(OffsetDateTime::now_utc()))
    }

    /// The node name.
    pub fn node_name(&self) -> &str {
        &self.settings.node_name
    }

    fn held(&self) -> Option<Arc<Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `info` names this node's identity (principal and instance-id URI).
    fn is_this_node(&self, info: &CertInfo) -> bool {
        info.common_name == self.settings.principal
            && info.uris.contains(&athenz_core::names::instance_id_uri(
                &self.settings.provider,
                &self.settings.node_name,
            ))
    }

    fn install(&self, held: Held) {
        self.tls.set(Arc::clone(&held.certified));
        self.expiry.set(held.info.not_after.unix_timestamp());
        self.readiness
            .set(held.info.is_valid_at(OffsetDateTime::now_utc()));
        *self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(held));
    }

    fn read_token(&self) -> Result<Secret, NodeIdentityError> {
        use std::io::Read;
        let path = &self.settings.token_file;
        let err = |reason: String| NodeIdentityError::Token {
            path: path.clone(),
            reason,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(|e| err(e.to_string()))?
            .take(MAX_TOKEN_FILE + 1)
            .read_to_string(&mut text)
            .map_err(|e| err(e.to_string()))?;
        if text.len() as u64 > MAX_TOKEN_FILE {
            return Err(err(format!("over {MAX_TOKEN_FILE} bytes")));
        }
        let token = text.trim();
        if token.is_empty() {
            return Err(err("empty".into()));
        }
        Ok(Secret::new(token.to_owned()))
    }

    fn new_key_and_csr(&self) -> Result<(PrivateKey, String), NodeIdentityError> {
        let key = PrivateKey::generate(KeyAlgorithm::P256)
            .map_err(|e| NodeIdentityError::Local(e.to_string()))?;
        let csr = build_csr(&self.csr_identity, &key)
            .map_err(|e| NodeIdentityError::Local(e.to_string()))?;
        Ok((key, csr))
    }

    fn accept(
        &self,
        key: PrivateKey,
        identity: &InstanceIdentity,
    ) -> Result<Held, NodeIdentityError> {
        let leaf = identity
            .x509_certificate
            .as_deref()
            .ok_or_else(|| NodeIdentityError::Answer("no certificate".into()))?;
        let info =
            CertInfo::from_pem(leaf).map_err(|e| NodeIdentityError::Answer(e.to_string()))?;
        if !key_matches_cert(&key, &info) {
            return Err(NodeIdentityError::Answer(
                "the certificate is not for the key sent".into(),
            ));
        }
        if !self.is_this_node(&info) {
            return Err(NodeIdentityError::Answer(
                "the certificate is not this node's identity".into(),
            ));
        }
        let signer = identity.x509_certificate_signer.clone().unwrap_or_default();
        let cert_pem =
            leaf_with_chain(leaf, &signer).map_err(|e| NodeIdentityError::Answer(e.to_string()))?;
        Held::new(key, cert_pem, info)
    }

    /// A new registration: a fresh key, the token as attestation.
    async fn register(&self) -> Result<Held, NodeIdentityError> {
        let token = self.read_token()?;
        let (key, csr) = self.new_key_and_csr()?;
        let registered = self
            .zts
            .register(&InstanceRegisterInformation {
                provider: self.settings.provider.clone(),
                domain: self.domain.clone(),
                service: self.service.clone(),
                attestation_data: token,
                csr,
                ..Default::default()
            })
            .await?;
        self.accept(key, &registered.identity)
    }

    /// A refresh presenting `current`, with a fresh token and a fresh key.
    async fn refresh(&self, current: &Held) -> Result<Held, NodeIdentityError> {
        let token = self.read_token()?;
        let (key, csr) = self.new_key_and_csr()?;
        let identity = self
            .zts
            .refresh_instance(
                &InstanceRef {
                    provider: &self.settings.provider,
                    domain: &self.domain,
                    service: &self.service,
                    instance_id: &self.settings.node_name,
                },
                &InstanceRefreshInformation {
                    attestation_data: Some(token),
                    csr: Some(csr),
                    ..Default::default()
                },
                ClientIdentity::Fixed(Arc::clone(&current.certified)),
            )
            .await?;
        self.accept(key, &identity)
    }

    /// One renewal: a refresh while the current certificate is valid (a register if ZTS refuses
    /// it for good, e.g. after its records were lost), else a register.
    pub async fn renew_once(&self) -> Result<(), NodeIdentityError> {
        let current = self.held().filter(|h| {
            h.info
                .is_valid_at(OffsetDateTime::now_utc() + time::Duration::seconds(5))
        });
        let result = match &current {
            Some(held) => match self.refresh(held).await {
                Err(NodeIdentityError::Zts(e)) if !e.is_transient() => {
                    tracing::warn!(error = %e, "node identity refresh refused; registering anew");
                    self.count("refresh", false);
                    self.register().await.map(|h| ("register", h))
                }
                other => other.map(|h| ("refresh", h)),
            },
            None => self.register().await.map(|h| ("register", h)),
        };
        match result {
            Ok((kind, held)) => {
                self.count(kind, true);
                tracing::info!(
                    kind,
                    node = %self.settings.node_name,
                    expires = %held.info.not_after,
                    serial = %held.info.serial_hex,
                    "node identity obtained"
                );
                self.keep(&held);
                self.install(held);
                Ok(())
            }
            Err(e) => {
                self.count(
                    if current.is_some() {
                        "refresh"
                    } else {
                        "register"
                    },
                    false,
                );
                // a certificate that expired meanwhile stops readiness
                self.readiness.set(self.is_valid());
                Err(e)
            }
        }
    }

    fn count(&self, kind: &'static str, ok: bool) {
        self.renewals
            .get_or_create(&RenewalLabels {
                kind,
                outcome: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    /// Writes the pair under `--node-identity-dir` (0600), when set; a failure only logs.
    fn keep(&self, held: &Held) {
        let Some(dir) = &self.settings.keep_dir else {
            return;
        };
        let result = held
            .key
            .to_pkcs8_pem()
            .map_err(|e| e.to_string())
            .and_then(|key| {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
                athenz_core::volume::write_file_atomic(
                    &dir.join(KEY_FILE),
                    key.expose().as_bytes(),
                    0o600,
                )
                .map_err(|e| e.to_string())?;
                athenz_core::volume::write_file_atomic(
                    &dir.join(CERT_FILE),
                    held.cert_pem.as_bytes(),
                    0o600,
                )
                .map_err(|e| e.to_string())
            });
        if let Err(e) = result {
            tracing::warn!(dir = %dir.display(), error = %e, "could not keep the node identity");
        }
    }

    /// Loads a kept pair that is this node's and valid now; anything else is ignored (and a
    /// fresh one registered).
    pub fn load_kept(&self) -> bool {
        let Some(dir) = &self.settings.keep_dir else {
            return false;
        };
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let (Some(key_pem), Some(cert_pem)) = (read(KEY_FILE), read(CERT_FILE)) else {
            return false;
        };
        let loaded = PrivateKey::from_pem(&key_pem)
            .map_err(|e| e.to_string())
            .and_then(|key| {
                let info = CertInfo::from_pem(&cert_pem).map_err(|e| e.to_string())?;
                let ours = self.is_this_node(&info)
                    && key_matches_cert(&key, &info)
                    && info.is_valid_at(OffsetDateTime::now_utc());
                if ours {
                    Held::new(key, cert_pem, info).map_err(|e| e.to_string())
                } else {
                    Err("not this node's valid identity".to_owned())
                }
            });
        match loaded {
            Ok(held) => {
                self.install(held);
                tracing::info!(dir = %dir.display(), "serving the kept node identity");
                true
            }
            Err(why) => {
                tracing::info!(dir = %dir.display(), reason = %why, "not using the kept node identity");
                false
            }
        }
    }
}
