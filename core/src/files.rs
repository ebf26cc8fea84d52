//! Atomic replacement of a *set* of files, the way Kubernetes secret volumes do it.
//!
//! ```text
//! out/
//!   ..2026_11_22_03_40_48.123456789.1a2b3c4d/   the current set (one directory per issue)
//!   ..data -> ..2026_11_22_03_40_48.123456789.1a2b3c4d
//!   service.key.pem -> ..data/service.key.pem
//!   service.cert.pem -> ..data/service.cert.pem
//! ```
//!
//! A name may also be `<dir>/<file>` (one level, as `rolecerts/<d>:role.<r>.cert.pem`): the
//! directory is part of the set and its top-level link `<dir> -> ..data/<dir>` makes every file in
//! it change with the same swap.
//!
//! A new set is written in full to a fresh directory and fsynced; then `..data` is swapped with one
//! `rename(2)`, which is atomic; then superseded directories are removed. A reader that resolves
//! `..data` once and reads every file from that directory ([`FileSet::read`]) sees the old set or
//! the new one, never a mix. A reader that opens the top-level names one by one always sees complete
//! files, but may pair files of two consecutive sets if a swap falls between its opens.

use std::fs::File;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// Name of the symlink pointing at the current set.
pub const DATA_LINK: &str = "..data";

/// How many times [`FileSet::read`] retries when a set is swapped away under it.
const READ_ATTEMPTS: usize = 20;

/// Errors of file-set handling; each names the path.
#[derive(Debug, Error)]
pub enum FilesError {
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
    /// A file name would escape the directory or clash with the layout.
    #[error(
        "invalid file name {0:?}: must be a plain name, or <dir>/<name> of two, none starting with \"..\""
    )]
    BadName(String),
    /// No set has been written yet.
    #[error("{0}: no file set has been written yet")]
    Empty(PathBuf),
    /// The set kept changing while being read.
    #[error("{0}: the file set kept changing while being read")]
    Unstable(PathBuf),
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FilesError + 'a {
    move |source| FilesError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// One file of a set.
#[derive(Clone, Copy)]
pub struct FileSpec<'a> {
    /// Plain file name (no `/`, not starting with `..`), or `<dir>/<name>` of two such names.
    pub name: &'a str,
    /// Content.
    pub contents: &'a [u8],
    /// Permission bits, applied exactly (not narrowed by the umask).
    pub mode: u32,
}

impl std::fmt::Debug for FileSpec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // contents are often keys: never print them
        write!(
            f,
            "FileSpec({}, {} bytes, {:o})",
            self.name,
            self.contents.len(),
            self.mode
        )
    }
}

/// Owner to give every file, directory and link of a set (needs the privilege to chown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    /// User id, or unchanged.
    pub uid: Option<u32>,
    /// Group id, or unchanged.
    pub gid: Option<u32>,
}

/// A directory holding one atomically replaced set of files.
#[derive(Debug, Clone)]
pub struct FileSet {
    dir: PathBuf,
}

