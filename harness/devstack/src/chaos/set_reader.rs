//! Reading a pod's credential set while a fault hits its writer, as an application reads it,
//! and what a killed writer left behind.

use anyhow::Context;
use athenz_core::files::{CERT_FILE, FileSet, KEY_FILE};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A thread reading a pod's credential set as fast as it can, as an application would while a
/// fault hits its writer: how many reads, and how many were torn (a key not its certificate's).
pub(super) struct SetReader {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    torn: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl SetReader {
    pub(super) fn start(dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (reads, torn) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let thread = {
            let (stop, reads, torn) = (stop.clone(), reads.clone(), torn.clone());
            let dir = dir.to_owned();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(set) = FileSet::new(&dir).read(&[KEY_FILE, CERT_FILE]) {
                        reads.fetch_add(1, Ordering::Relaxed);
                        if !set_matches(&set[0], &set[1]) {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        };
        Self {
            stop,
            reads,
            torn,
            thread,
        }
    }

    /// Stops it; (reads, torn reads).
    pub(super) fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        (
            self.reads.load(Ordering::Relaxed),
            self.torn.load(Ordering::Relaxed),
        )
    }
}

fn set_matches(key: &[u8], cert: &[u8]) -> bool {
    let (Ok(info), Ok(key)) = (
        athenz_core::crypto::CertInfo::from_pem(&String::from_utf8_lossy(cert)),
        athenz_core::crypto::PrivateKey::from_pem(&String::from_utf8_lossy(key)),
    ) else {
        return false;
    };
    athenz_core::crypto::key_matches_cert(&key, &info)
}

/// Entries of the credentials dir other than the set, its links and the set it replaced.
pub(super) fn leftovers(out: &Path, replaced: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let current = std::fs::read_link(out.join("..data")).context("reading ..data")?;
    let mut extra = Vec::new();
    for entry in std::fs::read_dir(out).context("listing the credentials dir")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let kept = name == "..data"
            || Path::new(&name) == current
            || Some(Path::new(&name)) == replaced
            || !name.starts_with("..");
        if !kept {
            extra.push(name);
        }
    }
    Ok(extra)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn leftovers_are_what_is_neither_the_set_nor_the_one_it_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["..2026_a", "..2026_b", "..2026_c"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink("..2026_c", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/service.key.pem", d.join("service.key.pem")).unwrap();
        std::fs::write(d.join("..data_tmp.1f"), b"").unwrap();
        let mut left = leftovers(d, Some(Path::new("..2026_b"))).unwrap();
        left.sort();
        assert_eq!(left, ["..2026_a", "..data_tmp.1f"]);
    }
}
