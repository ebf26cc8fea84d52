//! Publish, unpublish and stats of `csi.athenz.io` volumes (docs/design.md §4.10).
//!
//! Publish, for target `<t>` (kubelet made its parent; the driver makes `<t>` and removes it at
//! unpublish, as the CSI spec says):
//! 1. check the request ([`crate::request`]); the volume id is the HMAC of `<t>`, as for flex;
//! 2. same target already published: with the same arguments and complete → OK; with other
//!    arguments → `ALREADY_EXISTS`; partial (an interrupted publish, lost mounts) → cleared;
//! 3. `socket` mode: the flex layout (`athenz_core::volume_mount::steps`);
//!    `files` mode: tmpfs → issue through the agent → write the set → seal the tmpfs
//!    (`athenz_core::volume_mount::seal`) → bind read-only → rotate;
//! 4. any failure undoes every step, the target dir included.
//!
//! A stopping agent hands its volumes over ([`Driver::hand_over`]): rotation stops and every
//! seal is opened, so that the next agent, of any release, can write the next set.
//!
//! One publish or unpublish per target at a time; different targets run in parallel. A files
//! publish that cannot issue now answers `UNAVAILABLE` (kubelet retries) well within kubelet's
//! two-minute call timeout.

use crate::request::{Publish, check_target_path, check_volume_id};
use crate::rotation::{Health, Rotation, write_set};
use crate::{IssueError, Issuer};
use athenz_core::csi::v1::{
    NodeGetVolumeStatsResponse, NodePublishVolumeRequest, VolumeCondition, VolumeUsage,
    volume_usage::Unit,
};
use athenz_core::issuance::Registration;
use athenz_core::volume::{VolumeData, VolumeError, VolumeId, VolumePaths, read_json_file};
use athenz_core::volume_mode::VolumeMode;
use athenz_core::volume_mount::mountinfo::MountTable;
use athenz_core::volume_mount::{
    HostDirs, files_mode, mount_dir, mount_volume, seal, unmount_volume,
};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tonic::Status;

/// Settings of the driver.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This node's name (`NodeGetInfo`'s node_id).
    pub node_id: String,
    /// The volumes and agent dirs.
    pub host: HostDirs,
    /// Size of each files-mode tmpfs.
    pub tmpfs_bytes: u64,
    /// Longest a files-mode publish waits for its first identity before answering
    /// `UNAVAILABLE` (kubelet's own call timeout is 2 minutes).
    pub issue_timeout: Duration,
}

/// The CSI driver's state: its settings, the agent's issuer and the files-mode rotation tasks.
pub struct Driver<I: Issuer> {
    config: DriverConfig,
    issuer: Arc<I>,
    rotation: Arc<Rotation<I>>,
    /// Set by [`Driver::hand_over`]: a publish still in flight then leaves its tmpfs unsealed.
    handed_over: AtomicBool,
}

/// What [`Driver::hand_over`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HandOver {
    /// Files-mode volumes whose tmpfs is now writable.
    pub opened: usize,
    /// Those that could not be opened, each with why.
    pub failed: Vec<String>,
}

fn internal(what: impl std::fmt::Display) -> Status {
    Status::internal(what.to_string())
}

fn issue_status(e: IssueError) -> Status {
    if e.transient {
        Status::unavailable(format!("cannot issue the identity now: {}", e.message))
    } else {
        Status::permission_denied(format!("the identity was refused: {}", e.message))
    }
}

impl<I: Issuer> Driver<I> {
    /// A driver over `issuer`, rotating files-mode volumes with `rotation`.
    pub fn new(config: DriverConfig, issuer: Arc<I>, rotation: Arc<Rotation<I>>) -> Self {
        Self {
            config,
            issuer,
            rotation,
            handed_over: AtomicBool::new(false),
        }
    }

    /// This node's name.
    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    /// Whether identities can be issued now (`Probe`).
    pub fn ready(&self) -> bool {
        self.issuer.ready()
    }

    /// The rotation tasks (for metrics and resume).
    pub fn rotation(&self) -> &Arc<Rotation<I>> {
        &self.rotation
    }

    /// After an agent restart: resumes rotating the files-mode volumes still mounted.
    pub fn resume(&self) -> usize {
        self.rotation.resume(&self.config.host.volumes)
    }

    fn volume_id_of(&self, target: &str) -> Result<(VolumeId, VolumePaths), Status> {
        self.config.host.volume_of(target).map_err(internal)
    }

