//! The CSI files-mode layout (docs/design.md §4.10): the agent, not a process in the pod, writes
//! the credential set, so the pod sees a directory of files instead of the agent socket.
//!
//! ```text
//! <volumes-dir>/<id>/            0700; <id> = HMAC-SHA256(node key, target path)
//!   data.json                    0600: the pod and the CSI publish (mode files)
//!   state.json                   0600: the agent's refresh state
//!   files/                       a tmpfs of its own (size-capped, nosuid, nodev, noexec)
//!     ..data -> ..<timestamp>/   the credential set, swapped as one (core::files)
//! <target>                       files/ bound read-only
//! ```
//!
//! Publishing is two-phase because the first set must be written before the pod may start:
//! [`begin`] makes the directory, `data.json` and the tmpfs; the caller writes the set into
//! [`PendingFilesVolume::files_dir`]; [`PendingFilesVolume::publish`] binds it at the target.
//! Dropping a pending volume (the issue failed) undoes everything. The tmpfs keeps keys off disk
//! and bounds what a volume may hold; it is a mount of its own so that unmounting the target
//! never depends on what the pod did.
//!
//! A later release may mount the tmpfs on `<id>/` itself, records and `files/` inside it, so
//! that a volume costs the node's disk one directory instead of two and three files (see
//! docs/benchmarks.md, "Where the agent's CPU goes per files-mode pod"). This release writes the
//! layout above but already recognises, resumes and removes that one ([`tmpfs_mounted`],
//! [`is_complete`], [`super::unmount_volume`], and [`begin`] clearing the empty directory such a
//! volume leaves after a reboot), so that a rollback from that release to this one keeps working.

use super::mountinfo::MountTable;
use super::steps::{
    HostDirs, Rollback, StepError, Undo, VolumeRequest, bind, errno_step, remount_read_only, step,
};
use crate::volume::{VolumeData, VolumeId, VolumePaths, write_new_file};
use nix::mount::{MsFlags, mount};
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Default size of a files-mode tmpfs: a credential set is a few KiB (two are kept while a
/// reader may still be on the old one); role certificates and tokens add a few more.
pub const DEFAULT_FILES_TMPFS_BYTES: u64 = 1024 * 1024;

/// Most inodes in a files-mode tmpfs (two sets of a few files, their links, role files).
const TMPFS_INODES: u32 = 256;

/// The steps of [`begin`] and [`PendingFilesVolume::publish`] after which a failure must roll
/// back; named so that tests can make each one fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilesStep {
    /// `volumes/<id>`, `data.json` and `files/` made.
    Dirs,
    /// The tmpfs mounted on `files/`.
    Tmpfs,
    /// `files/` bound at the target.
    Bind,
    /// The target remounted read-only.
    Remount,
}

fn checkpoint(step: FilesStep, fail_at: Option<FilesStep>) -> Result<(), StepError> {
    if fail_at == Some(step) {
        return Err(StepError(format!("injected failure after {step:?}")));
    }
    Ok(())
}

/// A files-mode volume being published: its tmpfs is mounted, nothing is at the target yet.
/// Dropped without [`publish`](Self::publish), it is removed again.
pub struct PendingFilesVolume {
    id: VolumeId,
    paths: VolumePaths,
    data: VolumeData,
    target: PathBuf,
    rollback: Rollback,
    fail_at: Option<FilesStep>,
}