impl FileSet {
    /// The set in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Replaces the whole set with `files`. On error nothing visible has changed, unless the
    /// error came after the swap (then the new set is in place and only cleanup failed).
    pub fn write(&self, files: &[FileSpec<'_>], owner: Option<Owner>) -> Result<(), FilesError> {
        for file in files {
            let clashes = || subdirectories(files).any(|dir| dir == file.name);
            if !is_set_name(file.name) || clashes() {
                return Err(FilesError::BadName(file.name.to_owned()));
            }
        }
        fs::create_dir_all(&self.dir).map_err(io_err("creating", &self.dir))?;

        let set_name = new_set_name();
        let set_dir = self.dir.join(&set_name);
        let staged = self.stage(&set_dir, files, owner);
        if let Err(e) = staged {
            let _ = fs::remove_dir_all(&set_dir);
            return Err(e);
        }

        // Swap ..data in one step.
        let data_link = self.dir.join(DATA_LINK);
        let current = fs::read_link(&data_link);
        let data_absent = is_absent(&current);
        let previous = current.ok().and_then(|t| t.to_str().map(str::to_owned));
        if let Err(e) = link_atomically(Path::new(&set_name), &data_link, owner, data_absent) {
            let _ = fs::remove_dir_all(&set_dir);
            return Err(e);
        }

        // Top-level names point through ..data; create the missing ones atomically.
        for name in top_names(files) {
            let top = self.dir.join(name);
            let target = Path::new(DATA_LINK).join(name);
            let now = fs::read_link(&top);
            if now.as_deref().ok() != Some(target.as_path()) {
                link_atomically(&target, &top, owner, is_absent(&now))?;
            }
        }
        self.remove_superseded(&set_name, previous.as_deref(), files)?;
        fsync_dir(&self.dir).map_err(io_err("syncing", &self.dir))
    }

    fn stage(
        &self,
        set_dir: &Path,
        files: &[FileSpec<'_>],
        owner: Option<Owner>,
    ) -> Result<(), FilesError> {
        fs::create_dir(set_dir).map_err(io_err("creating", set_dir))?;
        fs::set_permissions(set_dir, fs::Permissions::from_mode(0o755))
            .map_err(io_err("setting mode of", set_dir))?;
        if let Some(o) = owner {
            std::os::unix::fs::chown(set_dir, o.uid, o.gid).map_err(io_err("chown", set_dir))?;
        }
        for dir in subdirectories(files) {
            let path = set_dir.join(dir);
            fs::create_dir(&path).map_err(io_err("creating", &path))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                .map_err(io_err("setting mode of", &path))?;
            if let Some(o) = owner {
                std::os::unix::fs::chown(&path, o.uid, o.gid).map_err(io_err("chown", &path))?;
            }
        }
        for file in files {
            let path = set_dir.join(file.name);
            let write = || -> io::Result<()> {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(file.mode)
                    .open(&path)?;
                f.set_permissions(fs::Permissions::from_mode(file.mode))?;
                if let Some(o) = owner {
                    std::os::unix::fs::fchown(&f, o.uid, o.gid)?;
                }
                f.write_all(file.contents)?;
                f.sync_all()
            };
            write().map_err(io_err("writing", &path))?;
        }
        for dir in subdirectories(files) {
            let path = set_dir.join(dir);
            fsync_dir(&path).map_err(io_err("syncing", &path))?;
        }
        fsync_dir(set_dir).map_err(io_err("syncing", set_dir))
    }

    /// Removes set directories other than `current` and `previous`, leftover temporaries, and
    /// top-level links of names the new set no longer has.
    ///
    /// The previous set is kept until the next write so that a reader which resolved `..data`
    /// just before the swap can still open its files; sets are replaced hours apart, so two swaps
    /// inside one `open(2)` do not happen.
    fn remove_superseded(
        &self,
        current: &str,
        previous: Option<&str>,
        files: &[FileSpec<'_>],
    ) -> Result<(), FilesError> {
        let entries = fs::read_dir(&self.dir).map_err(io_err("listing", &self.dir))?;
        for entry in entries {
            let entry = entry.map_err(io_err("listing", &self.dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            let kept = name == DATA_LINK || name == current || Some(name) == previous;
            if name.starts_with("..") && !kept {
                let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                let removed = if is_dir {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                removed.map_err(io_err("removing", &path))?;
            } else if !name.starts_with("..") && !top_names(files).any(|top| top == name) {
                // a name from an earlier set that this set dropped
                let ours = fs::read_link(&path)
                    .map(|t| t.starts_with(DATA_LINK))
                    .unwrap_or(false);
                if ours {
                    fs::remove_file(&path).map_err(io_err("removing", &path))?;
                }
            }
        }
        Ok(())
    }

    /// Reads `names` from one set: `..data` is resolved once and every file is read from that
    /// directory; if the set is swapped and removed meanwhile, the read starts again.
    pub fn read(&self, names: &[&str]) -> Result<Vec<Vec<u8>>, FilesError> {
        for name in names {
            if !is_set_name(name) {
                return Err(FilesError::BadName((*name).to_owned()));
            }
        }
        let data_link = self.dir.join(DATA_LINK);
        for _ in 0..READ_ATTEMPTS {
            let target = match fs::read_link(&data_link) {
                Ok(t) => t,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(FilesError::Empty(self.dir.clone()));
                }
                Err(e) => return Err(io_err("resolving", &data_link)(e)),
            };
            let set_dir = self.dir.join(&target);
            let mut out = Vec::with_capacity(names.len());
            let mut vanished = false;
            for name in names {
                let path = set_dir.join(name);
                match fs::read(&path) {
                    Ok(bytes) => out.push(bytes),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        vanished = true;
                        break;
                    }
                    Err(e) => return Err(io_err("reading", &path)(e)),
                }
            }
            if !vanished {
                return Ok(out);
            }
            // The set was replaced under us; if `..data` still names it, a file is really missing.
            if fs::read_link(&data_link).ok().as_deref() == Some(target.as_path()) {
                let missing = names
                    .iter()
                    .map(|n| set_dir.join(n))
                    .find(|p| !p.exists())
                    .unwrap_or(set_dir);
                return Err(io_err("reading", &missing)(io::ErrorKind::NotFound.into()));
            }
        }
        Err(FilesError::Unstable(self.dir.clone()))
    }
}

/// File name of the private key in a credential set.
pub const KEY_FILE: &str = "service.key.pem";
/// File name of the certificate (leaf then chain) in a credential set.
pub const CERT_FILE: &str = "service.cert.pem";
/// File name of the CA bundle in a credential set.
pub const CA_FILE: &str = "ca.cert.pem";
/// File name of the ntoken in a credential set.
pub const NTOKEN_FILE: &str = "ntoken";

/// The credentials an SIA writes (DESIGN.md 4.6).
#[derive(Debug, Clone, Copy)]
pub struct Credentials<'a> {
    /// Private key PEM; `None` when the key lives elsewhere (control-plane SIA).
    pub key_pem: Option<&'a crate::secret::Secret>,
    /// Leaf certificate followed by the chain, PEM.
    pub cert_pem: &'a str,
    /// CA certificates, PEM.
    pub ca_pem: &'a str,
    /// ntoken.
    pub ntoken: &'a crate::secret::Secret,
}

/// Mode of the secret files of a set (keys, tokens): 0600, or 0640 when a group is given so a
/// non-root app in that group can read them.
pub fn secret_mode(owner: Option<Owner>) -> u32 {
    if owner.is_some_and(|o| o.gid.is_some()) {
        0o640
    } else {
        0o600
    }
}

/// The files of `creds`: `service.key.pem` and `ntoken` with [`secret_mode`],
/// `service.cert.pem` and `ca.cert.pem` 0644.
pub fn credential_files<'a>(creds: &Credentials<'a>, owner: Option<Owner>) -> Vec<FileSpec<'a>> {
    let secret_mode = secret_mode(owner);
    let mut files = Vec::with_capacity(4);
    if let Some(key) = creds.key_pem {
        files.push(FileSpec {
            name: KEY_FILE,
            contents: key.expose().as_bytes(),
            mode: secret_mode,
        });
    }
    files.push(FileSpec {
        name: CERT_FILE,
        contents: creds.cert_pem.as_bytes(),
        mode: 0o644,
    });
    files.push(FileSpec {
        name: CA_FILE,
        contents: creds.ca_pem.as_bytes(),
        mode: 0o644,
    });
    files.push(FileSpec {
        name: NTOKEN_FILE,
        contents: creds.ntoken.expose().as_bytes(),
        mode: secret_mode,
    });
    files
}

/// Writes `creds` ([`credential_files`]) into `set` as one atomic set, everything owned by
/// `owner` when given.
pub fn write_credentials(
    set: &FileSet,
    creds: &Credentials<'_>,
    owner: Option<Owner>,
) -> Result<(), FilesError> {
    set.write(&credential_files(creds, owner), owner)
}

/// Resolves `--group`: a numeric gid, or a group name looked up in the system's group database.
pub fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("group {group:?} does not exist")),
        Err(e) => Err(format!("looking up group {group:?}: {}", e.desc())),
    }
}