    /// `NodePublishVolume`.
    pub async fn publish(&self, req: &NodePublishVolumeRequest) -> Result<(), Status> {
        let publish = Publish::from_request(req)?;
        self.config.host.volumes.ensure().map_err(internal)?;
        let (id, paths) = self.volume_id_of(&publish.target)?;
        // the volume's one lock, the agent's: its socket calls and the rotation take it too
        let _serialised = self.issuer.lock_volume(&id).await;
        let target = Path::new(&publish.target);
        match read_json_file::<VolumeData>(&paths.data_json) {
            Ok(existing) if !publish.request.matches(&existing, &publish.target) => {
                return Err(Status::already_exists(format!(
                    "target_path is already published for volume {} of pod {}/{} ({}) in mode {}; unpublish it first",
                    existing
                        .csi
                        .as_ref()
                        .map_or("(flex)", |c| c.volume_id.as_str()),
                    existing.namespace,
                    existing.pod_name,
                    existing.pod_uid,
                    existing.mode().name(),
                )));
            }
            Ok(_) if publish.mode() == VolumeMode::CsiFiles => {
                let table = MountTable::read().map_err(internal)?;
                if files_mode::is_complete(&table, target, &paths) {
                    if !self.rotation.is_tracked(&id) {
                        self.resume_one(&id, &paths)?;
                    }
                    return Ok(());
                }
                // partial (interrupted, or its mounts were lost): start over
                self.rotation.forget(&id);
                unmount_volume(&self.config.host, &publish.target).map_err(internal)?;
            }
            // socket mode: mount_volume itself keeps a complete volume and clears a partial one
            Ok(_) => {}
            Err(VolumeError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(%id, error = %e, "unreadable data.json; clearing the volume");
                unmount_volume(&self.config.host, &publish.target).map_err(internal)?;
            }
        }
        let created = make_target(target)?;
        let result = self.publish_new(&id, &publish).await;
        if result.is_err() && created {
            let _ = std::fs::remove_dir(target);
        }
        result
    }

    async fn publish_new(&self, id: &VolumeId, publish: &Publish) -> Result<(), Status> {
        let host = &self.config.host;
        mount_dir::check_on_disk(Path::new(&publish.target), host.volumes.root(), &host.agent)
            .map_err(|e| Status::invalid_argument(format!("target_path: {e}")))?;
        // a publish is socket or files mode; socket mode is the flex layout
        match publish.mode() {
            VolumeMode::Flex | VolumeMode::CsiSocket => {
                mount_volume(host, &publish.target, &publish.request)
                    .map(|_| ())
                    .map_err(internal)
            }
            VolumeMode::CsiFiles => self.publish_files(id, publish).await,
        }
    }

    async fn publish_files(&self, id: &VolumeId, publish: &Publish) -> Result<(), Status> {
        let pending = files_mode::begin(
            &self.config.host,
            &publish.target,
            &publish.request,
            self.config.tmpfs_bytes,
        )
        .map_err(internal)?;
        let data = pending.data().clone();
        let answer = tokio::time::timeout(
            self.config.issue_timeout,
            self.issuer.issue(id, &data, Registration::First),
        )
        .await
        .map_err(|_| {
            Status::unavailable(format!(
                "issuing the identity took longer than {:?}",
                self.config.issue_timeout
            ))
        })?
        .map_err(issue_status)?;
        let group = publish.request.csi.as_ref().and_then(|c| c.group);
        write_set(pending.files_dir(), &answer.answer, group).map_err(internal)?;
        let files = pending.files_dir().to_owned();
        // under the volume's lock, so that a hand-over either waits for this seal (and opens
        // it) or has begun before it (and this volume stays open)
        if !self.handed_over.load(Ordering::SeqCst) {
            seal::seal(&files).map_err(internal)?;
        }
        pending.publish().map_err(internal)?;
        self.rotation.track(id.clone(), data, files, &answer.cert);
        Ok(())
    }

    /// What a stopping agent does last: stops every rotation (no write of this agent runs or
    /// starts after it) and opens every files-mode volume's seal, each once a publish holding
    /// the volume's lock is done, so that the next agent can write the next set even if its release predates the seal (a
    /// rollback). The next agent of this release seals them again as it resumes them. Call it
    /// once the CSI server has stopped.
    pub async fn hand_over(&self) -> HandOver {
        self.handed_over.store(true, Ordering::SeqCst);
        self.rotation.stop_all();
        let mut outcome = HandOver::default();
        let volumes = match seal::mounted_files_volumes(&self.config.host.volumes) {
            Ok(volumes) => volumes,
            Err(e) => {
                outcome.failed.push(e.0);
                return outcome;
            }
        };
        for (id, files) in volumes {
            drop(self.issuer.lock_volume(&id).await);
            match seal::open(&files) {
                Ok(()) => outcome.opened += 1,
                Err(e) => outcome.failed.push(format!("volume {id}: {}", e.0)),
            }
        }
        outcome
    }

    fn resume_one(&self, id: &VolumeId, paths: &VolumePaths) -> Result<(), Status> {
        let data: VolumeData = read_json_file(&paths.data_json).map_err(internal)?;
        self.rotation
            .track_from_disk(id.clone(), data, &paths.files)
            .map_err(internal)
    }

