//! CSI v1 wire types (DESIGN.md 4.10), defined once for both ends: the agent's CSI driver serves
//! them (`athenz-csi-driver`) and the testbed's kubelet-faithful caller calls them. Compiled only
//! with the `csi` feature, so binaries that do not speak CSI do not carry gRPC.
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

/// The CSI spec version these messages follow (the last whose `csi.proto` has
/// `VolumeCondition` on `NodeGetVolumeStatsResponse`).
pub const SPEC_VERSION: &str = "1.9.0";
