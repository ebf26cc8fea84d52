//! One driver invocation at a time per node: kubelet may run mount and unmount of different pods
//! concurrently, and the steps (mount table checks, node key creation, cleanup) are simplest and
//! safest serialised. Each invocation takes a few milliseconds.

use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Name of the lock file in the volumes dir.
pub const LOCK_FILE: &str = ".driver.lock";

/// An exclusive lock, released when dropped (or when the process exits).
pub struct DriverLock {
    _lock: Flock<File>,
}

/// Waits for the node-wide driver lock.
pub fn acquire(volumes_dir: &Path) -> Result<DriverLock, String> {
    let path = volumes_dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    let lock = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}: {}", path.display(), e.desc()))?;
    Ok(DriverLock { _lock: lock })
}
