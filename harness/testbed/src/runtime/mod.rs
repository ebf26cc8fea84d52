//! Pods' processes as a real container runtime makes them (docs/design.md §5): runc or crun
//! from the distribution's packages run each container from an OCI bundle inside a pod sandbox,
//! in kubelet's cgroupfs layout, so the agent's peer check reads cgroup paths a runtime wrote,
//! not ours. `process` is the stand-in for hosts without a runtime: a plain process that a
//! shell moves into a kubelet-shaped cgroup ([`crate::cgroups`]).

pub mod bundle;
pub mod oci;
pub mod pod;

pub use bundle::{Rootfs, VolumeMount};
pub use oci::OciRuntime;
pub use pod::{Backoff, ContainerSpec, Finished, Pod, Started};

use std::path::Path;
use std::time::Duration;
use thiserror::Error;

/// How a pod's processes are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A plain process moved into a kubelet-shaped cgroup by a shell (no namespaces).
    Process,
    /// runc: containers in a sandbox, as containerd and CRI-O run them.
    Runc,
    /// crun, the same way.
    Crun,
}

impl RuntimeKind {
    /// Its name on the command line and in `stack.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Runc => "runc",
            Self::Crun => "crun",
        }
    }

    /// The one to use when none is asked for, and why: runc when it is installed and this
    /// process is root (it makes namespaces and cgroups), else `process`.
    pub fn default_here() -> (Self, String) {
        if !nix::unistd::geteuid().is_root() {
            return (
                Self::Process,
                "not root: a container runtime needs root here".into(),
            );
        }
        match oci::on_path("runc") {
            Some(path) => (Self::Runc, format!("{} is installed", path.display())),
            None => (
                Self::Process,
                "runc is not installed (apt-get install runc)".into(),
            ),
        }
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RuntimeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "process" => Ok(Self::Process),
            "runc" => Ok(Self::Runc),
            "crun" => Ok(Self::Crun),
            other => Err(format!("runtime {other:?}: use runc, crun or process")),
        }
    }
}

/// A pod's QoS class: where kubelet puts its cgroup (cgroupfs driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    /// `kubepods/pod<uid>`.
    Guaranteed,
    /// `kubepods/burstable/pod<uid>`.
    Burstable,
    /// `kubepods/besteffort/pod<uid>`.
    BestEffort,
}

impl Qos {
    /// The directories between the cgroup root and `pod<uid>`, with a trailing `/`.
    pub fn kubepods_dir(self) -> &'static str {
        match self {
            Self::Guaranteed => "kubepods/",
            Self::Burstable => "kubepods/burstable/",
            Self::BestEffort => "kubepods/besteffort/",
        }
    }
}

/// Why the runtime could not do what was asked; each names the step.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The runtime is not there.
    #[error("container runtime: {0}")]
    Unavailable(String),
    /// Something asked of it is not valid.
    #[error("container runtime: {0}")]
    Invalid(String),
    /// A file or directory.
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    /// A program could not be started or waited for.
    #[error("{what}: {reason}")]
    Spawn { what: String, reason: String },
    /// The runtime refused or failed; its output.
    #[error("{what} failed: {output}")]
    Failed {
        /// The step.
        what: String,
        /// What it said.
        output: String,
    },
    /// A step took too long.
    #[error("{what}: no answer within {after:?}")]
    Timeout {
        /// The step.
        what: String,
        /// Its limit.
        after: Duration,
    },
}

impl RuntimeError {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    }
}
