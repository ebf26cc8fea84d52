//! The CSI driver's validation of kubelet's requests (docs/design.md §4.10), from the protobuf
//! bytes gRPC would hand it: the first byte picks NodePublishVolume, NodeUnpublishVolume or
//! NodeGetVolumeStats, the rest is the message.
#![no_main]

use athenz_core::csi::v1::{
    NodeGetVolumeStatsRequest, NodePublishVolumeRequest, NodeUnpublishVolumeRequest,
};
use athenz_core::volume_mount::mount_dir;
use athenz_csi_driver::request::{Publish, check_target_path, check_volume_id};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&which, message)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(request) = NodePublishVolumeRequest::decode(message)
                && Publish::from_request(&request).is_ok()
            {
                // what passing promised: a checked id and target, and a read-only volume
                assert!(check_volume_id(&request.volume_id).is_ok());
                assert!(check_target_path(&request.target_path).is_ok());
                assert!(request.readonly);
            }
        }
        1 => {
            if let Ok(request) = NodeUnpublishVolumeRequest::decode(message) {
                let _ = check_volume_id(&request.volume_id)
                    .and_then(|()| check_target_path(&request.target_path));
            }
        }
        _ => {
            if let Ok(request) = NodeGetVolumeStatsRequest::decode(message) {
                let _ = check_volume_id(&request.volume_id);
                let _ = mount_dir::check_form(&request.volume_path);
            }
        }
    }
});
