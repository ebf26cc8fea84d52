//! The seal on a files-mode tmpfs (docs/design.md §4.10): its superblock is read-only but for
//! the agent's own writes, so no mount of it takes a write, whatever the pod spec says.
//!
//! A read-only flag on the pod's bind alone is not enough: the container runtime binds the
//! target into each container and remounts that bind read-write when the pod spec says
//! `readOnly: false` (kubelet mounts it read-only only when `csi.readOnly` or the mount's own
//! `readOnly` says so). A read-only superblock refuses the write whatever a mount's own flag
//! says, for root in the container too.
//!
//! The seal is the agent's alone: a release before it does not open it, so an agent that stops
//! gracefully opens every seal ([`mounted_files_volumes`], [`open`]) and the next agent closes them again as it
//! resumes its volumes. That keeps a rollback to such a release working; the price is that the
//! volumes are writable (to root in a pod that asked for `readOnly: false`) while the node's
//! agent is being replaced.

use super::mountinfo::MountTable;
use super::steps::{StepError, errno_step, step};
use crate::volume::{RecordedVolume, VolumeId, VolumesDir};
use crate::volume_mode::VolumeMode;
use nix::mount::{MsFlags, mount};
use std::fs;
use std::path::{Path, PathBuf};

/// Whether a tmpfs's superblock takes writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Superblock {
    ReadOnly,
    Writable,
}

/// Remounts the tmpfs on `files` (without `MS_BIND`: the superblock, so every mount of it) with
/// the flags it was made with and `state`.
fn remount(files: &Path, state: Superblock) -> Result<(), StepError> {
    let mut flags =
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if state == Superblock::ReadOnly {
        flags |= MsFlags::MS_RDONLY;
    }
    let what = match state {
        Superblock::ReadOnly => "sealing (remounting read-only)",
        Superblock::Writable => "opening (remounting writable)",
    };
    mount(None::<&str>, files, None::<&str>, flags, None::<&str>).map_err(errno_step(format!(
        "{what} the tmpfs on {}",
        files.display()
    )))
}

/// Whether `dir` is the root of a mount: its device differs from its parent's. The seal applies
/// only to a `files/` that is a tmpfs of its own; the later layout's `files/` (inside a tmpfs on
/// the volume directory that also holds the agent's records) is left as it is.
fn is_own_mount(dir: &Path) -> Result<bool, StepError> {
    use std::os::unix::fs::MetadataExt;
    let own = fs::metadata(dir).map_err(step(format!("reading {}", dir.display())))?;
    let parent = fs::metadata(dir.join(".."))
        .map_err(step(format!("reading the parent of {}", dir.display())))?;
    Ok(own.dev() != parent.dev())
}

/// Seals the tmpfs on `files`: from now on no mount of it takes a write.
pub fn seal(files: &Path) -> Result<(), StepError> {
    if is_own_mount(files)? {
        remount(files, Superblock::ReadOnly)?;
    }
    Ok(())
}

/// Opens the seal on the tmpfs on `files` (for a release that does not know it).
pub fn open(files: &Path) -> Result<(), StepError> {
    if is_own_mount(files)? {
        remount(files, Superblock::Writable)?;
    }
    Ok(())
}

