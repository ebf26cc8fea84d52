//! What node B's agent's tokens reach of node A, used directly (`real_cluster_nodes`).

use super::common::nodes::agent_file;
use super::{AGENT_PRINCIPAL, API_TOKEN, NODE_TOKEN, tokio_run};
use athenz_devstack::cluster::info::ClusterInfo;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use athenz_devstack::cluster::scenario::RESTRICTED_NAMESPACE;
use athenz_devstack::crossnode::DirectAccess;
use std::path::Path;
use std::time::Duration;

/// Node B's agent's tokens (as its container holds them), used directly: against node A's
/// kubelet and the API server they read only what RBAC grants every agent (`nodes/pods`: the
/// pod list any agent's kubelet call needs; `list` and `watch` pods: the watch of a node's
/// pending pods, which RBAC cannot scope to a node, so node A's pods are listed there too),
/// nothing else; the attestation token is good for nothing but the callback, which refuses it
/// for node A's identity.
pub fn tokens_of_b_reach_nothing_of_a(info: &ClusterInfo, a: usize, b: usize, zts_ca: &Path) {
    let (node_a, node_b) = (&info.nodes[a], &info.nodes[b]);
    let api_token = agent_file(node_b, API_TOKEN);
    let node_token = agent_file(node_b, NODE_TOKEN);
    let ca = std::fs::read_to_string(&info.api_server.ca).unwrap();
    let cas = athenz_core::crypto::pem_certificates(&ca).unwrap();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(athenz_core::tls::client_config(&cas, None).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let kubelet_a = format!("https://{}:10250", node_a.ip);
    let status = |method: reqwest::Method, url: &str, token: &str| {
        let request = client.request(method, url).bearer_auth(token.trim());
        tokio_run(async move { request.send().await.unwrap().status().as_u16() })
    };
    use reqwest::Method;
    let pod_of_a = format!("{RESTRICTED_NAMESPACE}/node-files-{}", a + 1);
    let checks: Vec<(&str, Method, String, &str, u16)> = vec![
        // RBAC's nodes/pods, granted to the agents' account on every node
        (
            "kubelet A's pod list",
            Method::GET,
            format!("{kubelet_a}/pods"),
            &api_token,
            200,
        ),
        (
            "kubelet A's exec",
            Method::POST,
            format!("{kubelet_a}/exec/{pod_of_a}/app?command=true&output=1"),
            &api_token,
            403,
        ),
        (
            "kubelet A's logs",
            Method::GET,
            format!("{kubelet_a}/containerLogs/{pod_of_a}/app"),
            &api_token,
            403,
        ),
        (
            "kubelet A's stats",
            Method::GET,
            format!("{kubelet_a}/stats/summary"),
            &api_token,
            403,
        ),
        (
            "kubelet A's config",
            Method::GET,
            format!("{kubelet_a}/configz"),
            &api_token,
            403,
        ),
        (
            "kubelet A, attestation token",
            Method::GET,
            format!("{kubelet_a}/pods"),
            &node_token,
            401,
        ),
        (
            "the API's pod of A",
            Method::GET,
            format!(
                "{}/api/v1/namespaces/{RESTRICTED_NAMESPACE}/pods/node-files-{}",
                info.api_server.url,
                a + 1
            ),
            &api_token,
            403,
        ),
        // RBAC's list pods (CSI_EARLY_ISSUE's watch): the same pods kubelet A's list shows
        (
            "the API's pod list of node A",
            Method::GET,
            format!(
                "{}/api/v1/pods?fieldSelector=spec.nodeName%3D{}",
                info.api_server.url, node_a.name
            ),
            &api_token,
            200,
        ),
        (
            "the API's node A",
            Method::GET,
            format!("{}/api/v1/nodes/{}", info.api_server.url, node_a.name),
            &api_token,
            403,
        ),
        (
            "the API's Secrets",
            Method::GET,
            format!(
                "{}/api/v1/namespaces/{CONTROL_NAMESPACE}/secrets",
                info.api_server.url
            ),
            &api_token,
            403,
        ),
        (
            "the API's token for A's pod",
            Method::POST,
            format!(
                "{}/api/v1/namespaces/{RESTRICTED_NAMESPACE}/serviceaccounts/node-files/token",
                info.api_server.url
            ),
            &api_token,
            403,
        ),
        (
            "the API, attestation token",
            Method::GET,
            format!(
                "{}/api/v1/namespaces/{NODE_NAMESPACE}/pods",
                info.api_server.url
            ),
            &node_token,
            401,
        ),
    ];
    for (what, method, url, token, expected) in checks {
        let got = status(method, &url, token);
        assert_eq!(got, expected, "node B's token at {what} ({url})");
        eprintln!("node B's agent token at {what}: {got}");
    }
    // the attestation token, registering node A's identity with ZTS: the callback refuses it
    let zts_ca = std::fs::read_to_string(zts_ca).unwrap();
    let access = DirectAccess {
        node_name: node_b.name.clone(),
        jwt_service_url: String::new(),
        jwt_service_address: None,
        zts_url: info.zts.as_ref().unwrap().url.clone(),
        cas: athenz_core::crypto::pem_certificates(&zts_ca).unwrap(),
        provider: "k8s.admin.athenz-callback".to_owned(),
        dns_suffix: "athenz.cloud".to_owned(),
        cert_pem: String::new(),
        key_pem: athenz_core::secret::Secret::new(String::new()),
    };
    let refusal =
        tokio_run(access.register_node_identity(AGENT_PRINCIPAL, &node_a.name, node_token.trim()))
            .unwrap();
    eprintln!("node B's attestation token, registering node A's identity: {refusal}");
    let wrong_node = format!(
        "node_instance_id: instanceId Some(\\\"{}\\\") is not the agent pod's node \\\"{}\\\"",
        node_a.name, node_b.name
    );
    assert!(
        refusal.contains("ZTS refused (403)") && refusal.contains(&wrong_node),
        "{refusal}"
    );
}
