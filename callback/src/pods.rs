//! Reading pods and services from the Kubernetes API (kube-rs), with a timeout on every call and
//! the call's latency recorded.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;
use prometheus_client::metrics::histogram::Histogram;
use std::time::{Duration, Instant};

/// What the checks need from the cluster.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    timeout: Duration,
    latency: Histogram,
}

/// The API could not answer.
#[derive(Debug, thiserror::Error)]
#[error("Kubernetes API: {0}")]
pub struct ApiError(pub String);

impl Cluster {
    /// A client for `api_url` (plain URL, e.g. the stand-in) or, without one, the in-cluster
    /// configuration or kubeconfig (`KUBECONFIG`, `~/.kube/config`).
    pub async fn connect(
        api_url: Option<&str>,
        timeout: Duration,
        latency: Histogram,
    ) -> Result<Self, ApiError> {
        let mut config = match api_url {
            Some(url) => kube::Config::new(
                url.parse::<http::Uri>()
                    .map_err(|e| ApiError(format!("URL {url:?}: {e}")))?,
            ),
            None => kube::Config::infer()
                .await
                .map_err(|e| ApiError(format!("no in-cluster config or kubeconfig: {e}")))?,
        };
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let client = kube::Client::try_from(config).map_err(|e| ApiError(e.to_string()))?;
        Ok(Self {
            client,
            timeout,
            latency,
        })
    }

    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, call).await;
        self.latency.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(r) => r.map_err(|e| ApiError(e.to_string())),
            Err(_) => Err(ApiError(format!("no answer within {:?}", self.timeout))),
        }
    }

    /// A pod, or `None` if it does not exist.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        self.timed(api.get_opt(name)).await
    }

    /// A service, or `None` if it does not exist.
    pub async fn service(&self, namespace: &str, name: &str) -> Result<Option<Service>, ApiError> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        self.timed(api.get_opt(name)).await
    }

    /// A node, or `None` if it does not exist.
    pub async fn node(&self, name: &str) -> Result<Option<Node>, ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.timed(api.get_opt(name)).await
    }

    /// The API server's review of a service-account token for `audience` (`POST
    /// /apis/authentication.k8s.io/v1/tokenreviews`; a bad token is a review that says so, not an
    /// error).
    pub async fn review_token(&self, token: &str, audience: &str) -> Result<TokenReview, ApiError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![audience.to_owned()]),
            },
            ..TokenReview::default()
        };
        self.timed(api.create(&kube::api::PostParams::default(), &review))
            .await
    }

    /// Whether the API answers (readiness).
    pub async fn reachable(&self) -> bool {
        self.timed(self.client.apiserver_version()).await.is_ok()
    }
}
