//! The stand-in's service-account tokens and nodes, on their real routes.

use super::UID;
use athenz_testbed::kube_api::{KubeApi, running_pod};

/// TokenRequest, TokenReview and nodes on their real routes, with the API server's codes and
/// shapes (docs/design.md §5): what the callback's node checks and the devstack rely on.
#[tokio::test]
async fn service_account_tokens_are_minted_and_reviewed_as_the_api_server_does() {
    use base64::Engine;
    let api = KubeApi::start().await.unwrap();
    let c = api.cluster();
    let node_uid = c.put_node("node-1");
    c.put_pod(running_pod(
        "athenz-system",
        "agent-x",
        UID,
        "athenz-agent",
        "",
        "node-1",
    ));
    let http = reqwest::Client::new();
    let post = |path: &str, body: serde_json::Value| {
        http.post(format!("{}{path}", api.url())).json(&body).send()
    };
    let request = |expiration: i64, uid: &str| {
        serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["athenz-node"], "expirationSeconds": expiration,
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent-x", "uid": uid}}
        })
    };
    let token_path = "/api/v1/namespaces/athenz-system/serviceaccounts/athenz-agent/token";
    let resp = post(token_path, request(3600, UID)).await.unwrap();
    assert_eq!(resp.status(), 201);
    let minted: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(minted["kind"], "TokenRequest");
    let token = minted["status"]["token"].as_str().unwrap().to_owned();
    assert!(
        minted["status"]["expirationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    // the claims of a real bound token
    let payload = token.split('.').nth(1).unwrap();
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["aud"], serde_json::json!(["athenz-node"]));
    assert_eq!(
        claims["sub"],
        "system:serviceaccount:athenz-system:athenz-agent"
    );
    assert_eq!(claims["kubernetes.io"]["namespace"], "athenz-system");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], UID);
    assert_eq!(claims["kubernetes.io"]["node"]["name"], "node-1");
    assert_eq!(claims["kubernetes.io"]["node"]["uid"], node_uid.as_str());
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3600
    );

    // refusals: too short, a uid mismatch, another account's pod, no pod, not a pod binding
    let code = |resp: reqwest::Response| resp.status().as_u16();
    assert_eq!(
        code(post(token_path, request(599, UID)).await.unwrap()),
        422
    );
    assert_eq!(
        code(
            post(
                token_path,
                request(3600, "11111111-2222-4333-8444-555555555555")
            )
            .await
            .unwrap()
        ),
        409
    );
    assert_eq!(
        code(
            post(
                "/api/v1/namespaces/athenz-system/serviceaccounts/default/token",
                request(3600, UID)
            )
            .await
            .unwrap()
        ),
        400
    );
    let mut missing = request(3600, UID);
    missing["spec"]["boundObjectRef"]["name"] = "gone".into();
    assert_eq!(code(post(token_path, missing).await.unwrap()), 404);
    let mut secret = request(3600, UID);
    secret["spec"]["boundObjectRef"]["kind"] = "Secret".into();
    assert_eq!(code(post(token_path, secret).await.unwrap()), 400);
    let resp = http
        .post(format!("{}{token_path}", api.url()))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    // reviews: 201 always; authenticated with the real extra keys, or an error
    let review = |token: &str, audience: &str| {
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                           "spec": {"token": token, "audiences": [audience]}})
    };
    let reviews = "/apis/authentication.k8s.io/v1/tokenreviews";
    let resp = post(reviews, review(&token, "athenz-node")).await.unwrap();
    assert_eq!(resp.status(), 201);
    let body: serde_json::Value = resp.json().await.unwrap();
    let status = &body["status"];
    assert_eq!(status["authenticated"], true);
    assert_eq!(status["audiences"], serde_json::json!(["athenz-node"]));
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:athenz-system:athenz-agent"
    );
    let extra = &status["user"]["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        serde_json::json!(["agent-x"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"],
        serde_json::json!([UID])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        serde_json::json!(["node-1"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-uid"],
        serde_json::json!([node_uid])
    );
    assert!(
        extra["authentication.kubernetes.io/credential-id"][0]
            .as_str()
            .unwrap()
            .starts_with("JTI=")
    );
    // kube-rs reads it as the API's type
    let typed: k8s_openapi::api::authentication::v1::TokenReview =
        serde_json::from_value(body.clone()).unwrap();
    assert_eq!(typed.status.unwrap().authenticated, Some(true));

    for (token, audience, why) in [
        (token.as_str(), "kubernetes", "audience"),
        ("a.b.c", "athenz-node", "invalid bearer token"),
        ("", "athenz-node", "invalid bearer token"),
    ] {
        let body: serde_json::Value = post(reviews, review(token, audience))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(body["status"]["authenticated"].is_null(), "{body}");
        assert!(
            body["status"]["error"].as_str().unwrap().contains(why),
            "{body}"
        );
    }
    // the bound pod deleted: the token stops authenticating
    c.delete_pod("athenz-system", "agent-x");
    let body: serde_json::Value = post(reviews, review(&token, "athenz-node"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        body["status"]["error"]
            .as_str()
            .unwrap()
            .contains("not found"),
        "{body}"
    );

    // nodes
    let node: serde_json::Value = http
        .get(format!("{}/api/v1/nodes/node-1", api.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(node["kind"], "Node");
    assert_eq!(node["metadata"]["uid"], node_uid.as_str());
    let resp = http
        .get(format!("{}/api/v1/nodes/node-9", api.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}
