//! The CSI v1 messages of the Identity and Node services this project serves, written from the
//! spec's `csi.proto` (github.com/container-storage-interface/spec): the names and field numbers
//! are the spec's, so any CSI client (kubelet, csi-sanity, the node-driver-registrar) reads them.
//! Only what the two services use is here; unknown fields a newer kubelet sends are skipped by
//! prost, as protobuf requires. A test round-trips every message through bindings generated from
//! the official `csi.proto` by a third party (`bpfman-csi`), so a wrong number cannot pass.
//!
//! Field documentation is the spec's; it is not repeated on every field.
#![allow(missing_docs)]

use std::collections::HashMap;

// ---- Identity service ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    #[prost(map = "string, string", tag = "3")]
    pub manifest: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    #[prost(oneof = "plugin_capability::Type", tags = "1")]
    pub r#type: Option<plugin_capability::Type>,
}

pub mod plugin_capability {
    #![allow(missing_docs)]

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        Service(Service),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Service {
        #[prost(enumeration = "service::Type", tag = "1")]
        pub r#type: i32,
    }

    pub mod service {
        #![allow(missing_docs)]

        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            Unknown = 0,
            ControllerService = 1,
            VolumeAccessibilityConstraints = 2,
            GroupControllerService = 3,
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    /// `google.protobuf.BoolValue`: absent means ready.
    #[prost(message, optional, tag = "1")]
    pub ready: Option<bool>,
}

// ---- Node service ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    /// `csi_secret`: never logged.
    #[prost(map = "string, string", tag = "7")]
    pub secrets: HashMap<String, String>,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub volume_path: String,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsResponse {
    #[prost(message, repeated, tag = "1")]
    pub usage: Vec<VolumeUsage>,
    #[prost(message, optional, tag = "2")]
    pub volume_condition: Option<VolumeCondition>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeUsage {
    #[prost(int64, tag = "1")]
    pub available: i64,
    #[prost(int64, tag = "2")]
    pub total: i64,
    #[prost(int64, tag = "3")]
    pub used: i64,
    #[prost(enumeration = "volume_usage::Unit", tag = "4")]
    pub unit: i32,
}

pub mod volume_usage {
    #![allow(missing_docs)]

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Unit {
        Unknown = 0,
        Bytes = 1,
        Inodes = 2,
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCondition {
    #[prost(bool, tag = "1")]
    pub abnormal: bool,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<NodeServiceCapability>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeServiceCapability {
    #[prost(oneof = "node_service_capability::Type", tags = "1")]
    pub r#type: Option<node_service_capability::Type>,
}

pub mod node_service_capability {
    #![allow(missing_docs)]

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        Rpc(Rpc),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Rpc {
        #[prost(enumeration = "rpc::Type", tag = "1")]
        pub r#type: i32,
    }

    pub mod rpc {
        #![allow(missing_docs)]

        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            Unknown = 0,
            StageUnstageVolume = 1,
            GetVolumeStats = 2,
            ExpandVolume = 3,
            VolumeCondition = 4,
            SingleNodeMultiWriter = 5,
            VolumeMountGroup = 6,
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
    #[prost(message, optional, tag = "3")]
    pub accessible_topology: Option<Topology>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Topology {
    #[prost(map = "string, string", tag = "1")]
    pub segments: HashMap<String, String>,
}

// ---- shared ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    #[prost(oneof = "volume_capability::AccessType", tags = "1, 2")]
    pub access_type: Option<volume_capability::AccessType>,
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<volume_capability::AccessMode>,
}

pub mod volume_capability {
    #![allow(missing_docs)]

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AccessType {
        #[prost(message, tag = "1")]
        Block(BlockVolume),
        #[prost(message, tag = "2")]
        Mount(MountVolume),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BlockVolume {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MountVolume {
        #[prost(string, tag = "1")]
        pub fs_type: String,
        #[prost(string, repeated, tag = "2")]
        pub mount_flags: Vec<String>,
        /// The pod's fsGroup, when the driver has `VOLUME_MOUNT_GROUP`.
        #[prost(string, tag = "3")]
        pub volume_mount_group: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AccessMode {
        #[prost(enumeration = "access_mode::Mode", tag = "1")]
        pub mode: i32,
    }

    pub mod access_mode {
        #![allow(missing_docs)]

        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Mode {
            Unknown = 0,
            SingleNodeWriter = 1,
            SingleNodeReaderOnly = 2,
            MultiNodeReaderOnly = 3,
            MultiNodeSingleWriter = 4,
            MultiNodeMultiWriter = 5,
            SingleNodeSingleWriter = 6,
            SingleNodeMultiWriter = 7,
        }
    }
}
