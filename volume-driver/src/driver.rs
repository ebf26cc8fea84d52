//! `mount` and `unmount`: the steps of DESIGN.md 4.1, each undone on failure.
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

use crate::mountinfo::MountTable;
use crate::options::MountOptions;
use athenz_core::volume::{VolumeData, VolumeId, VolumePaths, VolumesDir, write_file_atomic, write_json_file};
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

fn step(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> StepError {
    let what = what.to_string();
    move |e| StepError(format!("{what}: {e}"))
}

fn errno_step(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> StepError {
    let what = what.to_string();
    move |e| StepError(format!("{what}: {}", e.desc()))
}

/// What to undo if a later step fails.
enum Undo {
    RemoveTree(PathBuf),
    Unmount(PathBuf),
}

/// The undo log of one mount; rolled back on drop unless committed.
struct Rollback {
    steps: Vec<Undo>,
}

impl Rollback {
    fn new() -> Self {
        Self { steps: Vec::new() }
    }

    fn push(&mut self, undo: Undo) {
        self.steps.push(undo);
    }

    fn commit(mut self) {
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
                Undo::RemoveTree(path) => {
                    let _ = remove_volume_tree(&path);
                }
            }
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
}

/// Whether a volume is fully in place: exactly one mount of each kind and the same pod.
fn complete(table: &MountTable, dir: &Path, paths: &VolumePaths, opts: &MountOptions) -> bool {
    let data: Option<VolumeData> = athenz_core::volume::read_json_file(&paths.data_json).ok();
    table.count(dir) == 1
        && table.count(&dir.join("connect")) == 1
        && table.count(&paths.connect) == 1
        && data.is_some_and(|d| d.pod_uid == opts.pod_uid)
}

/// Mounts the identity volume for `opts` onto `dir` (`dir_text` exactly as kubelet passed it).
pub fn mount_volume(
    host: &HostDirs,
    dir_text: &str,
    opts: &MountOptions,
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
    let key = host
        .volumes
        .load_or_create_node_key()
        .map_err(|e| StepError(e.to_string()))?;
    let id = VolumeId::for_mount_dir(&key, dir_text);
    let paths = host.volumes.volume(&id);

    let table = MountTable::read().map_err(step("reading /proc/self/mountinfo"))?;
    if complete(&table, dir, &paths, opts) {
        return Ok(id);
    }
    // Partly there (an interrupted mount, or a stacked one): clear it and start over.
    if table.is_mounted(dir) || paths.dir.exists() {
        unmount_volume(host, dir_text)?;
    }

    let mut rollback = Rollback::new();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&paths.dir)
        .map_err(step(format!("creating {}", paths.dir.display())))?;
    rollback.push(Undo::RemoveTree(paths.dir.clone()));

    let data = VolumeData {
        namespace: opts.namespace.clone(),
        pod_name: opts.pod_name.clone(),
        pod_uid: opts.pod_uid.clone(),
        service_account: opts.service_account.clone(),
        mount_dir: dir_text.to_owned(),
        read_write: opts.read_write,
        created_at: time::OffsetDateTime::now_utc(),
    };
    write_json_file(&paths.data_json, &data, 0o600).map_err(|e| StepError(e.to_string()))?;
    for d in [&paths.mount, &paths.connect] {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(d)
            .map_err(step(format!("creating {}", d.display())))?;
        // the umask may have narrowed the mode; pods of any uid must traverse these
        fs::set_permissions(d, fs::Permissions::from_mode(0o755))
            .map_err(step(format!("setting the mode of {}", d.display())))?;
    }
    write_file_atomic(&paths.id_file, format!("{id}\n").as_bytes(), 0o444)
        .map_err(|e| StepError(e.to_string()))?;

    bind(&host.agent, &paths.connect, false)?;
    rollback.push(Undo::Unmount(paths.connect.clone()));
    bind(&paths.mount, dir, true)?;
    let pod_connect = dir.join("connect");
    rollback.push(Undo::Unmount(dir.to_owned()));
    rollback.push(Undo::Unmount(pod_connect.clone()));
    remount_read_only(dir)?;
    remount_read_only(&pod_connect)?;
    rollback.commit();
    Ok(id)
}

fn bind(source: &Path, target: &Path, recursive: bool) -> Result<(), StepError> {
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

fn remount_read_only(target: &Path) -> Result<(), StepError> {
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
fn unmount_all(path: &Path) -> Result<(), StepError> {
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

/// Removes a volume directory tree: refuses while anything is mounted below it, removes a symlink
/// as a link (never its target), and never descends through symlinks.
fn remove_volume_tree(path: &Path) -> Result<(), StepError> {
    let table = MountTable::read().map_err(step("reading /proc/self/mountinfo"))?;
    if let Some(busy) = table.under(path).next() {
        return Err(StepError(format!(
            "not removing {}: {} is still mounted",
            path.display(),
            busy.display()
        )));
    }
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(step(format!("inspecting {}", path.display()))(e)),
        Ok(meta) if meta.file_type().is_symlink() || !meta.is_dir() => {
            fs::remove_file(path).map_err(step(format!("removing {}", path.display())))
        }
        // std's remove_dir_all does not follow symlinks inside the tree
        Ok(_) => fs::remove_dir_all(path).map_err(step(format!("removing {}", path.display()))),
    }
}

/// Unmounts the identity volume at `dir_text` and removes its host directory. Success when it is
/// already gone or was never mounted.
pub fn unmount_volume(host: &HostDirs, dir_text: &str) -> Result<VolumeId, StepError> {
    let dir = Path::new(dir_text);
    let key = host
        .volumes
        .load_or_create_node_key()
        .map_err(|e| StepError(e.to_string()))?;
    let id = VolumeId::for_mount_dir(&key, dir_text);
    let paths = host.volumes.volume(&id);
    unmount_all(&dir.join("connect"))?;
    unmount_all(dir)?;
    unmount_all(&paths.connect)?;
    remove_volume_tree(&paths.dir)?;
    Ok(id)
}
