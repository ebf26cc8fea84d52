//! CSI v1 wire types (docs/design.md §4.10), defined once for both ends: the agent's CSI driver
//! serves them (`athenz-csi-driver`) and the testbed's kubelet-faithful caller calls them. Compiled
//! only with the `csi` feature, so binaries that do not speak CSI do not carry gRPC.
//!
//! [`v1`] holds the messages and the generated `identity_server`/`node_server` (service traits
//! and tower services) and `identity_client`/`node_client` modules, built by `build.rs` with
//! tonic-build's manual builder (no protoc): the gRPC paths are `/csi.v1.Identity/<Method>` and
//! `/csi.v1.Node/<Method>`, as in the spec.

/// `csi.v1`: the messages and services.
pub mod v1 {
    pub use super::messages::*;

    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    mod generated {
        include!(concat!(env!("OUT_DIR"), "/csi.v1.Identity.rs"));
        include!(concat!(env!("OUT_DIR"), "/csi.v1.Node.rs"));
    }
    pub use generated::*;
}

mod messages;

/// kubelet's plugin registration API, `pluginregistration` (`k8s.io/kubelet`'s
/// `pkg/apis/pluginregistration/v1/api.proto`): a plugin serves `Registration` on a socket in
/// kubelet's `plugins_registry` directory; kubelet asks `GetInfo` (type, name, the plugin's own
/// endpoint, API versions), validates the plugin, and reports the outcome with
/// `NotifyRegistrationStatus`. The node-driver-registrar sidecar does this for most CSI drivers;
/// the agent does it itself (docs/design.md §4.10). Names and field numbers are the proto's.
pub mod pluginregistration {
    #![allow(missing_docs)]

    /// `PluginInfo.type` of a CSI driver.
    pub const CSI_PLUGIN: &str = "CSIPlugin";

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InfoRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginInfo {
        #[prost(string, tag = "1")]
        pub r#type: String,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(string, tag = "3")]
        pub endpoint: String,
        #[prost(string, repeated, tag = "4")]
        pub supported_versions: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegistrationStatus {
        #[prost(bool, tag = "1")]
        pub plugin_registered: bool,
        #[prost(string, tag = "2")]
        pub error: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegistrationStatusResponse {}

    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    mod generated {
        include!(concat!(
            env!("OUT_DIR"),
            "/pluginregistration.Registration.rs"
        ));
    }
    pub use generated::*;

    #[cfg(test)]
    mod tests {
        use super::*;
        use prost::Message;

        /// The field numbers and wire types of api.proto, written out byte by byte: a number
        /// changed here would no longer read what kubelet sends or write what it reads.
        #[test]
        fn messages_have_the_protos_field_numbers() {
            let info = PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "a".into(),
                endpoint: "/s".into(),
                supported_versions: vec!["1.0.0".into()],
            };
            let mut expected = vec![0x0a, 9];
            expected.extend_from_slice(b"CSIPlugin");
            expected.extend_from_slice(&[0x12, 1, b'a', 0x1a, 2, b'/', b's', 0x22, 5]);
            expected.extend_from_slice(b"1.0.0");
            assert_eq!(info.encode_to_vec(), expected);
            let status = RegistrationStatus::decode(&[0x08, 1, 0x12, 2, b'n', b'o'][..]).unwrap();
            assert!(status.plugin_registered);
            assert_eq!(status.error, "no");
        }
    }
}

/// The CSI spec version these messages follow (the last whose `csi.proto` has
/// `VolumeCondition` on `NodeGetVolumeStatsResponse`).
pub const SPEC_VERSION: &str = "1.9.0";
