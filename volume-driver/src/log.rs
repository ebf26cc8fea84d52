//! The driver's diagnostics: one line per invocation appended to `<volumes-dir>/.driver.log`
//! (0600), rotated to `.driver.log.1` past 1 MiB. Kubelet reads stdout and stderr together, so
//! nothing diagnostic may go there.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Name of the log file in the volumes dir.
pub const LOG_FILE: &str = ".driver.log";
const MAX_LOG_LEN: u64 = 1024 * 1024;

/// Appends `line` (escaped, one line) with a timestamp and the pid. Logging never fails the
/// command: a full disk must not stop a pod from starting.
pub fn append(volumes_dir: &Path, line: &str) {
    let path = volumes_dir.join(LOG_FILE);
    if fs::metadata(&path).is_ok_and(|m| m.len() > MAX_LOG_LEN) {
        let _ = fs::rename(&path, volumes_dir.join(format!("{LOG_FILE}.1")));
    }
    let Ok(mut file) = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)
    else {
        return;
    };
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let one_line = line.escape_debug().to_string();
    let _ = writeln!(file, "{now} pid={} {one_line}", std::process::id());
}
