//! `mount` and `unmount`: the steps of docs/design.md §4.1, each undone on failure.
//!
//! Mount, for volume id `<id>` of mount dir `<dir>`:
//! 1. `volumes/<id>/` (0700) with `data.json` (0600), `mount/` (0755), `mount/id` (0444) and
//!    `mount/connect/`;
//! 2. bind the agent dir onto `mount/connect`;
//! 3. bind `mount` recursively onto `<dir>` (the pod's view: `<dir>` and `<dir>/connect`);
//! 4. remount both mounts of the pod's view read-only, nosuid, nodev, noexec (a read-only flag on
//!    the first bind is ignored by Linux; connecting to a socket still works).
//!
//! Unmount undoes them in reverse — `<dir>/connect`, `<dir>`, `mount/connect` — treating "not
//! mounted" as done at every step (kubelet's shared propagation may have removed a mount already),
//! and removes `volumes/<id>` only when nothing is mounted below it, without following symlinks.

use super::mountinfo::MountTable;
use crate::pod_info::PodInfo;
use crate::volume::{
    CsiVolume, NodeKey, VolumeData, VolumeId, VolumePaths, VolumesDir, write_new_file,
};
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How many stacked mounts one unmount step removes at most (a stack means an earlier bug or a
/// race; more than this is not ours to fix).
const MAX_STACKED: usize = 8;

/// A failed step, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StepError(pub String);

pub(super) fn step(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> StepError {
    let what = what.to_string();
    move |e| StepError(format!("{what}: {e}"))
}

pub(super) fn errno_step(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> StepError {
    let what = what.to_string();
    move |e| StepError(format!("{what}: {}", e.desc()))
}

/// What to undo if a later step fails.
pub(super) enum Undo {
    RemoveVolume(VolumePaths),
    Unmount(PathBuf),
}

/// The undo log of one mount; rolled back on drop unless committed.
pub(super) struct Rollback {
    steps: Vec<Undo>,
}

impl Rollback {
    pub(super) fn new() -> Self {
        Self { steps: Vec::new() }
    }

    pub(super) fn push(&mut self, undo: Undo) {
        self.steps.push(undo);
    }

    pub(super) fn commit(mut self) {
        self.steps.clear();
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        while let Some(undo) = self.steps.pop() {
            match undo {
                Undo::Unmount(path) => {
                    let _ = unmount_all(&path);
                }
                Undo::RemoveVolume(paths) => {
                    let _ = remove_volume_dir(&paths);
                }
            }
        }
    }
}

/// What a volume is mounted for: the pod, and how the kubelet asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    /// The pod.
    pub pod: PodInfo,
    /// Whether kubelet asked for read-write (the pod's view is read-only regardless).
    pub read_write: bool,
    /// The CSI publish, when the CSI driver mounts it.
    pub csi: Option<CsiVolume>,
}

impl VolumeRequest {
    /// Whether `data` (a volume's `data.json`) records this same request for `mount_dir`.
    pub fn matches(&self, data: &VolumeData, mount_dir: &str) -> bool {
        data.namespace == self.pod.namespace
            && data.pod_name == self.pod.pod_name
            && data.pod_uid == self.pod.pod_uid
            && data.service_account == self.pod.service_account
            && data.read_write == self.read_write
            && data.mount_dir == mount_dir
            && data.csi == self.csi
    }

    pub(super) fn data(&self, mount_dir: &str) -> VolumeData {
        VolumeData {
            namespace: self.pod.namespace.clone(),
            pod_name: self.pod.pod_name.clone(),
            pod_uid: self.pod.pod_uid.clone(),
            service_account: self.pod.service_account.clone(),
            mount_dir: mount_dir.to_owned(),
            read_write: self.read_write,
            created_at: time::OffsetDateTime::now_utc(),
            csi: self.csi.clone(),
        }
    }
}

/// The host directories the driver works in.
#[derive(Debug, Clone)]
pub struct HostDirs {
    /// The volumes dir.
    pub volumes: VolumesDir,
    /// The agent dir (bound into every pod).
    pub agent: PathBuf,
    /// The node key once read: the agent asks for volume ids several times per volume, the key
    /// never changes while the node runs, and re-reading it cost four syscalls each time.
    node_key: NodeKeyCache,
}

/// The node key, read on first use and kept; shared by clones of one [`HostDirs`].
#[derive(Clone, Default)]
struct NodeKeyCache(std::sync::Arc<std::sync::OnceLock<NodeKey>>);

impl std::fmt::Debug for NodeKeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the key itself
        let state = if self.0.get().is_some() {
            "read"
        } else {
            "not read yet"
        };
        write!(f, "NodeKeyCache({state})")
    }
}