/// fsyncs a directory so renames and links in it survive a crash.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with("..")
        && name != "."
        && !name.contains(['/', '\0'])
        && name.len() <= 255
}

/// A name a set may hold: a plain name, or `<dir>/<name>` of two plain names.
fn is_set_name(name: &str) -> bool {
    match name.split_once('/') {
        None => is_plain_name(name),
        Some((dir, file)) => is_plain_name(dir) && is_plain_name(file),
    }
}

/// The top-level names of `files` (a file's name, or its directory), each once.
fn top_names<'a>(files: &'a [FileSpec<'a>]) -> impl Iterator<Item = &'a str> + 'a {
    let mut seen = std::collections::BTreeSet::new();
    files
        .iter()
        .map(|f| f.name.split_once('/').map_or(f.name, |(dir, _)| dir))
        .filter(move |top| seen.insert(*top))
}

/// The directories `files` need inside a set, each once.
fn subdirectories<'a>(files: &'a [FileSpec<'a>]) -> impl Iterator<Item = &'a str> + 'a {
    let mut seen = std::collections::BTreeSet::new();
    files
        .iter()
        .filter_map(|f| f.name.split_once('/').map(|(dir, _)| dir))
        .filter(move |dir| seen.insert(*dir))
}

/// Whether `read_link` found nothing at all at the name (not: something that is not a link).
fn is_absent(read: &io::Result<PathBuf>) -> bool {
    matches!(read, Err(e) if e.kind() == io::ErrorKind::NotFound)
}