impl std::fmt::Debug for PendingFilesVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFilesVolume")
            .field("id", &self.id)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Makes the host side of a files-mode volume for `request` at `target_text` (exactly as
/// kubelet passed it; the directory must exist).
pub fn begin(
    host: &HostDirs,
    target_text: &str,
    request: &VolumeRequest,
    tmpfs_bytes: u64,
) -> Result<PendingFilesVolume, StepError> {
    begin_failing(host, target_text, request, tmpfs_bytes, None)
}

/// [`begin`], failing on purpose after `fail_at` (tests of the rollback).
pub fn begin_failing(
    host: &HostDirs,
    target_text: &str,
    request: &VolumeRequest,
    tmpfs_bytes: u64,
    fail_at: Option<FilesStep>,
) -> Result<PendingFilesVolume, StepError> {
    let (id, paths) = host.volume_of(target_text)?;
    // a volume whose tmpfs held its records (the later layout above) leaves its directory
    // empty after a reboot; rmdir removes nothing else (a directory with anything in it stays,
    // and creating it below fails, naming it)
    match fs::remove_dir(&paths.dir) {
        Err(e)
            if e.kind() != std::io::ErrorKind::NotFound
                && !matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) =>
        {
            return Err(step(format!("removing the empty {}", paths.dir.display()))(
                e,
            ));
        }
        _ => {}
    }
    let mut rollback = Rollback::new();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&paths.dir)
        .map_err(step(format!("creating {}", paths.dir.display())))?;
    rollback.push(Undo::RemoveVolume(paths.clone()));
    let data = request.data(target_text);
    let json = serde_json::to_vec_pretty(&data).map_err(|e| StepError(e.to_string()))?;
    write_new_file(&paths.data_json, &json, 0o600).map_err(|e| StepError(e.to_string()))?;
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&paths.files)
        .map_err(step(format!("creating {}", paths.files.display())))?;
    checkpoint(FilesStep::Dirs, fail_at)?;
    let options = format!("size={tmpfs_bytes},nr_inodes={TMPFS_INODES},mode=0755");
    mount(
        Some("athenz-identity"),
        &paths.files,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
    .map_err(errno_step(format!(
        "mounting a tmpfs on {}",
        paths.files.display()
    )))?;
    rollback.push(Undo::Unmount(paths.files.clone()));
    // the tmpfs's root has exactly `mode=0755` (the umask applies to files made in it, not to
    // the mount's root): pods of any uid traverse it
    checkpoint(FilesStep::Tmpfs, fail_at)?;
    Ok(PendingFilesVolume {
        id,
        paths,
        data,
        target: PathBuf::from(target_text),
        rollback,
        fail_at,
    })
}

impl PendingFilesVolume {
    /// The volume id.
    pub fn id(&self) -> &VolumeId {
        &self.id
    }

    /// The volume's host paths.
    pub fn paths(&self) -> &VolumePaths {
        &self.paths
    }

    /// What its `data.json` says (as written, so the caller need not read it back).
    pub fn data(&self) -> &VolumeData {
        &self.data
    }

    /// Where the credential set is written (the tmpfs).
    pub fn files_dir(&self) -> &Path {
        &self.paths.files
    }

    /// Binds the written set read-only at the target; the volume is then in place.
    pub fn publish(mut self) -> Result<VolumeId, StepError> {
        bind(&self.paths.files, &self.target, false)?;
        self.rollback.push(Undo::Unmount(self.target.clone()));
        checkpoint(FilesStep::Bind, self.fail_at)?;
        remount_read_only(&self.target)?;
        checkpoint(FilesStep::Remount, self.fail_at)?;
        let Self { id, rollback, .. } = self;
        rollback.commit();
        Ok(id)
    }
}

/// Whether a files-mode volume is fully in place at `target`: its tmpfs mounted once (on
/// `files/`, or on the volume directory in the later layout) and bound once at the target.
pub fn is_complete(table: &MountTable, target: &Path, paths: &VolumePaths) -> bool {
    table.count(target) == 1 && table.count(&paths.files) + table.count(&paths.dir) == 1
}

