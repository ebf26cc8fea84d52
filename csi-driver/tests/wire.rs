//! The hand-written CSI messages against bindings generated from the official `csi.proto` by a
//! third party (`bpfman-csi`): every field set, encoded by one, decoded by the other, both ways.
//! A wrong field number, type or enum value fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::csi::v1 as ours;
use bpfman_csi::v1 as theirs;
use prost::Message as _;
use prost012::Message as _;
use std::collections::HashMap;

fn there<T: prost012::Message + Default>(m: &impl prost::Message) -> T {
    T::decode(m.encode_to_vec().as_slice()).unwrap()
}

fn back<T: prost::Message + Default>(m: &impl prost012::Message) -> T {
    T::decode(m.encode_to_vec().as_slice()).unwrap()
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn identity_messages() {
    let info = ours::GetPluginInfoResponse {
        name: "csi.athenz.io".into(),
        vendor_version: "0.1.0".into(),
        manifest: map(&[("commit", "abc")]),
    };
    let t: theirs::GetPluginInfoResponse = there(&info);
    assert_eq!(
        (
            t.name.as_str(),
            t.vendor_version.as_str(),
            t.manifest.get("commit").map(String::as_str)
        ),
        ("csi.athenz.io", "0.1.0", Some("abc"))
    );
    assert_eq!(back::<ours::GetPluginInfoResponse>(&t), info);

    let caps = ours::GetPluginCapabilitiesResponse {
        capabilities: vec![ours::PluginCapability {
            r#type: Some(ours::plugin_capability::Type::Service(
                ours::plugin_capability::Service {
                    r#type: ours::plugin_capability::service::Type::VolumeAccessibilityConstraints
                        as i32,
                },
            )),
        }],
    };
    let t: theirs::GetPluginCapabilitiesResponse = there(&caps);
    match &t.capabilities[0].r#type {
        Some(theirs::plugin_capability::Type::Service(s)) => assert_eq!(
            s.r#type,
            theirs::plugin_capability::service::Type::VolumeAccessibilityConstraints as i32
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(back::<ours::GetPluginCapabilitiesResponse>(&t), caps);

    for ready in [Some(true), Some(false), None] {
        let probe = ours::ProbeResponse { ready };
        let t: theirs::ProbeResponse = there(&probe);
        assert_eq!(t.ready, ready);
        assert_eq!(back::<ours::ProbeResponse>(&t), probe);
    }
}

fn capability(mode: i32, group: &str) -> ours::VolumeCapability {
    ours::VolumeCapability {
        access_type: Some(ours::volume_capability::AccessType::Mount(
            ours::volume_capability::MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec!["ro".into(), "noexec".into()],
                volume_mount_group: group.into(),
            },
        )),
        access_mode: Some(ours::volume_capability::AccessMode { mode }),
    }
}

