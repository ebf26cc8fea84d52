//! The agent's kubelet client reads its bearer token file for every list, so a token the kubelet
//! rotates (projected service-account tokens are) keeps working without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_identity_agent::kubelet::PodCache;
use athenz_testbed::kube_api::{KubeApi, running_pod};
use athenz_testbed::kubelet::Kubelet;
use std::time::Duration;

#[tokio::test]
async fn a_rotated_token_is_used_without_a_restart() {
    let api = KubeApi::start().await.unwrap();
    api.cluster().put_pod(running_pod(
        "media-sports",
        "web",
        "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
        "web",
        "10.1.2.3",
        "node-1",
    ));
    let kubelet = Kubelet::start(api.cluster().clone(), "node-1")
        .await
        .unwrap();
    kubelet.controls().require_token(Some("token-1"));
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-1\n").unwrap();
    let cache = PodCache::new(
        reqwest::Client::new(),
        &kubelet.url(),
        Some(token_file.clone()),
        Duration::ZERO,
    );
    assert_eq!(cache.pods(Duration::ZERO).await.unwrap().len(), 1);

    // the kubelet rotates the token: the file changes, the next list presents the new one
    kubelet.controls().require_token(Some("token-2"));
    let err = cache.pods(Duration::ZERO).await.unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
    std::fs::write(&token_file, "token-2\n").unwrap();
    assert_eq!(cache.pods(Duration::ZERO).await.unwrap().len(), 1);

    // a token file that disappears is an error naming it, not an anonymous request
    std::fs::remove_file(&token_file).unwrap();
    let err = cache.pods(Duration::ZERO).await.unwrap_err().to_string();
    assert!(err.contains("token"), "{err}");
}
