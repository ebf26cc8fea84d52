//! The Kubernetes API stand-in serves real Kubernetes JSON: objects k8s-openapi reads back, lists
//! filtered by node, and `Status` objects for what does not exist.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_testbed::kube_api::{KubeApi, cluster_ip_service, mark_terminating, running_pod};
use k8s_openapi::api::core::v1::{Pod, Service};

const UID: &str = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";

#[tokio::test]
async fn objects_lists_and_status() {
    let api = KubeApi::start().await.unwrap();
    let c = api.cluster();
    c.put_pod(running_pod(
        "media-sports",
        "web",
        UID,
        "web",
        "10.1.2.3",
        "node-1",
    ));
    c.put_pod(running_pod(
        "media-sports",
        "db",
        "11111111-2222-4333-8444-555555555555",
        "db",
        "10.1.2.4",
        "node-2",
    ));
    c.put_service(cluster_ip_service("media-sports", "web", "10.96.0.10"));
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{}{path}", api.url())).send();

    let resp = get("/api/v1/namespaces/media-sports/pods/web")
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let json: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(json["kind"], "Pod");
    assert_eq!(json["apiVersion"], "v1");
    let pod: Pod = serde_json::from_value(json).unwrap();
    assert_eq!(pod.metadata.uid.as_deref(), Some(UID));
    assert_eq!(pod.status.unwrap().pod_ip.as_deref(), Some("10.1.2.3"));

    let svc: Service = get("/api/v1/namespaces/media-sports/services/web")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.10"));

    let list: serde_json::Value = get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["kind"], "PodList");
    let items: Vec<Pod> = serde_json::from_value(list["items"].clone()).unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].metadata.name.as_deref(), Some("web"));
    let all: serde_json::Value = get("/api/v1/pods").await.unwrap().json().await.unwrap();
    assert_eq!(all["items"].as_array().unwrap().len(), 2);

    // mutations are visible at once
    c.update_pod("media-sports", "web", mark_terminating);
    let pod: Pod = get("/api/v1/namespaces/media-sports/pods/web")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some());
    c.delete_pod("media-sports", "web");

    for path in [
        "/api/v1/namespaces/media-sports/pods/web",
        "/api/v1/namespaces/media-sports/services/nope",
        "/apis/apps/v1/deployments",
    ] {
        let resp = get(path).await.unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let status: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
    }
    let version: serde_json::Value = get("/version").await.unwrap().json().await.unwrap();
    assert_eq!(version["major"], "1");
}