#[test]
fn publish_and_unpublish() {
    let publish = ours::NodePublishVolumeRequest {
        volume_id: "csi-abc".into(),
        publish_context: map(&[("p", "1")]),
        staging_target_path: "/staging".into(),
        target_path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount".into(),
        volume_capability: Some(capability(7, "2000")),
        readonly: true,
        secrets: map(&[("s", "hidden")]),
        volume_context: map(&[("csi.storage.k8s.io/pod.name", "web"), ("mode", "files")]),
    };
    let t: theirs::NodePublishVolumeRequest = there(&publish);
    assert_eq!(t.volume_id, "csi-abc");
    assert_eq!(t.publish_context, publish.publish_context);
    assert_eq!(t.staging_target_path, "/staging");
    assert_eq!(t.target_path, publish.target_path);
    assert!(t.readonly);
    assert_eq!(t.secrets, publish.secrets);
    assert_eq!(t.volume_context, publish.volume_context);
    let cap = t.volume_capability.as_ref().unwrap();
    assert_eq!(
        cap.access_mode.as_ref().unwrap().mode,
        theirs::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32
    );
    match &cap.access_type {
        Some(theirs::volume_capability::AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "ext4");
            assert_eq!(m.mount_flags, ["ro", "noexec"]);
            assert_eq!(m.volume_mount_group, "2000");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(back::<ours::NodePublishVolumeRequest>(&t), publish);
    // every access mode means the same in both
    for (ours_mode, theirs_mode) in [
        (
            1,
            theirs::volume_capability::access_mode::Mode::SingleNodeWriter,
        ),
        (
            2,
            theirs::volume_capability::access_mode::Mode::SingleNodeReaderOnly,
        ),
        (
            5,
            theirs::volume_capability::access_mode::Mode::MultiNodeMultiWriter,
        ),
        (
            6,
            theirs::volume_capability::access_mode::Mode::SingleNodeSingleWriter,
        ),
        (
            7,
            theirs::volume_capability::access_mode::Mode::SingleNodeMultiWriter,
        ),
    ] {
        let ours_name = ours::volume_capability::access_mode::Mode::try_from(ours_mode).unwrap();
        assert_eq!(format!("{ours_name:?}"), format!("{theirs_mode:?}"));
        assert_eq!(ours_mode, theirs_mode as i32);
    }
    let block = ours::VolumeCapability {
        access_type: Some(ours::volume_capability::AccessType::Block(
            ours::volume_capability::BlockVolume {},
        )),
        access_mode: None,
    };
    let t: theirs::VolumeCapability = there(&block);
    assert!(matches!(
        t.access_type,
        Some(theirs::volume_capability::AccessType::Block(_))
    ));

    let unpublish = ours::NodeUnpublishVolumeRequest {
        volume_id: "csi-abc".into(),
        target_path: "/t".into(),
    };
    let t: theirs::NodeUnpublishVolumeRequest = there(&unpublish);
    assert_eq!(
        (t.volume_id.as_str(), t.target_path.as_str()),
        ("csi-abc", "/t")
    );
    assert_eq!(back::<ours::NodeUnpublishVolumeRequest>(&t), unpublish);
}

#[test]
fn stats_capabilities_and_info() {
    let req = ours::NodeGetVolumeStatsRequest {
        volume_id: "csi-abc".into(),
        volume_path: "/t".into(),
        staging_target_path: "/s".into(),
    };
    let t: theirs::NodeGetVolumeStatsRequest = there(&req);
    assert_eq!(
        (
            t.volume_id.as_str(),
            t.volume_path.as_str(),
            t.staging_target_path.as_str()
        ),
        ("csi-abc", "/t", "/s")
    );
    let stats = ours::NodeGetVolumeStatsResponse {
        usage: vec![
            ours::VolumeUsage {
                available: 10,
                total: 20,
                used: 5,
                unit: ours::volume_usage::Unit::Bytes as i32,
            },
            ours::VolumeUsage {
                available: 1,
                total: 2,
                used: 1,
                unit: ours::volume_usage::Unit::Inodes as i32,
            },
        ],
        volume_condition: Some(ours::VolumeCondition {
            abnormal: true,
            message: "the certificate expired".into(),
        }),
    };
    let t: theirs::NodeGetVolumeStatsResponse = there(&stats);
    assert_eq!(
        (
            t.usage[0].available,
            t.usage[0].total,
            t.usage[0].used,
            t.usage[0].unit
        ),
        (10, 20, 5, theirs::volume_usage::Unit::Bytes as i32)
    );
    assert_eq!(t.usage[1].unit, theirs::volume_usage::Unit::Inodes as i32);
    let condition = t.volume_condition.as_ref().unwrap();
    assert!(condition.abnormal);
    assert_eq!(condition.message, "the certificate expired");
    assert_eq!(back::<ours::NodeGetVolumeStatsResponse>(&t), stats);

    use ours::node_service_capability::rpc::Type as Ours;
    use theirs::node_service_capability::rpc::Type as Theirs;
    let pairs = [
        (Ours::StageUnstageVolume, Theirs::StageUnstageVolume),
        (Ours::GetVolumeStats, Theirs::GetVolumeStats),
        (Ours::ExpandVolume, Theirs::ExpandVolume),
        (Ours::VolumeCondition, Theirs::VolumeCondition),
        (Ours::SingleNodeMultiWriter, Theirs::SingleNodeMultiWriter),
        (Ours::VolumeMountGroup, Theirs::VolumeMountGroup),
    ];
    let caps = ours::NodeGetCapabilitiesResponse {
        capabilities: pairs
            .iter()
            .map(|(o, _)| ours::NodeServiceCapability {
                r#type: Some(ours::node_service_capability::Type::Rpc(
                    ours::node_service_capability::Rpc { r#type: *o as i32 },
                )),
            })
            .collect(),
    };
    let t: theirs::NodeGetCapabilitiesResponse = there(&caps);
    for (cap, (_, expected)) in t.capabilities.iter().zip(pairs) {
        match &cap.r#type {
            Some(theirs::node_service_capability::Type::Rpc(r)) => {
                assert_eq!(r.r#type, expected as i32)
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(back::<ours::NodeGetCapabilitiesResponse>(&t), caps);

    let info = ours::NodeGetInfoResponse {
        node_id: "node-1".into(),
        max_volumes_per_node: 7,
        accessible_topology: Some(ours::Topology {
            segments: map(&[("topology.kubernetes.io/zone", "z1")]),
        }),
    };
    let t: theirs::NodeGetInfoResponse = there(&info);
    assert_eq!((t.node_id.as_str(), t.max_volumes_per_node), ("node-1", 7));
    assert_eq!(
        t.accessible_topology.as_ref().unwrap().segments,
        info.accessible_topology.as_ref().unwrap().segments
    );
    assert_eq!(back::<ours::NodeGetInfoResponse>(&t), info);
}

/// What a newer kubelet may send that this driver does not know is skipped, not refused.
#[test]
fn unknown_fields_are_skipped() {
    let theirs_req = theirs::NodeGetVolumeStatsRequest {
        volume_id: "v".into(),
        volume_path: "/p".into(),
        staging_target_path: String::new(),
    };
    let mut bytes = theirs_req.encode_to_vec();
    // field 15, varint 1: unknown to both
    bytes.extend_from_slice(&[0x78, 0x01]);
    let decoded = ours::NodeGetVolumeStatsRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.volume_id, "v");
    // and malformed bytes are an error, not a panic
    assert!(ours::NodePublishVolumeRequest::decode(&[0x0a, 0xff][..]).is_err());
}