impl HostDirs {
    /// The volumes dir and the agent dir of this node.
    pub fn new(volumes: VolumesDir, agent: PathBuf) -> Self {
        Self {
            volumes,
            agent,
            node_key: NodeKeyCache::default(),
        }
    }

    /// The node key: read (or made) on first use, then kept.
    fn node_key(&self) -> Result<&NodeKey, StepError> {
        if let Some(key) = self.node_key.0.get() {
            return Ok(key);
        }
        let key = self
            .volumes
            .load_or_create_node_key()
            .map_err(|e| StepError(e.to_string()))?;
        // a concurrent first caller read the same file: whichever is kept is the same key
        Ok(self.node_key.0.get_or_init(|| key))
    }

    /// The id and paths of the volume mounted at `dir_text` (the node key is made on first use).
    pub fn volume_of(&self, dir_text: &str) -> Result<(VolumeId, VolumePaths), StepError> {
        let id = VolumeId::for_mount_dir(self.node_key()?, dir_text);
        let paths = self.volumes.volume(&id);
        Ok((id, paths))
    }
}

/// Whether a volume is fully in place: exactly one mount of each kind and the same pod.
fn complete(table: &MountTable, dir: &Path, paths: &VolumePaths, request: &VolumeRequest) -> bool {
    let data: Option<VolumeData> = crate::volume::read_json_file(&paths.data_json).ok();
    table.count(dir) == 1
        && table.count(&dir.join("connect")) == 1
        && table.count(&paths.connect) == 1
        && data.is_some_and(|d| d.pod_uid == request.pod.pod_uid && d.csi == request.csi)
}

/// The steps of a mount after which a failure must roll back; named so that tests can make each
/// one fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Dirs,
    BindAgent,
    BindPod,
    RemountPod,
    RemountConnect,
}

fn checkpoint(step: Step, fail_at: Option<Step>) -> Result<(), StepError> {
    if fail_at == Some(step) {
        return Err(StepError(format!("injected failure after {step:?}")));
    }
    Ok(())
}

/// Mounts the identity volume for `request` onto `dir` (`dir_text` exactly as kubelet passed
/// it). A complete volume for the same pod is left as it is; anything partial is cleared first.
pub fn mount_volume(
    host: &HostDirs,
    dir_text: &str,
    request: &VolumeRequest,
) -> Result<VolumeId, StepError> {
    mount_volume_failing(host, dir_text, request, None)
}

pub(crate) fn mount_volume_failing(
    host: &HostDirs,
    dir_text: &str,
    request: &VolumeRequest,
    fail_at: Option<Step>,
) -> Result<VolumeId, StepError> {
    let dir = Path::new(dir_text);
    let agent_meta =
        fs::metadata(&host.agent).map_err(step(format!("agent dir {}", host.agent.display())))?;
    if !agent_meta.is_dir() {
        return Err(StepError(format!(
            "agent dir {} is not a directory",
            host.agent.display()
        )));
    }
    let (id, paths) = host.volume_of(dir_text)?;

    // Fast path: nothing of ours is there (no volume dir, no `id` in the mount dir), so this is a
    // fresh mount and the mount table — hundreds of lines on a busy node, read in milliseconds —
    // need not be consulted.
    let ours_present = paths.dir.exists() || fs::symlink_metadata(dir.join("id")).is_ok();
    if ours_present {
        let table = MountTable::read().map_err(step("reading /proc/self/mountinfo"))?;
        if complete(&table, dir, &paths, request) {
            return Ok(id);
        }
        // Partly there (an interrupted mount, or a stacked one): clear it and start over.
        unmount_volume(host, dir_text)?;
    }

    let mut rollback = Rollback::new();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&paths.dir)
        .map_err(step(format!("creating {}", paths.dir.display())))?;
    rollback.push(Undo::RemoveVolume(paths.clone()));

    let data = request.data(dir_text);
    let json = serde_json::to_vec_pretty(&data).map_err(|e| StepError(e.to_string()))?;
    // The volume dir is new and nobody reads it before this mount reports success, so the files
    // are written directly: no temporary names, no fsync (an interrupted mount is cleared by the
    // next one, which finds it incomplete).
    write_new_file(&paths.data_json, &json, 0o600).map_err(|e| StepError(e.to_string()))?;
    for d in [&paths.mount, &paths.connect] {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(d)
            .map_err(step(format!("creating {}", d.display())))?;
        // the umask may have narrowed the mode; pods of any uid must traverse these
        fs::set_permissions(d, fs::Permissions::from_mode(0o755))
            .map_err(step(format!("setting the mode of {}", d.display())))?;
    }
    write_new_file(&paths.id_file, format!("{id}\n").as_bytes(), 0o444)
        .map_err(|e| StepError(e.to_string()))?;
    checkpoint(Step::Dirs, fail_at)?;

    bind(&host.agent, &paths.connect, false)?;
    rollback.push(Undo::Unmount(paths.connect.clone()));
    checkpoint(Step::BindAgent, fail_at)?;
    bind(&paths.mount, dir, true)?;
    let pod_connect = dir.join("connect");
    rollback.push(Undo::Unmount(dir.to_owned()));
    rollback.push(Undo::Unmount(pod_connect.clone()));
    checkpoint(Step::BindPod, fail_at)?;
    remount_read_only(dir)?;
    checkpoint(Step::RemountPod, fail_at)?;
    remount_read_only(&pod_connect)?;
    checkpoint(Step::RemountConnect, fail_at)?;
    rollback.commit();
    Ok(id)
}

