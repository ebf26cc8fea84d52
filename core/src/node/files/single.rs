//! Single files replaced atomically (temporary file, fsync, rename, fsync of the directory; the
//! volumes' records without the fsyncs, see [`write_json_record`]), and JSON files read with a
//! size cap and never through a symlink: the agent's and the driver's records (`data.json`,
//! `state.json`, `status.json`), the node key, status files. Beside the set swap of [`super`],
//! below the volume model that uses both.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The largest JSON file [`read_json_file`] reads (records are a few hundred bytes).
pub const MAX_JSON_FILE_LEN: u64 = 64 * 1024;

/// Errors of single-file reads and writes; each names the path involved.
#[derive(Debug, Error)]
pub enum FileError {
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file exists but is not what it must be.
    #[error("{path}: {reason}")]
    Invalid {
        /// The path involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A JSON file did not parse.
    #[error("{path}: not valid JSON: {source}")]
    Json {
        /// The path involved.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
    move |source| FileError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Reads a JSON file of at most [`MAX_JSON_FILE_LEN`] bytes, never through a symlink.
pub fn read_json_file<T: DeserializeOwned>(path: &Path) -> Result<T, FileError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err("reading", path))?;
    // volume files are a few hundred bytes: one read, not a read per doubling from 32 bytes
    let mut buf = Vec::with_capacity(4096);
    file.take(MAX_JSON_FILE_LEN + 1)
        .read_to_end(&mut buf)
        .map_err(io_err("reading", path))?;
    if buf.len() as u64 > MAX_JSON_FILE_LEN {
        return Err(FileError::Invalid {
            path: path.to_owned(),
            reason: format!("larger than {MAX_JSON_FILE_LEN} bytes"),
        });
    }
    serde_json::from_slice(&buf).map_err(|source| FileError::Json {
        path: path.to_owned(),
        source,
    })
}

/// Writes `value` as JSON to `path` atomically (temporary file, fsync, rename) with `mode`.
pub fn write_json_file<T: Serialize>(path: &Path, value: &T, mode: u32) -> Result<(), FileError> {
    write_file_atomic(path, &json_of(path, value)?, mode)
}

/// `value` as the pretty JSON written to `path` (whose name the error carries).
fn json_of<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, FileError> {
    serde_json::to_vec_pretty(value).map_err(|source| FileError::Json {
        path: path.to_owned(),
        source,
    })
}

/// Writes a volume's record (`state.json`) as JSON: atomic for readers, without the fsyncs of
/// [`write_json_file`]. A record lives no longer than its volume, and a crash that could lose an
/// unsynced write (the kernel's, or the node's power) also ends every container of the pod: a
/// files-mode volume's tmpfs is gone and kubelet publishes it again from the start, and a SIA
/// starts again with an init, which needs no record. What the fsyncs bought is therefore nothing a
/// reader can use; they cost about 0.1 ms of CPU and 0.3 ms of wall per write on ext4
/// (docs/benchmarks.md), on every issuance and refresh.
pub fn write_json_record<T: Serialize>(path: &Path, value: &T) -> Result<(), FileError> {
    write_file_atomic_unsynced(path, &json_of(path, value)?, 0o600)
}

/// Creates `path` (which must not exist) with `mode` and writes `bytes`, without fsync. For files
/// in a directory nobody reads until its creator says it is complete (the driver's fresh volume
/// dir): atomic replacement and durability buy nothing there, and the fsyncs cost about a
/// millisecond on every pod start.
pub fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)
    })();
    result.map_err(io_err("writing", path))
}

/// Writes `bytes` to `path` atomically: a reader sees the old content or the new, never a part.
pub fn write_file_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    write_replacing(path, bytes, mode, true)
}

/// [`write_file_atomic`] without the fsyncs: atomic for readers, not durable across a crash.
pub fn write_file_atomic_unsynced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    write_replacing(path, bytes, mode, false)
}

fn write_replacing(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> Result<(), FileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", crate::random::hex_name::<8>()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed the mode; set it exactly.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("writing", path)(e));
    }
    if durable { sync_dir(dir) } else { Ok(()) }
}

/// fsyncs a directory so a rename or link in it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<(), FileError> {
    super::fsync_dir(dir).map_err(io_err("syncing", dir))
}