/// Points `link` at `target` so that no reader ever sees it half made: a fresh link with its
/// owner set is renamed over it. When `link` is `absent` and no owner is to be set, the link is
/// made in place instead — creating a symlink is itself atomic — which saves a rename and a
/// random name per link; the first set in a new directory (every files-mode publish) is all
/// such links. Should the name have appeared meanwhile, the rename is used after all.
fn link_atomically(
    target: &Path,
    link: &Path,
    owner: Option<Owner>,
    absent: bool,
) -> Result<(), FilesError> {
    if absent && owner.is_none() {
        match std::os::unix::fs::symlink(target, link) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("linking", link)(e)),
        }
    }
    let tmp = link.with_file_name(format!("..link_tmp.{}", random_hex()));
    symlink_with_owner(target, &tmp, owner)?;
    fs::rename(&tmp, link).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err("linking", link)(e)
    })
}

fn symlink_with_owner(target: &Path, link: &Path, owner: Option<Owner>) -> Result<(), FilesError> {
    std::os::unix::fs::symlink(target, link).map_err(io_err("linking", link))?;
    if let Some(o) = owner {
        std::os::unix::fs::lchown(link, o.uid, o.gid).map_err(io_err("chown", link))?;
    }
    Ok(())
}

fn random_hex() -> String {
    crate::random::hex_name::<4>()
}