pub(super) fn bind(source: &Path, target: &Path, recursive: bool) -> Result<(), StepError> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(source), target, None::<&str>, flags, None::<&str>).map_err(errno_step(format!(
        "binding {} onto {}",
        source.display(),
        target.display()
    )))
}

pub(super) fn remount_read_only(target: &Path) -> Result<(), StepError> {
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(errno_step(format!(
        "remounting {} read-only",
        target.display()
    )))
}

/// Unmounts everything stacked on `path`; "not mounted" and "no such path" are success.
pub(super) fn unmount_all(path: &Path) -> Result<(), StepError> {
    for _ in 0..MAX_STACKED {
        match umount2(path, MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => continue,
            Err(Errno::EINVAL | Errno::ENOENT) => return Ok(()),
            Err(Errno::EBUSY) => {
                // Something in the pod still holds it; detach so the pod's view goes away and the
                // kernel frees it when the last user leaves.
                match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
                    Ok(()) => continue,
                    Err(Errno::EINVAL | Errno::ENOENT) => return Ok(()),
                    Err(e) => return Err(errno_step(format!("unmounting {}", path.display()))(e)),
                }
            }
            Err(e) => return Err(errno_step(format!("unmounting {}", path.display()))(e)),
        }
    }
    Err(StepError(format!(
        "{} still has mounts stacked after {MAX_STACKED} unmounts",
        path.display()
    )))
}

/// Removes a volume directory without ever deleting through a mount: plain files in
/// `volumes/<id>` and `mount/` are unlinked (unlink never follows a symlink), and the directories
/// are removed with `rmdir`, which fails with EBUSY on a mount point and ENOTEMPTY on anything
/// unexpected — so if the agent dir is somehow still bound onto `connect`, its contents survive and
/// the unmount reports why. A symlink in place of `volumes/<id>` is removed as a link.
pub(super) fn remove_volume_dir(paths: &VolumePaths) -> Result<(), StepError> {
    match fs::symlink_metadata(&paths.dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(step(format!("inspecting {}", paths.dir.display()))(e)),
        Ok(meta) if !meta.is_dir() => {
            return fs::remove_file(&paths.dir)
                .map_err(step(format!("removing {}", paths.dir.display())));
        }
        Ok(_) => {}
    }
    if fs::symlink_metadata(&paths.mount).is_ok_and(|m| m.is_dir()) {
        unlink_plain_files(&paths.mount)?;
        rmdir_if_present(&paths.connect)?;
        rmdir_if_present(&paths.mount)?;
    }
    // files mode: the tmpfs is unmounted by now, so this is the empty directory under it
    rmdir_if_present(&paths.files)?;
    unlink_plain_files(&paths.dir)?;
    rmdir_if_present(&paths.dir)
}

