//! With the `csi` feature, generates the CSI Identity and Node gRPC services and kubelet's plugin
//! Registration service (server and client stubs) from the method lists below with tonic-build's manual builder: the messages are
//! hand-written in `src/csi/messages.rs`, so no `.proto` file and no `protoc` are needed.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CSI").is_none() {
        return;
    }
    let method = |name: &str, route: &str, input: &str, output: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::csi::v1::{input}"))
            .output_type(format!("crate::csi::v1::{output}"))
            .codec_path("tonic_prost::ProstCodec")
            .build()
    };
    let identity = tonic_build::manual::Service::builder()
        .name("Identity")
        .package("csi.v1")
        .method(method(
            "get_plugin_info",
            "GetPluginInfo",
            "GetPluginInfoRequest",
            "GetPluginInfoResponse",
        ))
        .method(method(
            "get_plugin_capabilities",
            "GetPluginCapabilities",
            "GetPluginCapabilitiesRequest",
            "GetPluginCapabilitiesResponse",
        ))
        .method(method("probe", "Probe", "ProbeRequest", "ProbeResponse"))
        .build();
    let node = tonic_build::manual::Service::builder()
        .name("Node")
        .package("csi.v1")
        .method(method(
            "node_publish_volume",
            "NodePublishVolume",
            "NodePublishVolumeRequest",
            "NodePublishVolumeResponse",
        ))
        .method(method(
            "node_unpublish_volume",
            "NodeUnpublishVolume",
            "NodeUnpublishVolumeRequest",
            "NodeUnpublishVolumeResponse",
        ))
        .method(method(
            "node_get_volume_stats",
            "NodeGetVolumeStats",
            "NodeGetVolumeStatsRequest",
            "NodeGetVolumeStatsResponse",
        ))
        .method(method(
            "node_get_capabilities",
            "NodeGetCapabilities",
            "NodeGetCapabilitiesRequest",
            "NodeGetCapabilitiesResponse",
        ))
        .method(method(
            "node_get_info",
            "NodeGetInfo",
            "NodeGetInfoRequest",
            "NodeGetInfoResponse",
        ))
        .build();
    // kubelet's plugin registration (k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto,
    // package `pluginregistration`): the agent registers its CSI socket with the kubelet itself
    let registration = tonic_build::manual::Service::builder()
        .name("Registration")
        .package("pluginregistration")
        .method(
            tonic_build::manual::Method::builder()
                .name("get_info")
                .route_name("GetInfo")
                .input_type("crate::csi::pluginregistration::InfoRequest")
                .output_type("crate::csi::pluginregistration::PluginInfo")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .method(
            tonic_build::manual::Method::builder()
                .name("notify_registration_status")
                .route_name("NotifyRegistrationStatus")
                .input_type("crate::csi::pluginregistration::RegistrationStatus")
                .output_type("crate::csi::pluginregistration::RegistrationStatusResponse")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new()
        .build_transport(false)
        .compile(&[identity, node, registration]);
}