/// Whether the filesystem holding `files` refuses writes (its superblock, or the mount `files`
/// is on, is read-only).
pub fn is_sealed(files: &Path) -> Result<bool, StepError> {
    let stat = nix::sys::statvfs::statvfs(files).map_err(errno_step(format!(
        "reading the state of {}",
        files.display()
    )))?;
    Ok(stat.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// Runs `write` (the agent's write of a volume's set) with the tmpfs on `files` open, and seals
/// it again afterwards whether or not the write succeeded: the tmpfs takes writes only for the
/// write's few milliseconds. A volume an earlier release published, never sealed, is sealed by
/// its first write.
pub fn write_sealed<T>(
    files: &Path,
    write: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    if !is_own_mount(files).map_err(|e| e.0)? {
        return write();
    }
    remount(files, Superblock::Writable).map_err(|e| e.0)?;
    let written = write();
    let sealed = remount(files, Superblock::ReadOnly);
    match (written, sealed) {
        (Ok(value), Ok(())) => Ok(value),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(format!("written, but {}", e.0)),
    }
}

/// The files-mode volumes recorded in `volumes` whose tmpfs is mounted (a reboot leaves none),
/// each with its `files/`: those a stopping agent opens the seal of, so that any release, an
/// earlier one included, can write the next set.
pub fn mounted_files_volumes(volumes: &VolumesDir) -> Result<Vec<(VolumeId, PathBuf)>, StepError> {
    let table =
        MountTable::read().map_err(|e| StepError(format!("reading the mount table: {e}")))?;
    let recorded = volumes
        .recorded()
        .map_err(step(format!("listing {}", volumes.root().display())))?;
    Ok(recorded
        .filter(|v| v.data.mode() == VolumeMode::CsiFiles && table.is_mounted(&v.paths.files))
        .map(|RecordedVolume { id, paths, .. }| (id, paths.files))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::files_mode::{begin, is_complete};
    use super::super::steps::{bind, unmount_all};
    use super::*;
    use crate::volume::CsiVolume;

    fn request(mode: VolumeMode) -> super::super::VolumeRequest {
        super::super::test_support::request(Some(CsiVolume {
            volume_id: "csi-0123".into(),
            mode,
            group: None,
            ip_san: false,
        }))
    }

    /// Binds `target` at a new directory and remounts that bind read-write, as the container
    /// runtime does for a mount whose pod spec says `readOnly: false`.
    fn runtime_bind(root: &Path, target: &Path) -> std::path::PathBuf {
        let bound = root.join("runtime-bind");
        fs::create_dir(&bound).unwrap();
        bind(target, &bound, false).unwrap();
        mount(
            None::<&str>,
            &bound,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT,
            None::<&str>,
        )
        .unwrap();
        bound
    }

    fn refused(result: std::io::Result<()>, what: &str) {
        assert_eq!(
            result.unwrap_err().raw_os_error(),
            Some(libc::EROFS),
            "{what}"
        );
    }

    /// Sealed, no mount of the tmpfs takes a write, not even a read-write bind of it; the
    /// agent's writes open it and seal it again, failed or not; an opened seal takes writes
    /// again (real mounts: needs root).
    #[test]
    fn a_sealed_tmpfs_refuses_every_mount_but_for_the_agents_writes() {
        let (_tmp, root, host) = super::super::test_support::host();
        let target = root.join("mount");
        fs::create_dir(&target).unwrap();
        let target_text = target.to_str().unwrap();
        let pending = begin(&host, target_text, &request(VolumeMode::CsiFiles), 65536).unwrap();
        fs::write(pending.files_dir().join("service.cert.pem"), b"cert").unwrap();
        let files = pending.files_dir().to_owned();
        seal(&files).unwrap();
        let paths = pending.paths().clone();
        pending.publish().unwrap();
        assert!(is_complete(&MountTable::read().unwrap(), &target, &paths));
        assert!(is_sealed(&files).unwrap());

        let writable_bind = runtime_bind(&root, &target);
        let cert = writable_bind.join("service.cert.pem");
        refused(fs::write(writable_bind.join("planted"), b"x"), "a new file");
        refused(
            fs::create_dir(writable_bind.join("planted.d")),
            "a directory",
        );
        refused(fs::write(&cert, b"x"), "a change");
        refused(fs::remove_file(&cert), "a removal");
        refused(fs::rename(&cert, writable_bind.join("moved")), "a rename");
        refused(fs::write(files.join("x"), b"x"), "the agent's own mount");
        assert_eq!(fs::read(&cert).unwrap(), b"cert", "nothing changed");

        // the agent's write goes in, and the tmpfs is sealed again
        write_sealed(&files, || {
            fs::write(files.join("service.cert.pem"), b"new").map_err(|e| e.to_string())
        })
        .unwrap();
        assert_eq!(fs::read(&cert).unwrap(), b"new");
        refused(
            fs::write(writable_bind.join("planted"), b"x"),
            "sealed again",
        );
        // a failed write seals it again too, and says why it failed
        let failed = write_sealed(&files, || -> Result<(), String> { Err("no".into()) });
        assert_eq!(failed.unwrap_err(), "no");
        refused(
            fs::write(writable_bind.join("planted"), b"x"),
            "sealed after a failure",
        );
        // the cap holds while it is open
        let over = write_sealed(&files, || {
            fs::write(files.join("big"), vec![0u8; 70_000]).map_err(|e| e.to_string())
        });
        assert!(over.is_err(), "over the cap");
        write_sealed(&files, || {
            fs::remove_file(files.join("big")).map_err(|e| e.to_string())
        })
        .unwrap();

        // opened (for a release that does not know the seal): writable through any mount but
        // the pod's read-only bind
        open(&files).unwrap();
        assert!(!is_sealed(&files).unwrap());
        fs::write(files.join("by-an-earlier-release"), b"x").unwrap();
        refused(
            fs::write(target.join("planted"), b"x"),
            "the pod's own view",
        );
        unmount_all(&writable_bind).unwrap();
        super::super::unmount_volume(&host, target_text).unwrap();
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 0);
    }

    /// The volumes a stopping agent opens: every files-mode volume whose tmpfs is mounted; not
    /// one whose tmpfs is gone (a reboot), nor a socket-mode volume (needs root).
    #[test]
    fn the_mounted_files_volumes_are_listed_for_opening() {
        let (_tmp, root, host) = super::super::test_support::host();
        let mut sealed = Vec::new();
        for name in ["a", "b", "lost"] {
            let target = root.join(name);
            fs::create_dir(&target).unwrap();
            let pending = begin(
                &host,
                target.to_str().unwrap(),
                &request(VolumeMode::CsiFiles),
                65536,
            )
            .unwrap();
            seal(pending.files_dir()).unwrap();
            sealed.push((pending.id().clone(), pending.files_dir().to_owned()));
            pending.publish().unwrap();
        }
        let (_, lost_files) = sealed.pop().unwrap();
        unmount_all(&root.join("lost")).unwrap();
        unmount_all(&lost_files).unwrap();
        let socket = root.join("socket");
        fs::create_dir(&socket).unwrap();
        super::super::mount_volume(
            &host,
            socket.to_str().unwrap(),
            &request(VolumeMode::CsiSocket),
        )
        .unwrap();

        let mut listed = mounted_files_volumes(&host.volumes).unwrap();
        listed.sort();
        sealed.sort();
        assert_eq!(listed, sealed);
        for (_, files) in &listed {
            assert!(is_sealed(files).unwrap());
            open(files).unwrap();
            assert!(!is_sealed(files).unwrap());
        }
        for name in ["a", "b", "lost", "socket"] {
            super::super::unmount_volume(&host, root.join(name).to_str().unwrap()).unwrap();
        }
        assert_eq!(MountTable::read().unwrap().under(&root).count(), 0);
    }
}
