//! Where the webhook's CA is kept and whom it must reach: one Secret (the CA, shared by the
//! replicas) and one MutatingWebhookConfiguration (whose `caBundle` the API server trusts).
//! [`CaApi`] is what the keeper needs of them; [`KubeCaApi`] is the Kubernetes API, tests use
//! a table.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// The Secret's key holding the CA certificate.
pub const CA_CERT_KEY: &str = "ca.crt";
/// The Secret's key holding the CA's private key.
pub const CA_KEY_KEY: &str = "ca.key";
/// The Secret's key holding the CAs replaced last, kept in the bundle for a while.
pub const PREVIOUS_CA_CERT_KEY: &str = "previous-ca.crt";
/// The Secret's key holding when the replaced CAs stop being trusted (Unix seconds), when that
/// is before their own end.
pub const PREVIOUS_UNTIL_KEY: &str = "previous-until";

/// A call to the API that failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The object the install creates is not there.
    #[error("{what} not found: the install creates it")]
    Missing {
        /// Which object.
        what: String,
    },
    /// The API refused or failed.
    #[error("{what}: {reason}")]
    Failed {
        /// Which object and what was done to it.
        what: String,
        /// The API's answer.
        reason: String,
    },
}

/// The Secret's data as read, with the version a write must match.
#[derive(Debug, Default, Clone)]
pub struct StoredCa {
    /// Every key of the Secret's `data`.
    pub data: BTreeMap<String, Vec<u8>>,
    /// The Secret's `resourceVersion`.
    pub version: String,
}

/// What the keeper needs of the Kubernetes API.
pub trait CaApi: Send + Sync {
    /// The Secret's data.
    fn read_ca(&self) -> impl Future<Output = Result<StoredCa, ApiError>> + Send;
    /// Replaces the Secret's data if it is still at `version`: `Ok(false)` when another
    /// replica wrote it first (the caller reads again).
    fn write_ca(
        &self,
        data: BTreeMap<String, Vec<u8>>,
        version: &str,
    ) -> impl Future<Output = Result<bool, ApiError>> + Send;
    /// The `caBundle` of every webhook of the configuration, in order.
    fn bundles(&self) -> impl Future<Output = Result<Vec<Vec<u8>>, ApiError>> + Send;
    /// Sets every webhook's `caBundle` to `bundle`; `Ok(false)` when the configuration changed
    /// meanwhile (the next check tries again).
    fn set_bundles(&self, bundle: &[u8]) -> impl Future<Output = Result<bool, ApiError>> + Send;
}

/// The Secret and the webhook configuration through the Kubernetes API.
pub struct KubeCaApi {
    secrets: kube::Api<Secret>,
    webhooks: kube::Api<MutatingWebhookConfiguration>,
    secret_name: String,
    secret_label: String,
    webhook_name: String,
    timeout: Duration,
}

impl KubeCaApi {
    /// The Secret `namespace/secret` and the configuration `webhook`, each call bounded by
    /// `timeout`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        secret: &str,
        webhook: &str,
        timeout: Duration,
    ) -> Self {
        Self {
            secrets: kube::Api::namespaced(client.clone(), namespace),
            webhooks: kube::Api::all(client),
            secret_name: secret.to_owned(),
            secret_label: format!("Secret {namespace}/{secret}"),
            webhook_name: webhook.to_owned(),
            timeout,
        }
    }

    fn webhook_label(&self) -> String {
        format!("MutatingWebhookConfiguration {}", self.webhook_name)
    }

    async fn bounded<T>(
        &self,
        what: String,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        let answer = tokio::time::timeout(self.timeout, call).await;
        self.answered(what, answer)
    }

    /// A call's answer within the timeout, or why there is none.
    fn answered<T>(
        &self,
        what: String,
        answer: Result<Result<T, kube::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, ApiError> {
        match answer {
            Err(_) => Err(ApiError::Failed {
                what,
                reason: format!("no answer within {:?}", self.timeout),
            }),
            Ok(Err(kube::Error::Api(status))) if status.is_not_found() => {
                Err(ApiError::Missing { what })
            }
            Ok(Err(e)) => Err(ApiError::Failed {
                what,
                reason: e.to_string(),
            }),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// A replace, bounded as every call: `Ok(false)` when the object changed since it was
    /// read (a conflict), for the caller to read again.
    async fn replaced<T>(
        &self,
        what: String,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<bool, ApiError> {
        let conflict =
            |e: &kube::Error| matches!(e, kube::Error::Api(status) if status.is_conflict());
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Err(e)) if conflict(&e) => Ok(false),
            answer => self.answered(what, answer).map(|_| true),
        }
    }

    async fn webhook(&self) -> Result<MutatingWebhookConfiguration, ApiError> {
        self.bounded(
            format!("reading {}", self.webhook_label()),
            self.webhooks.get(&self.webhook_name),
        )
        .await
    }
}

impl CaApi for KubeCaApi {
    async fn read_ca(&self) -> Result<StoredCa, ApiError> {
        let secret = self
            .bounded(
                format!("reading {}", self.secret_label),
                self.secrets.get(&self.secret_name),
            )
            .await?;
        Ok(StoredCa {
            data: secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
            version: secret.metadata.resource_version.unwrap_or_default(),
        })
    }

    async fn write_ca(
        &self,
        data: BTreeMap<String, Vec<u8>>,
        version: &str,
    ) -> Result<bool, ApiError> {
        let what = format!("writing {}", self.secret_label);
        let mut secret = self
            .bounded(what.clone(), self.secrets.get(&self.secret_name))
            .await?;
        if secret.metadata.resource_version.as_deref() != Some(version) {
            return Ok(false);
        }
        secret.data = Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect());
        secret.string_data = None;
        self.replaced(
            what,
            self.secrets
                .replace(&self.secret_name, &PostParams::default(), &secret),
        )
        .await
    }

    async fn bundles(&self) -> Result<Vec<Vec<u8>>, ApiError> {
        Ok(self
            .webhook()
            .await?
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
            .collect())
    }

    async fn set_bundles(&self, bundle: &[u8]) -> Result<bool, ApiError> {
        let what = format!("writing {}'s caBundle", self.webhook_label());
        let mut config = self.webhook().await?;
        for webhook in config.webhooks.iter_mut().flatten() {
            webhook.client_config.ca_bundle = Some(ByteString(bundle.to_vec()));
        }
        self.replaced(
            what,
            self.webhooks
                .replace(&self.webhook_name, &PostParams::default(), &config),
        )
        .await
    }
}
