//! A node's restart seen from the socket: the real agent, jwt-service, callback and dev ZTS with
//! the API and kubelet stand-ins, and a pod whose listed sandbox died with the node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::CertInfo;
use athenz_sia::client::AgentError;
use athenz_testbed::fixtures;
use common::*;

/// After a node restarts, the kubelet lists each pod as the API server last had it
/// (`Kubelet.GetPods`, `pkg/kubelet/kubelet_getters.go`): the IP of the sandbox that died with
/// the node, until the kubelet reports the new one — an IP another pod may have by then. The
/// pod's `PodReadyToStartContainers` condition, older than the node's boot, gives it away: no
/// identity names that IP; once the new sandbox is reported, the identity names the new one.
#[tokio::test]
async fn after_a_node_restart_no_identity_names_the_sandbox_ip_that_died_with_it() {
    use athenz_testbed::kube_api::report_sandbox;
    let node = node("p256").await;
    let id = pod_with_volume(&node, "web-7", &uid(7), "10.1.2.7");
    // the API (and so the kubelet's list) still holds the sandbox from before the boot
    node.kube
        .cluster()
        .update_pod(fixtures::NAMESPACE, "web-7", |p| {
            report_sandbox(p, "10.1.2.7", Some(1_577_836_800)) // 2020-01-01
        });
    match client(&node, &id).init().await.unwrap_err() {
        AgentError::Refused {
            code: 503, message, ..
        } => assert!(message.contains("before this node started"), "{message}"),
        other => panic!("{other}"),
    }
    // the kubelet reports the new sandbox and its IP
    node.kube
        .cluster()
        .update_pod(fixtures::NAMESPACE, "web-7", |p| {
            report_sandbox(p, "10.1.2.8", None)
        });
    let answer = client(&node, &id).init().await.unwrap();
    let cert = CertInfo::from_pem(&answer.cert_pem).unwrap();
    assert_eq!(
        cert.ip_addresses,
        ["10.1.2.8".parse::<std::net::IpAddr>().unwrap()]
    );
}
