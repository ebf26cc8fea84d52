//! The Kubernetes API stand-in serves real Kubernetes JSON: objects k8s-openapi reads back, lists
//! filtered by node, and `Status` objects for what does not exist.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_testbed::kube_api::{KubeApi, cluster_ip_service, mark_terminating, running_pod};
use k8s_openapi::api::core::v1::{Pod, Service};

const UID: &str = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";

/// Service-account tokens and nodes (TokenRequest, TokenReview).
#[path = "kube_api/tokens.rs"]
mod tokens;

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
    // no watch: refused, named, never a list that a watcher would misread as events
    for path in [
        "/api/v1/pods?watch=true&resourceVersion=1",
        "/api/v1/namespaces/media-sports/pods?allowWatchBookmarks=true&watch=1",
    ] {
        let resp = get(path).await.unwrap();
        assert_eq!(resp.status(), 405, "{path}");
        let status: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(status["reason"], "MethodNotAllowed");
        assert!(
            status["message"].as_str().unwrap().contains("watch"),
            "{status}"
        );
    }
}

/// The write routes answer as the API server does: created objects get a uid and a Pending
/// status, the status subresource and merge patches change what they should, a delete first
/// marks the pod terminating and a zero-grace delete removes it.
#[tokio::test]
async fn writes_follow_the_api_server() {
    let api = KubeApi::start().await.unwrap();
    let http = reqwest::Client::new();
    let pods = format!("{}/api/v1/namespaces/media-sports/pods", api.url());
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"serviceAccountName": "web", "nodeName": "node-1",
                 "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running", "podIP": "10.9.9.9"}
    });
    let resp = http.post(&pods).json(&pod).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let created: Pod = resp.json().await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 36);
    assert_eq!(created.metadata.namespace.as_deref(), Some("media-sports"));
    // the client's status is not the server's
    let status = created.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.pod_ip, None);

    // same name again: 409 AlreadyExists
    let resp = http.post(&pods).json(&pod).send().await.unwrap();
    assert_eq!(resp.status(), 409);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["reason"], "AlreadyExists");

    // kubelet reports it running
    let mut running = created.clone();
    running.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.1.2.3".into()),
        ..Default::default()
    });
    let resp = http
        .put(format!("{pods}/web/status"))
        .json(&running)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let stored = api.cluster().pod("media-sports", "web").unwrap();
    assert_eq!(stored.status.unwrap().pod_ip.as_deref(), Some("10.1.2.3"));

    // a merge patch of labels; uid is immutable
    let resp = http
        .patch(format!("{pods}/web"))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"tier":"front"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let stored = api.cluster().pod("media-sports", "web").unwrap();
    assert_eq!(stored.metadata.labels.unwrap()["tier"], "front");
    assert_eq!(stored.metadata.uid.as_deref(), Some(uid.as_str()));
    let resp = http
        .patch(format!("{pods}/web"))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata":{"uid":"00000000-0000-4000-8000-000000000000"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);

    // delete: terminating first, then gone
    let resp = http.delete(format!("{pods}/web")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let stored = api.cluster().pod("media-sports", "web").unwrap();
    assert!(stored.metadata.deletion_timestamp.is_some());
    let resp = http
        .delete(format!("{pods}/web?gracePeriodSeconds=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(api.cluster().pod("media-sports", "web").is_none());
    let resp = http.delete(format!("{pods}/web")).send().await.unwrap();
    assert_eq!(resp.status(), 404);

    // services: create, replace, delete
    let services = format!("{}/api/v1/namespaces/media-sports/services", api.url());
    let service = serde_json::json!({"metadata": {"name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]}});
    let resp = http.post(&services).json(&service).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let replaced = serde_json::json!({"metadata": {"name": "web"},
        "spec": {"clusterIP": "10.96.0.11", "clusterIPs": ["10.96.0.11"]}});
    let resp = http
        .put(format!("{services}/web"))
        .json(&replaced)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got: Service = http
        .get(format!("{services}/web"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.11"));
    let resp = http.delete(format!("{services}/web")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = http.get(format!("{services}/web")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

/// Malformed, mismatched and hostile writes are refused with a Status naming what was wrong, and
/// nothing is stored.
#[tokio::test]
async fn bad_writes_are_refused_and_change_nothing() {
    let api = KubeApi::start().await.unwrap();
    let http = reqwest::Client::new();
    let pods = format!("{}/api/v1/namespaces/media-sports/pods", api.url());
    let big = format!(
        r#"{{"metadata":{{"name":"web","annotations":{{"a":"{}"}}}},"spec":{{"containers":[]}}}}"#,
        "x".repeat(8 * 1024 * 1024)
    );
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("POST", "{".into(), 400, "not a valid Pod"),
        ("POST", "[]".into(), 400, "not a valid Pod"),
        ("POST", r#"{"metadata":{"name":"web"}}"#.into(), 422, "spec"),
        (
            "POST",
            r#"{"metadata":{"name":"web","namespace":"other"},"spec":{"containers":[]}}"#.into(),
            400,
            "does not match the namespace",
        ),
        (
            "POST",
            r#"{"metadata":{"name":"../../etc"},"spec":{"containers":[]}}"#.into(),
            422,
            "metadata.name",
        ),
        (
            "POST",
            r#"{"metadata":{},"spec":{"containers":[]}}"#.into(),
            422,
            "metadata.name",
        ),
        ("POST", big, 413, ""),
    ];
    for (method, body, code, needle) in cases {
        let resp = http
            .request(method.parse().unwrap(), &pods)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), code, "{needle}");
        let text = resp.text().await.unwrap();
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    assert!(api.cluster().pods(None, None).is_empty());

    // status of a pod that does not exist; a patch that is not a merge patch; a URL name that is
    // not the object's
    let resp = http
        .put(format!("{pods}/ghost/status"))
        .body(r#"{"metadata":{"name":"ghost"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    api.cluster().put_pod(running_pod(
        "media-sports",
        "web",
        UID,
        "web",
        "10.1.2.3",
        "node-1",
    ));
    let resp = http
        .patch(format!("{pods}/web"))
        .header("content-type", "application/json-patch+json")
        .body(r#"[{"op":"remove","path":"/metadata"}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let resp = http
        .put(format!("{pods}/web"))
        .body(r#"{"metadata":{"name":"db"},"spec":{"containers":[]}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let mut other_uid = running_pod("media-sports", "web", UID, "web", "10.1.2.3", "node-1");
    other_uid.metadata.uid = Some("11111111-2222-4333-8444-555555555555".into());
    let resp = http
        .put(format!("{pods}/web"))
        .json(&other_uid)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let stored = api.cluster().pod("media-sports", "web").unwrap();
    assert_eq!(stored.metadata.uid.as_deref(), Some(UID));
}

/// The kubelet stand-in serves each pod's JSON from a cache; every change made through the API
/// (create, status, patch, delete) or by a test shows in the next list.
#[tokio::test]
async fn the_kubelet_list_follows_every_change() {
    use athenz_testbed::kubelet::Kubelet;
    let api = KubeApi::start().await.unwrap();
    let kubelet = Kubelet::start(api.cluster().clone(), "node-1")
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let list = || async {
        let body: serde_json::Value = http
            .get(format!("{}/pods", kubelet.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["items"].as_array().unwrap().clone()
    };
    let pods = format!("{}/api/v1/namespaces/media-sports/pods", api.url());
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"serviceAccountName": "web", "nodeName": "node-1",
                 "containers": [{"name": "app", "image": "app:1"}]}
    });
    assert!(list().await.is_empty());
    assert_eq!(
        http.post(&pods).json(&pod).send().await.unwrap().status(),
        201
    );
    let items = list().await;
    assert_eq!(items.len(), 1);
    assert!(items[0]["status"]["podIP"].is_null());

    // the status written through the API
    let patch = serde_json::json!({"status": {"phase": "Running", "podIP": "10.1.2.3"}});
    let resp = http
        .patch(format!("{pods}/web/status"))
        .header("content-type", "application/merge-patch+json")
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(list().await[0]["status"]["podIP"], "10.1.2.3");

    // a change made by a test in the store
    assert!(api.cluster().update_pod("media-sports", "web", |p| {
        p.status.as_mut().unwrap().pod_ip = Some("10.1.2.4".into());
    }));
    assert_eq!(list().await[0]["status"]["podIP"], "10.1.2.4");

    // deletion: terminating first, then gone
    let resp = http.delete(format!("{pods}/web")).send().await.unwrap();
    assert!(resp.status().is_success());
    assert!(!list().await[0]["metadata"]["deletionTimestamp"].is_null());
    let resp = http
        .delete(format!("{pods}/web?gracePeriodSeconds=0"))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    assert!(list().await.is_empty());
}

/// `/metrics` counts every resource request as the real API server's `apiserver_request_total`
/// does: by verb (a collection `GET` is `LIST`), group, version, resource, subresource and code;
/// what is not a resource (`/version`, `/readyz`) is not counted.
#[tokio::test]
async fn requests_are_counted_as_apiserver_request_total() {
    let api = KubeApi::start().await.unwrap();
    api.cluster().put_pod(running_pod(
        "media-sports",
        "web",
        UID,
        "web",
        "10.1.2.3",
        "node-1",
    ));
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", api.url());
    for path in [
        "/api/v1/namespaces/media-sports/pods/web",
        "/api/v1/namespaces/media-sports/pods/web",
        "/api/v1/namespaces/media-sports/pods/gone",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
        "/version",
        "/readyz",
    ] {
        http.get(url(path)).send().await.unwrap();
    }
    http.post(url("/apis/authentication.k8s.io/v1/tokenreviews"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let text = http
        .get(url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |labels: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("apiserver_request_total{{{labels}}}")))
            .and_then(|l| l.rsplit_once(' '))
            .map(|(_, n)| n.parse::<u64>().unwrap())
    };
    assert_eq!(
        count(r#"code="200",group="",resource="pods",subresource="",verb="GET",version="v1""#),
        Some(2),
        "{text}"
    );
    assert_eq!(
        count(r#"code="404",group="",resource="pods",subresource="",verb="GET",version="v1""#),
        Some(1),
        "{text}"
    );
    assert_eq!(
        count(r#"code="200",group="",resource="pods",subresource="",verb="LIST",version="v1""#),
        Some(1),
        "{text}"
    );
    assert!(
        text.contains(r#"group="authentication.k8s.io",resource="tokenreviews",subresource="",verb="POST",version="v1""#),
        "{text}"
    );
    assert_eq!(
        text.matches("apiserver_request_total{").count(),
        4,
        "{text}"
    );
}
