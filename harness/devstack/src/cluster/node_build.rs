//! Waiting for a build of the node's binaries that is under way. `harness/real-node/kube/build.sh`
//! holds `<out>.lock` (flock) for as long as it builds `<out>`; CI starts that build in the
//! background and runs the tests beside it (docs/development.md, "CI's time"), so a test that
//! needs the binaries waits here for the build to end instead of finding half of them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest wait for a build under way: a cold build of every binary took 22 minutes on 2
/// cores beside CI's other builds; past this, the caller goes on and fails naming what is
/// missing.
pub const BUILD_WAIT: Duration = Duration::from_secs(50 * 60);

/// How often the lock is tried again while a build holds it.
const POLL: Duration = Duration::from_secs(2);

/// The lock `build.sh` holds while it builds `dir` (`<dir>.lock`, beside it).
pub fn lock_path(dir: &Path) -> PathBuf {
    let mut path = dir.as_os_str().to_owned();
    path.push(".lock");
    PathBuf::from(path)
}

/// What a wait for the build of a directory came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// No build was under way (or none ever ran: no lock file).
    NotBuilding,
    /// A build was under way and has ended, after this long.
    Ended(Duration),
    /// A build is still under way after `limit`.
    StillBuilding,
}

/// Waits, at most `limit`, while a build of `dir` holds its lock; says once on stderr that it
/// waits. A lock that cannot be opened counts as no build: the caller's own checks of the
/// binaries then say what is missing.
pub fn wait_for_build(dir: &Path, limit: Duration) -> Waited {
    use nix::fcntl::{Flock, FlockArg};
    let path = lock_path(dir);
    let started = Instant::now();
    let mut said = false;
    loop {
        let Ok(file) = std::fs::File::open(&path) else {
            return Waited::NotBuilding;
        };
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_free) if said => return Waited::Ended(started.elapsed()),
            Ok(_free) => return Waited::NotBuilding,
            Err(_) if started.elapsed() >= limit => {
                eprintln!(
                    "the build of {} is still under way after {} s; going on without it",
                    dir.display(),
                    limit.as_secs()
                );
                return Waited::StillBuilding;
            }
            Err(_) => {
                if !said {
                    eprintln!(
                        "waiting for the build of {} under way ({} is held)",
                        dir.display(),
                        path.display()
                    );
                    said = true;
                }
                std::thread::sleep(POLL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::{Flock, FlockArg};

    #[test]
    fn waits_while_the_lock_is_held_and_not_otherwise() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("bin");
        assert_eq!(lock_path(&dir), temp.path().join("bin.lock"));
        // no lock file: no build ever ran
        assert_eq!(
            wait_for_build(&dir, Duration::from_secs(1)),
            Waited::NotBuilding
        );
        let file = std::fs::File::create(lock_path(&dir)).unwrap();
        let held = Flock::lock(file, FlockArg::LockExclusive).unwrap();
        // held past the limit: still building
        assert_eq!(
            wait_for_build(&dir, Duration::from_millis(10)),
            Waited::StillBuilding
        );
        // released while waiting: the wait ends once the lock is free
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        assert!(matches!(
            wait_for_build(&dir, Duration::from_secs(30)),
            Waited::Ended(_)
        ));
        releaser.join().unwrap();
        // free from the start: nothing to wait for
        assert_eq!(
            wait_for_build(&dir, Duration::from_secs(1)),
            Waited::NotBuilding
        );
    }
}