/// `..<UTC date and time>.<nanoseconds>.<random>`: sortable, unique, and hidden like Kubernetes'.
fn new_set_name() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let ts = time::OffsetDateTime::from_unix_timestamp(now.as_secs() as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{:09}.{}",
        ts.year(),
        u8::from(ts.month()),
        ts.day(),
        ts.hour(),
        ts.minute(),
        ts.second(),
        now.subsec_nanos(),
        random_hex()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn specs<'a>(key: &'a [u8], cert: &'a [u8]) -> [FileSpec<'a>; 2] {
        [
            FileSpec {
                name: "service.key.pem",
                contents: key,
                mode: 0o600,
            },
            FileSpec {
                name: "service.cert.pem",
                contents: cert,
                mode: 0o644,
            },
        ]
    }

    #[test]
    fn writes_links_and_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path().join("out"));
        set.write(&specs(b"k1", b"c1"), None).unwrap();
        let out = set.dir();
        assert_eq!(fs::read(out.join("service.key.pem")).unwrap(), b"k1");
        assert_eq!(
            fs::read_link(out.join("service.key.pem")).unwrap(),
            Path::new("..data/service.key.pem")
        );
        assert_eq!(
            fs::metadata(out.join("service.key.pem")).unwrap().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(out.join("service.cert.pem")).unwrap().mode() & 0o777,
            0o644
        );
        set.write(&specs(b"k2", b"c2"), None).unwrap();
        assert_eq!(
            set.read(&["service.key.pem", "service.cert.pem"]).unwrap(),
            [b"k2".to_vec(), b"c2".to_vec()]
        );
        set.write(&specs(b"k3", b"c3"), None).unwrap();
        // the current and the previous set directories remain, plus ..data and the two links
        let mut names: Vec<String> = fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(names[0].starts_with("..2") && names[1].starts_with("..2"));
        assert_eq!(names[2], DATA_LINK);
        let current = fs::read_link(out.join(DATA_LINK)).unwrap();
        assert_eq!(current, Path::new(&names[1]), "newest set is current");
        assert_eq!(
            fs::read(out.join(&names[0]).join("service.key.pem")).unwrap(),
            b"k2"
        );
    }

    /// A first set in an empty dir is linked in place (no temporary names left); a name that
    /// is already something else — a plain file, a link elsewhere, a dangling `..data` — is
    /// replaced by a link, in one rename, with nothing of the old left.
    #[test]
    fn links_are_made_in_place_or_renamed_over_what_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path().join("out"));
        set.write(&specs(b"k1", b"c1"), None).unwrap();
        let names = |dir: &Path| {
            let mut n: Vec<String> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            n.sort();
            n
        };
        let first = names(set.dir());
        assert_eq!(first.len(), 4, "{first:?}");
        assert_eq!(
            &first[1..],
            [DATA_LINK, "service.cert.pem", "service.key.pem"]
        );

        let other = tempfile::tempdir().unwrap();
        let out = tmp.path().join("other");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("service.key.pem"), b"planted").unwrap();
        std::os::unix::fs::symlink(other.path(), out.join("service.cert.pem")).unwrap();
        std::os::unix::fs::symlink("..gone", out.join(DATA_LINK)).unwrap();
        let set = FileSet::new(&out);
        set.write(&specs(b"k2", b"c2"), None).unwrap();
        assert_eq!(
            set.read(&["service.key.pem", "service.cert.pem"]).unwrap(),
            [b"k2".to_vec(), b"c2".to_vec()]
        );
        for name in ["service.key.pem", "service.cert.pem"] {
            assert_eq!(
                fs::read_link(out.join(name)).unwrap(),
                Path::new(DATA_LINK).join(name)
            );
        }
        let left = names(&out);
        assert_eq!(left.len(), 4, "nothing temporary or stale left: {left:?}");
    }

    #[test]
    fn dropped_names_are_unlinked() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path());
        set.write(&specs(b"k", b"c"), None).unwrap();
        set.write(&specs(b"k", b"c")[..1], None).unwrap();
        assert!(!tmp.path().join("service.cert.pem").exists());
        assert!(
            fs::symlink_metadata(tmp.path().join("service.cert.pem")).is_err(),
            "dangling link left behind"
        );
    }

    #[test]
    fn bad_names_change_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path());
        set.write(&specs(b"k", b"c"), None).unwrap();
        for bad in [
            "", "../x", "a/b/c", "a/..x", "/a", "a/", "..data", "..x", ".", "a\0",
        ] {
            let files = [FileSpec {
                name: bad,
                contents: b"x",
                mode: 0o644,
            }];
            assert!(
                matches!(set.write(&files, None), Err(FilesError::BadName(_))),
                "{bad:?}"
            );
        }
        assert_eq!(set.read(&["service.key.pem"]).unwrap(), [b"k".to_vec()]);
        assert!(set.read(&["../etc"]).is_err());
    }

    #[test]
    fn files_in_a_directory_change_with_the_set_and_leave_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path());
        let nested = |name: &'static str, contents: &'static [u8]| FileSpec {
            name,
            contents,
            mode: 0o644,
        };
        set.write(
            &[
                nested("a", b"1"),
                nested("roles/x.pem", b"x1"),
                nested("roles/y.pem", b"y1"),
            ],
            None,
        )
        .unwrap();
        let roles = tmp.path().join("roles");
        assert_eq!(fs::read_link(&roles).unwrap(), Path::new("..data/roles"));
        assert_eq!(fs::read(roles.join("x.pem")).unwrap(), b"x1");
        assert_eq!(
            set.read(&["a", "roles/y.pem"]).unwrap(),
            [b"1".to_vec(), b"y1".to_vec()]
        );

        // the next set drops y: it is gone with the old set, x has the new contents
        set.write(&[nested("a", b"2"), nested("roles/x.pem", b"x2")], None)
            .unwrap();
        assert_eq!(fs::read(roles.join("x.pem")).unwrap(), b"x2");
        assert!(!roles.join("y.pem").exists());

        // a set without the directory unlinks it
        set.write(&[nested("a", b"3")], None).unwrap();
        assert!(fs::symlink_metadata(&roles).is_err());

        // a name cannot be both a file and a directory
        assert!(matches!(
            set.write(&[nested("roles", b"r"), nested("roles/x.pem", b"x")], None),
            Err(FilesError::BadName(_))
        ));
        assert_eq!(fs::read(tmp.path().join("a")).unwrap(), b"3");
    }

    #[test]
    fn read_of_an_empty_dir_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let err = FileSet::new(tmp.path()).read(&["a"]).unwrap_err();
        assert!(matches!(err, FilesError::Empty(_)), "{err}");
        let set = FileSet::new(tmp.path());
        set.write(&specs(b"k", b"c"), None).unwrap();
        let err = set.read(&["missing"]).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn ownership_is_applied() {
        // Give the set to the current owner (always permitted) and to a group when root.
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path());
        let me = fs::metadata(tmp.path()).unwrap();
        let gid = if me.uid() == 0 { 4242 } else { me.gid() };
        let owner = Owner {
            uid: Some(me.uid()),
            gid: Some(gid),
        };
        set.write(&specs(b"k", b"c"), Some(owner)).unwrap();
        let meta = fs::metadata(tmp.path().join("service.key.pem")).unwrap();
        assert_eq!(meta.gid(), gid);
        let link = fs::symlink_metadata(tmp.path().join("service.key.pem")).unwrap();
        assert_eq!(link.gid(), gid);
    }

    #[test]
    fn credential_modes_with_and_without_group() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FileSet::new(tmp.path());
        let key = crate::secret::Secret::new("KEY");
        let token = crate::secret::Secret::new("TOKEN");
        let creds = Credentials {
            key_pem: Some(&key),
            cert_pem: "CERT",
            ca_pem: "CA",
            ntoken: &token,
        };
        let mode = |name: &str| fs::metadata(tmp.path().join(name)).unwrap().mode() & 0o777;
        write_credentials(&set, &creds, None).unwrap();
        assert_eq!(
            [
                mode(KEY_FILE),
                mode(CERT_FILE),
                mode(CA_FILE),
                mode(NTOKEN_FILE)
            ],
            [0o600, 0o644, 0o644, 0o600]
        );
        let gid = fs::metadata(tmp.path()).unwrap().gid();
        let owner = Owner {
            uid: None,
            gid: Some(gid),
        };
        write_credentials(&set, &creds, Some(owner)).unwrap();
        assert_eq!([mode(KEY_FILE), mode(NTOKEN_FILE)], [0o640, 0o640]);
        let without_key = Credentials {
            key_pem: None,
            ..creds
        };
        write_credentials(&set, &without_key, None).unwrap();
        assert!(!tmp.path().join(KEY_FILE).exists());
        assert_eq!(fs::read(tmp.path().join(CERT_FILE)).unwrap(), b"CERT");
    }

    #[test]
    fn groups_resolve_by_number_or_name() {
        assert_eq!(resolve_group("4242").unwrap(), 4242);
        assert_eq!(resolve_group("root").unwrap(), 0);
        let err = resolve_group("no-such-group-xyz").unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
    }

    /// The issue's atomicity check: 500 replacements against a reader loop that never sees a mix.
    #[test]
    fn concurrent_reader_never_sees_a_mixed_set() {
        let tmp = tempfile::tempdir().unwrap();
        let set = Arc::new(FileSet::new(tmp.path()));
        let padding = vec![b'x'; 8192];
        let content = |kind: &str, i: usize| {
            let mut v = format!("{kind}-{i:05}|").into_bytes();
            v.extend_from_slice(&padding);
            v
        };
        set.write(&specs(&content("key", 0), &content("cert", 0)), None)
            .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (set, done) = (set.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0usize;
                let mut top_level_reads = 0usize;
                while !done.load(Ordering::Relaxed) {
                    let got = set.read(&["service.key.pem", "service.cert.pem"]).unwrap();
                    let key_gen = &got[0][4..9];
                    let cert_gen = &got[1][5..10];
                    assert_eq!(key_gen, cert_gen, "mixed set");
                    assert_eq!(got[0].len(), 10 + 8192, "partial key file");
                    reads += 1;
                    // naive readers of the top-level names always get whole files
                    let key = fs::read(set.dir().join("service.key.pem")).unwrap();
                    assert!(key.starts_with(b"key-") && key.len() == 10 + 8192);
                    top_level_reads += 1;
                }
                (reads, top_level_reads)
            })
        };
        for i in 1..=500 {
            set.write(&specs(&content("key", i), &content("cert", i)), None)
                .unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let (reads, top) = reader.join().unwrap();
        assert!(reads > 0 && top > 0);
        let last = set.read(&["service.key.pem"]).unwrap();
        assert!(last[0].starts_with(b"key-00500|"));
    }
}
