//! The node's file system and sockets: identity volumes and their mounts, atomic files and file
//! sets, and which pod a caller on the agent's socket is in (peer binding).

pub mod files;
pub mod peer;
pub mod pod_info;
pub mod volume;
pub mod volume_mode;
pub mod volume_mount;
