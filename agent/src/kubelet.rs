//! The node's pods, from the kubelet's `GET /pods`: one cached list per node, refreshed by one
//! caller at a time (others wait for that answer instead of asking again), and a bounded wait for a
//! pod the kubelet has not listed yet.

use athenz_core::client::{error_chain, read_limited};
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Largest pod list read (a node of 110 pods lists in well under 4 MiB).
const MAX_POD_LIST: usize = 16 * 1024 * 1024;
/// Least time between two refreshes forced by a missing pod: at most 40 lists a second, however
/// many pods start at once (concurrent lookups share one list).
const MIN_FORCED_REFRESH: Duration = Duration::from_millis(25);

/// The kubelet could not be asked.
#[derive(Debug, thiserror::Error)]
#[error("kubelet: {0}")]
pub struct KubeletError(pub String);

#[derive(serde::Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

/// The cached pod list of this node.
pub struct PodCache {
    client: reqwest::Client,
    url: String,
    /// Bearer token file, read for every list (the kubelet rotates projected tokens).
    token_file: Option<std::path::PathBuf>,
    ttl: Duration,
    cached: Mutex<Option<(Instant, Arc<Vec<Pod>>)>>,
}

impl PodCache {
    /// A cache of `<kubelet_url>/pods`, fresh for `ttl`, asked with the bearer token in
    /// `token_file` if any.
    pub fn new(
        client: reqwest::Client,
        kubelet_url: &str,
        token_file: Option<std::path::PathBuf>,
        ttl: Duration,
    ) -> Self {
        Self {
            client,
            url: format!("{}/pods", kubelet_url.trim_end_matches('/')),
            token_file,
            ttl,
            cached: Mutex::new(None),
        }
    }

    async fn fetch(&self) -> Result<Vec<Pod>, KubeletError> {
        let mut req = self.client.get(&self.url);
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path)
                .map_err(|e| KubeletError(format!("reading the token {}: {e}", path.display())))?;
            req = req.bearer_auth(token.trim());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| KubeletError(error_chain(&e)))?;
        let status = resp.status();
        let body = read_limited(resp, MAX_POD_LIST)
            .await
            .map_err(|e| KubeletError(e.to_string()))?;
        if !status.is_success() {
            return Err(KubeletError(format!("GET /pods answered {status}")));
        }
        serde_json::from_slice::<PodList>(&body)
            .map(|l| l.items)
            .map_err(|e| KubeletError(format!("unreadable pod list: {e}")))
    }

    /// The pod list, at most `max_age` old. One caller refreshes; concurrent callers wait for it.
    pub async fn pods(&self, max_age: Duration) -> Result<Arc<Vec<Pod>>, KubeletError> {
        Ok(self.pods_fetched(max_age, None).await?.1)
    }

    /// The pod list and when it was fetched: the cached one if it is at most `max_age` old and
    /// fetched after `after`, else a new one.
    async fn pods_fetched(
        &self,
        max_age: Duration,
        after: Option<Instant>,
    ) -> Result<(Instant, Arc<Vec<Pod>>), KubeletError> {
        let mut cached = self.cached.lock().await;
        if let Some((at, pods)) = cached.as_ref()
            && at.elapsed() <= max_age
            && after.is_none_or(|after| *at > after)
        {
            return Ok((*at, Arc::clone(pods)));
        }
        let pods = Arc::new(self.fetch().await?);
        let at = Instant::now();
        *cached = Some((at, Arc::clone(&pods)));
        Ok((at, pods))
    }

    /// Pods held now (for the cache-size metric).
    pub async fn cached_pods(&self) -> usize {
        self.cached
            .lock()
            .await
            .as_ref()
            .map_or(0, |(_, p)| p.len())
    }

    /// Finds the pod `namespace/name`, waiting up to `wait` for the kubelet to list it.
    ///
    /// A pod missing from the cached list is usually newer than the list (kubelet mounts a new
    /// pod's volumes right after listing it), so a miss asks the kubelet again at once — unless
    /// the list is younger than [`MIN_FORCED_REFRESH`], which bounds how often misses (say, for a
    /// pod that is not on this node) can make the agent ask.
    pub async fn find(
        &self,
        namespace: &str,
        name: &str,
        wait: Duration,
    ) -> Result<Option<Pod>, KubeletError> {
        let deadline = Instant::now() + wait;
        let mut after = None;
        loop {
            let (fetched_at, pods) = self.pods_fetched(self.ttl, after).await?;
            let found = pods.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            });
            if let Some(pod) = found {
                return Ok(Some(pod.clone()));
            }
            let next = fetched_at + MIN_FORCED_REFRESH;
            if next > deadline {
                return Ok(None);
            }
            tokio::time::sleep_until(next.into()).await;
            after = Some(fetched_at);
        }
    }
}
