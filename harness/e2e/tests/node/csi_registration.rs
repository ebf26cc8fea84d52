//! The agent registers its CSI driver with kubelet itself (the node-driver-registrar's job),
//! through the real agent: this test plays kubelet's plugin watcher as it handles a CSI plugin
//! (`pkg/kubelet/pluginmanager` and the CSI plugin's `RegisterPlugin`): `GetInfo` on the socket
//! found in `plugins_registry`, `NodeGetInfo` on the endpoint it names, then the verdict.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::csi::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use athenz_core::csi::v1::{NodeGetInfoRequest, node_client::NodeClient};
use athenz_testbed::grpc::dial_unix;
use common::*;
use std::time::Duration;

const REGISTERED: &str = "athenz_agent_csi_registered ";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_finds_the_csi_socket_through_the_agents_own_registration() {
    let node = node("p256").await;
    let registry = node.dir.path().join("plugins_registry");
    let csi_socket = node.dir.path().join("plugins/csi.athenz.io/csi.sock");
    let mut config = node.agent_config.clone();
    config.agent_dir = node.dir.path().join("agent-csi");
    config.csi_socket = Some(csi_socket.clone());
    config.csi_registration_dir = Some(registry.clone());
    let (bound, _) = athenz_identity_agent::start(config, node.shutdown.clone())
        .await
        .unwrap();
    wait_ready(bound.ops).await;
    assert_eq!(metric(bound.ops, REGISTERED).await, -1.0);

    // kubelet's plugin watcher: the socket under the registrar's name, then GetInfo
    let registration_socket = registry.join("csi.athenz.io-reg.sock");
    assert!(registration_socket.exists());
    let timeout = Some(Duration::from_secs(5));
    let mut registration =
        RegistrationClient::new(dial_unix(&registration_socket, timeout).await.unwrap());
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "csi.athenz.io");
    assert_eq!(info.supported_versions, ["1.0.0"]);
    assert_eq!(info.endpoint, csi_socket.display().to_string());

    // the CSI plugin's registration: NodeGetInfo on that endpoint names this node
    let mut csi = NodeClient::new(
        dial_unix(std::path::Path::new(&info.endpoint), timeout)
            .await
            .unwrap(),
    );
    let node_info = csi
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, NODE);

    // kubelet's verdict is what the metric shows
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(metric(bound.ops, REGISTERED).await, 1.0);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "RegisterPlugin error -- no versions".into(),
        })
        .await
        .unwrap();
    assert_eq!(metric(bound.ops, REGISTERED).await, 0.0);

    // another service on the registration socket is not served
    let mut wrong = NodeClient::new(dial_unix(&registration_socket, timeout).await.unwrap());
    let status = wrong
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

/// The endpoint kubelet is given is the host's path when the agent's container sees the socket
/// elsewhere (`--csi-kubelet-socket`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registration_names_the_socket_as_kubelet_dials_it() {
    let node = node("p256").await;
    let registry = node.dir.path().join("registration");
    let mut config = node.agent_config.clone();
    config.agent_dir = node.dir.path().join("agent-csi-2");
    config.csi_socket = Some(node.dir.path().join("csi/csi.sock"));
    config.csi_registration_dir = Some(registry.clone());
    config.csi_kubelet_socket = Some("/var/lib/kubelet/plugins/csi.athenz.io/csi.sock".into());
    let (bound, _) = athenz_identity_agent::start(config, node.shutdown.clone())
        .await
        .unwrap();
    wait_ready(bound.ops).await;
    let mut registration = RegistrationClient::new(
        dial_unix(
            &registry.join("csi.athenz.io-reg.sock"),
            Some(Duration::from_secs(5)),
        )
        .await
        .unwrap(),
    );
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/csi.athenz.io/csi.sock"
    );
}
