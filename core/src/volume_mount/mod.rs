//! Mounting identity volumes on the host (DESIGN.md 4.1, 4.10), shared by the flex driver and the
//! CSI driver the agent serves:
//!
//! - [`steps`]: the flex layout (`data.json`, `mount/id`, the agent dir bound at `connect`, the
//!   read-only view), each step undone on failure, and the unmount of either layout;
//! - [`files_mode`]: the CSI files layout (a size-capped tmpfs the agent writes the credential
//!   set into, bound read-only at the target);
//! - [`mount_dir`]: the checks on the directory kubelet names;
//! - [`mountinfo`]: the mount table, from which idempotency and cleanup are decided.

pub mod files_mode;
pub mod mount_dir;
pub mod mountinfo;
pub mod steps;

pub use steps::{HostDirs, StepError, VolumeRequest, mount_volume, unmount_volume};
