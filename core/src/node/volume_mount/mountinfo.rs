//! Reading `/proc/self/mountinfo`: which paths are mount points, and how many mounts are stacked on
//! each. The driver decides idempotency and cleanup from this table, never from guesses.

use std::io;
use std::path::{Path, PathBuf};

/// The mount points of this process's mount namespace, in mount order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    points: Vec<PathBuf>,
}

impl MountTable {
    /// Reads `/proc/self/mountinfo`.
    pub fn read() -> io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string(
            "/proc/self/mountinfo",
        )?))
    }

    /// Parses mountinfo text; lines that do not have a mount-point field are skipped.
    pub fn parse(text: &str) -> Self {
        let points = text
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .map(|field| PathBuf::from(unescape(field)))
            .collect();
        Self { points }
    }

    /// How many mounts are stacked on `path`.
    pub fn count(&self, path: &Path) -> usize {
        self.points.iter().filter(|p| p.as_path() == path).count()
    }

    /// Whether `path` is a mount point.
    pub fn is_mounted(&self, path: &Path) -> bool {
        self.count(path) > 0
    }

    /// Mount points at or below `dir`.
    pub fn under<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = &'a Path> + 'a {
        self.points
            .iter()
            .map(PathBuf::as_path)
            .filter(move |p| p.starts_with(dir))
    }
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = bytes.get(i + 1..i + 4)
            && octal.iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let value = octal
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 22 0:31 / /var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity ro,nosuid - ext4 /dev/sda1 rw
36 35 0:31 / /var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity/connect ro - ext4 /dev/sda1 rw
37 22 0:32 / /mnt/with\\040space rw - tmpfs tmpfs rw
38 22 0:32 / /mnt/with\\040space rw - tmpfs tmpfs rw
garbage
";

    #[test]
    fn parses_points_and_escapes() {
        let t = MountTable::parse(SAMPLE);
        assert!(t.is_mounted(Path::new("/")));
        assert_eq!(t.count(Path::new("/mnt/with space")), 2);
        let pod = Path::new("/var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity");
        assert_eq!(t.under(pod).count(), 2);
        assert!(!t.is_mounted(Path::new("/mnt")));
        assert!(!t.is_mounted(Path::new("garbage")));
    }

    #[test]
    fn unescape_edge_cases() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("a\\011b\\012"), "a\tb\n");
        assert_eq!(unescape("trailing\\"), "trailing\\");
        assert_eq!(unescape("\\9xx"), "\\9xx");
        assert_eq!(unescape("\\777"), "\\777");
    }

    #[test]
    fn reads_this_process_table() {
        let t = MountTable::read().unwrap();
        assert!(t.is_mounted(Path::new("/")) || t.under(Path::new("/")).count() > 0);
    }
}