    /// `NodeUnpublishVolume`: succeeds on a target already gone.
    pub async fn unpublish(&self, volume_id: &str, target: &str) -> Result<(), Status> {
        check_volume_id(volume_id)?;
        check_target_path(target)?;
        let (id, paths) = self.volume_id_of(target)?;
        // the volume's one lock, the agent's: its socket calls and the rotation take it too
        let _serialised = self.issuer.lock_volume(&id).await;
        if let Ok(data) = read_json_file::<VolumeData>(&paths.data_json)
            && let Some(csi) = &data.csi
            && csi.volume_id != volume_id
        {
            return Err(Status::failed_precondition(format!(
                "target_path holds volume {}, not {volume_id}",
                csi.volume_id
            )));
        }
        self.rotation.forget(&id);
        unmount_volume(&self.config.host, target).map_err(internal)?;
        match std::fs::remove_dir(target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal(format!("removing the target {target}: {e}"))),
        }
    }

    /// `NodeGetVolumeStats`: the tmpfs's usage (or the target's filesystem in socket mode) and
    /// the volume's condition.
    pub fn stats(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        check_volume_id(volume_id)?;
        if volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        // A path that is no possible target (relative, `..`, too long) names no published volume:
        // the CSI spec's answer for "volume_id does not exist on volume_path" is NOT_FOUND, and
        // csi-sanity checks exactly that. The form is still checked before the path is used.
        mount_dir::check_form(volume_path).map_err(|e| {
            Status::not_found(format!(
                "no volume {volume_id} is published at volume_path ({e})"
            ))
        })?;
        let (id, paths) = self.volume_id_of(volume_path)?;
        let data: VolumeData = read_json_file(&paths.data_json).map_err(|_| {
            Status::not_found(format!("no volume {volume_id} is published at volume_path"))
        })?;
        let csi = data
            .csi
            .as_ref()
            .filter(|c| c.volume_id == volume_id)
            .ok_or_else(|| {
                Status::not_found(format!("no volume {volume_id} is published at volume_path"))
            })?;
        let usage = usage(Path::new(volume_path))?;
        let now = time::OffsetDateTime::now_utc();
        let abnormal = match csi.mode {
            VolumeMode::CsiFiles => match self.rotation.health(&id) {
                Some(health) => health.abnormal(now),
                None => Some("the agent is not rotating this volume".to_owned()),
            },
            VolumeMode::Flex | VolumeMode::CsiSocket => socket_health(&paths, now),
        };
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(VolumeCondition {
                abnormal: abnormal.is_some(),
                message: abnormal.unwrap_or_else(|| "the identity is valid".to_owned()),
            }),
        })
    }

    /// The health of a files-mode volume (tests and status).
    pub fn health(&self, id: &VolumeId) -> Option<Health> {
        self.rotation.health(id)
    }
}

/// Socket mode: the pod's SIA holds the certificate; the agent knows its expiry from the
/// refresh state.
fn socket_health(paths: &VolumePaths, now: time::OffsetDateTime) -> Option<String> {
    match read_json_file::<athenz_core::volume::VolumeState>(&paths.state_json) {
        Ok(state) if state.cert_expiry <= now => Some(format!(
            "the certificate expired at {} (the pod's SIA has not refreshed it)",
            state.cert_expiry
        )),
        _ => None,
    }
}

/// Makes the target dir (0750, as kubelet makes its parent); `true` if this call made it.
fn make_target(target: &Path) -> Result<bool, Status> {
    match std::fs::DirBuilder::new().mode(0o750).create(target) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Status::failed_precondition(format!(
                "target_path's parent does not exist (kubelet makes it): {}",
                target.display()
            )))
        }
        Err(e) => Err(internal(format!("creating {}: {e}", target.display()))),
    }
}

/// Bytes and inodes of the filesystem at `path` (older kubelets reject a reply without usage).
fn usage(path: &Path) -> Result<Vec<VolumeUsage>, Status> {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|e| Status::not_found(format!("volume_path: {}", e.desc())))?;
    let block = i64::try_from(stat.fragment_size()).unwrap_or(i64::MAX);
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let total = as_i64(stat.blocks()).saturating_mul(block);
    let available = as_i64(stat.blocks_available()).saturating_mul(block);
    let free = as_i64(stat.blocks_free()).saturating_mul(block);
    let inodes = as_i64(stat.files());
    let inodes_free = as_i64(stat.files_free());
    Ok(vec![
        VolumeUsage {
            available,
            total,
            used: total.saturating_sub(free),
            unit: Unit::Bytes as i32,
        },
        VolumeUsage {
            available: inodes_free,
            total: inodes,
            used: inodes.saturating_sub(inodes_free),
            unit: Unit::Inodes as i32,
        },
    ])
}