fn unlink_plain_files(dir: &Path) -> Result<(), StepError> {
    let entries = fs::read_dir(dir).map_err(step(format!("listing {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(step(format!("listing {}", dir.display())))?;
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir {
            let path = entry.path();
            fs::remove_file(&path).map_err(step(format!("removing {}", path.display())))?;
        }
    }
    Ok(())
}

fn rmdir_if_present(dir: &Path) -> Result<(), StepError> {
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(step(format!("removing {}", dir.display()))),
    }
}

/// Unmounts the identity volume at `dir_text` (either layout) and removes its host directory.
/// Success when it is already gone or was never mounted.
pub fn unmount_volume(host: &HostDirs, dir_text: &str) -> Result<VolumeId, StepError> {
    let dir = Path::new(dir_text);
    let (id, paths) = host.volume_of(dir_text)?;
    unmount_all(&dir.join("connect"))?;
    unmount_all(dir)?;
    unmount_all(&paths.connect)?;
    unmount_all(&paths.files)?;
    // files mode's later layout: the tmpfs on the volume directory, records inside it
    unmount_all(&paths.dir)?;
    remove_volume_dir(&paths)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> VolumeRequest {
        super::super::test_support::request(None)
    }

    /// The node key is read once per `HostDirs` (and shared by its clones): a later loss of the
    /// file changes no volume id, and a fresh `HostDirs` makes a new key as the driver would.
    #[test]
    fn the_node_key_is_read_once_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let host = HostDirs::new(
            VolumesDir::new(tmp.path().join("volumes")),
            tmp.path().join("agent"),
        );
        let (first, _) = host.volume_of("/var/lib/kubelet/pods/a/volumes/x").unwrap();
        fs::remove_file(host.volumes.node_key_path()).unwrap();
        let clone = host.clone();
        let (again, _) = clone
            .volume_of("/var/lib/kubelet/pods/a/volumes/x")
            .unwrap();
        assert_eq!(first, again);
        assert!(
            !host.volumes.node_key_path().exists(),
            "the file was read again"
        );
        assert!(format!("{host:?}").contains("NodeKeyCache(read)"));

        let fresh = HostDirs::new(host.volumes.clone(), host.agent.clone());
        let (other, _) = fresh
            .volume_of("/var/lib/kubelet/pods/a/volumes/x")
            .unwrap();
        assert_ne!(first, other, "a new node key gives new ids");
    }

    /// A failure after any step leaves no mount and no directory (real mounts: needs root).
    #[test]
    fn every_step_rolls_back() {
        let (_tmp, root, host) = super::super::test_support::host();
        let dir = root.join("pod");
        fs::create_dir(&dir).unwrap();
        let dir_text = dir.to_str().unwrap();
        let volume_dirs = || super::super::test_support::volume_dirs(&host);
        for step in [
            Step::Dirs,
            Step::BindAgent,
            Step::BindPod,
            Step::RemountPod,
            Step::RemountConnect,
        ] {
            let err = mount_volume_failing(&host, dir_text, &opts(), Some(step)).unwrap_err();
            assert!(err.0.contains("injected"), "{err}");
            let table = MountTable::read().unwrap();
            assert_eq!(table.under(&root).count(), 0, "{step:?} left mounts");
            assert_eq!(volume_dirs(), 0, "{step:?} left a volume dir");
        }
        mount_volume(&host, dir_text, &opts()).unwrap();
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 3);
        unmount_volume(&host, dir_text).unwrap();
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 0);
        assert_eq!(volume_dirs(), 0);
    }

    /// Removal never deletes through a mount: with the agent dir still bound onto `connect`,
    /// removal fails and the agent's files survive.
    #[test]
    fn removal_never_deletes_through_a_mount() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let volumes = VolumesDir::new(root.join("volumes"));
        volumes.ensure().unwrap();
        let agent = root.join("agent");
        fs::create_dir(&agent).unwrap();
        fs::write(agent.join("agent.sock"), b"precious").unwrap();
        let id = VolumeId::parse(&"a".repeat(64)).unwrap();
        let paths = volumes.volume(&id);
        fs::create_dir_all(&paths.connect).unwrap();
        fs::write(&paths.data_json, b"{}").unwrap();
        bind(&agent, &paths.connect, false).unwrap();
        let err = remove_volume_dir(&paths).unwrap_err();
        assert!(err.0.contains("connect"), "{err}");
        assert_eq!(fs::read(agent.join("agent.sock")).unwrap(), b"precious");
        unmount_all(&paths.connect).unwrap();
        remove_volume_dir(&paths).unwrap();
        assert!(!paths.dir.exists());
        assert_eq!(fs::read(agent.join("agent.sock")).unwrap(), b"precious");
        // a symlink in place of the volume dir is removed as a link, its target untouched
        std::os::unix::fs::symlink(&agent, &paths.dir).unwrap();
        remove_volume_dir(&paths).unwrap();
        assert!(agent.join("agent.sock").exists());
    }
}