/// Whether a files-mode volume's tmpfs is still mounted, in either layout: after a reboot it is
/// not, and the volume is left for kubelet's next publish.
pub fn tmpfs_mounted(table: &MountTable, paths: &VolumePaths) -> bool {
    table.is_mounted(&paths.files) || table.is_mounted(&paths.dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::CsiVolume;
    use crate::volume_mode::VolumeMode;

    fn request() -> VolumeRequest {
        super::super::test_support::request(Some(CsiVolume {
            volume_id: "csi-0123".into(),
            mode: VolumeMode::CsiFiles,
            group: None,
            ip_san: false,
        }))
    }

    /// A failure after any step leaves no mount and no directory; a complete publish is one
    /// read-only tmpfs view, removed by the common unmount (real mounts: needs root).
    #[test]
    fn every_step_rolls_back_and_the_unmount_removes_all() {
        let (_tmp, root, host) = super::super::test_support::host();
        let target = root.join("mount");
        fs::create_dir(&target).unwrap();
        let target_text = target.to_str().unwrap();
        let volume_dirs = || super::super::test_support::volume_dirs(&host);
        for at in [
            FilesStep::Dirs,
            FilesStep::Tmpfs,
            FilesStep::Bind,
            FilesStep::Remount,
        ] {
            let result = begin_failing(&host, target_text, &request(), 65536, Some(at)).and_then(
                |pending| {
                    fs::write(pending.files_dir().join("probe"), b"x").unwrap();
                    pending.publish()
                },
            );
            assert!(result.unwrap_err().0.contains("injected"));
            assert_eq!(
                MountTable::read().unwrap().under(&root).count(),
                0,
                "{at:?} left mounts"
            );
            assert_eq!(volume_dirs(), 0, "{at:?} left a volume dir");
        }
        // a pending volume dropped (the issue failed) is removed too
        drop(begin(&host, target_text, &request(), 65536).unwrap());
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 0);
        assert_eq!(volume_dirs(), 0);

        let pending = begin(&host, target_text, &request(), 65536).unwrap();
        let on_disk: crate::volume::VolumeData =
            crate::volume::read_json_file(&pending.paths().data_json).unwrap();
        assert_eq!(&on_disk, pending.data(), "data() is what data.json holds");
        fs::write(pending.files_dir().join("service.cert.pem"), b"cert").unwrap();
        let paths = pending.paths().clone();
        pending.publish().unwrap();
        let table = MountTable::read().unwrap();
        assert!(is_complete(&table, &target, &paths));
        assert_eq!(fs::read(target.join("service.cert.pem")).unwrap(), b"cert");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&target).unwrap().permissions())
                & 0o7777,
            0o755,
            "pods of any uid traverse the volume"
        );
        let err = fs::write(target.join("planted"), b"x").unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EROFS),
            "the pod's view is read-only"
        );
        // the tmpfs is size-capped
        let big = vec![0u8; 70_000];
        assert!(
            fs::write(paths.files.join("big"), &big).is_err(),
            "over the cap"
        );
        super::super::unmount_volume(&host, target_text).unwrap();
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 0);
        assert_eq!(volume_dirs(), 0);
        // and again, on what is already gone
        super::super::unmount_volume(&host, target_text).unwrap();
    }

    /// The later layout (the tmpfs on the volume directory, records and `files/` inside it),
    /// made here by hand as that release would: recognised as complete and mounted, removed by
    /// the common unmount; after a reboot (its mounts gone) the empty directory it leaves does
    /// not stop a new publish (real mounts: needs root).
    #[test]
    fn the_later_layout_is_recognised_and_removed() {
        let (_tmp, root, host) = super::super::test_support::host();
        let target = root.join("mount");
        fs::create_dir(&target).unwrap();
        let target_text = target.to_str().unwrap();
        let (_, paths) = host.volume_of(target_text).unwrap();
        let make_later_layout = || {
            fs::create_dir(&paths.dir).unwrap();
            mount(
                Some("athenz-identity"),
                &paths.dir,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=65536,mode=0700"),
            )
            .unwrap();
            let json = serde_json::to_vec(&request().data(target_text)).unwrap();
            fs::write(&paths.data_json, json).unwrap();
            fs::write(&paths.state_json, b"{}").unwrap();
            fs::write(&paths.status_json, b"{}").unwrap();
            fs::create_dir(&paths.files).unwrap();
            fs::write(paths.files.join("service.cert.pem"), b"cert").unwrap();
            bind(&paths.files, &target, false).unwrap();
            remount_read_only(&target).unwrap();
        };

        make_later_layout();
        let table = MountTable::read().unwrap();
        assert!(is_complete(&table, &target, &paths));
        assert!(tmpfs_mounted(&table, &paths));
        assert_eq!(fs::read(target.join("service.cert.pem")).unwrap(), b"cert");
        super::super::unmount_volume(&host, target_text).unwrap();
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 0);
        assert_eq!(super::super::test_support::volume_dirs(&host), 0);

        // a reboot: both mounts gone, the volume directory left empty on the node's disk
        make_later_layout();
        nix::mount::umount(&target).unwrap();
        nix::mount::umount(&paths.dir).unwrap();
        assert!(paths.dir.is_dir());
        let table = MountTable::read().unwrap();
        assert!(!is_complete(&table, &target, &paths));
        assert!(!tmpfs_mounted(&table, &paths));
        let pending = begin(&host, target_text, &request(), 65536).unwrap();
        pending.publish().unwrap();
        assert!(is_complete(&MountTable::read().unwrap(), &target, &paths));
        super::super::unmount_volume(&host, target_text).unwrap();

        // a volume directory with anything in it is never removed by a publish
        fs::create_dir(&paths.dir).unwrap();
        fs::write(paths.dir.join("kept"), b"x").unwrap();
        let err = begin(&host, target_text, &request(), 65536).unwrap_err();
        assert!(err.0.contains(&paths.dir.display().to_string()), "{err:?}");
        assert_eq!(fs::read(paths.dir.join("kept")).unwrap(), b"x");
    }
}
