//! Mounting identity volumes on the host (docs/design.md §4.1, §4.10), shared by the flex driver
//! and the CSI driver the agent serves:
//!
//! - [`steps`]: the flex layout (`data.json`, `mount/id`, the agent dir bound at `connect`, the
//!   read-only view), each step undone on failure, and the unmount of either layout;
//! - [`files_mode`]: the CSI files layout (a size-capped tmpfs the agent writes the credential
//!   set into, bound read-only at the target);
//! - [`seal`]: that tmpfs read-only for every mount of it but during the agent's writes;
//! - [`mount_dir`]: the checks on the directory kubelet names;
//! - [`mountinfo`]: the mount table, from which idempotency and cleanup are decided.

pub mod files_mode;
pub mod mount_dir;
pub mod mountinfo;
pub mod seal;
pub mod steps;

pub use steps::{HostDirs, StepError, VolumeRequest, mount_volume, unmount_volume};

/// What the mount tests share: a host layout in a fresh temporary dir (they make real mounts, so
/// they need root, which CI has).
#[cfg(test)]
pub(crate) mod test_support {
    use super::HostDirs;
    use crate::volume::VolumesDir;
    use std::fs;
    use std::path::PathBuf;

    /// A temporary dir (kept alive by the caller), its canonical path, and volumes and agent
    /// dirs inside it.
    pub fn host() -> (tempfile::TempDir, PathBuf, HostDirs) {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test makes real mounts and must run as root (CI does)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let host = HostDirs::new(VolumesDir::new(root.join("volumes")), root.join("agent"));
        fs::create_dir(&host.agent).unwrap();
        host.volumes.ensure().unwrap();
        (tmp, root, host)
    }

    /// The sample pod's volume request, flex (`csi: None`) or a CSI publish.
    pub fn request(csi: Option<crate::volume::CsiVolume>) -> super::VolumeRequest {
        super::VolumeRequest {
            pod: crate::pod_info::PodInfo {
                namespace: "media-sports".into(),
                pod_name: "web".into(),
                pod_uid: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c".into(),
                service_account: "web".into(),
            },
            read_write: false,
            csi,
        }
    }

    /// Volume dirs in the volumes dir (its dot-files are the driver's own).
    pub fn volume_dirs(host: &HostDirs) -> usize {
        fs::read_dir(host.volumes.root())
            .unwrap()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count()
    }
}
