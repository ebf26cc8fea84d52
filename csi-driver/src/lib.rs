//! `athenz-csi-driver`: the CSI node plugin `csi.athenz.io` (docs/design.md §4.10), a library the
//! node agent serves on its CSI socket.
//!
//! | module | job |
//! |---|---|
//! | [`request`] | checks a `NodePublishVolume` before anything touches a path |
//! | [`driver`] | publish / unpublish / stats of both modes, idempotent, rolled back on failure |
//! | [`rotation`] | files mode: one task per volume re-issues at the refresh time and when the pod's IP changes |
//! | [`service`] | the CSI Identity and Node gRPC services over [`driver::Driver`] |
//! | [`server`] | serving them on a Unix socket (HTTP/2, bounded) |
//! | [`registration`] | kubelet's plugin registration of that socket (the registrar's job) |
//!
//! The agent plugs in through [`Issuer`]: how to issue and re-issue a pod's identity (kubelet
//! lookup, jwt-service, ZTS) stays in the agent, and this crate owns everything CSI and every
//! mount.

#![warn(missing_docs)]

pub mod driver;
pub mod registration;
pub mod request;
pub mod rotation;
pub mod server;
pub mod service;

use athenz_core::issuance::{Issued, Registration};
use athenz_core::secret::Secret;
use athenz_core::volume::{VolumeData, VolumeId};
use std::future::Future;
use std::net::IpAddr;

/// The driver name: the CSIDriver object's name and what pods put in `csi.driver`.
pub const DRIVER_NAME: &str = "csi.athenz.io";

/// Why an identity could not be issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct IssueError {
    /// `true` when trying again later may succeed (ZTS or the jwt-service away, the kubelet
    /// not listing the pod yet); `false` for a refusal.
    pub transient: bool,
    /// What happened.
    pub message: String,
}

/// The pair a files-mode volume holds now, presented to re-issue it.
#[derive(Debug, Clone)]
pub struct CurrentPair {
    /// Private key PEM.
    pub key_pem: Secret,
    /// Certificate PEM (leaf then chain).
    pub cert_pem: String,
}

/// What the agent does for files-mode volumes.
pub trait Issuer: Send + Sync + 'static {
    /// The held lock of one volume.
    type VolumeLock: Send;

    /// Takes the volume's one lock: the driver holds it across a publish or an unpublish and the
    /// rotation across a re-issue, and the agent's own calls for the volume take the same one,
    /// so [`Issuer::issue`] and [`Issuer::reissue`] are always called with it held and never
    /// take another.
    fn lock_volume(&self, id: &VolumeId) -> impl Future<Output = Self::VolumeLock> + Send;

    /// Issues an identity of a volume (registers the instance). `data` is the volume's
    /// `data.json`; the agent keeps its refresh state in the volume dir as for a flex volume.
    fn issue(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        registration: Registration,
    ) -> impl Future<Output = Result<Issued, IssueError>> + Send;

    /// Re-issues it, presenting the pair it holds now (a refresh).
    fn reissue(
        &self,
        id: &VolumeId,
        data: &VolumeData,
        current: &CurrentPair,
    ) -> impl Future<Output = Result<Issued, IssueError>> + Send;

    /// The pod's IP as the kubelet lists it now (`None`: none yet, or not listed).
    fn pod_ip(
        &self,
        data: &VolumeData,
    ) -> impl Future<Output = Result<Option<IpAddr>, IssueError>> + Send;

    /// Whether identities can be issued now (the node's own identity is valid).
    fn ready(&self) -> bool;
}
