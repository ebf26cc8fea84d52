//! The identity volume on the host, shared by the flex driver (which creates it) and the agent
//! (which reads it) — docs/design.md §4.1.
//!
//! ```text
//! <volumes-dir>/                 0700, created if missing
//!   .node-key                    32 random bytes, 0600: the HMAC key of volume ids
//!   <id>/                        one per pod volume; <id> = HMAC-SHA256(node key, mount dir), hex
//!     data.json                  0600: who the volume belongs to (VolumeData)
//!     state.json                 0600: the agent's refresh state (VolumeState)
//!     mount/                     bind-mounted read-only into the pod
//!       id                       0444: the id, for the SIA to present
//!       connect/                 bind of the agent dir (holds agent.sock)
//!     files/                     CSI files mode instead of mount/: a size-capped tmpfs holding
//!                                the credential set (`..data` swap), bound read-only at the target
//! ```
//!
//! A pod sees only `mount/`. The id it presents is parsed by [`VolumeId::parse`] before any path is
//! built, so nothing a pod sends can point outside `<volumes-dir>`.

use super::volume_mode::VolumeMode;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;
use time::OffsetDateTime;

use crate::names::Quoted;

/// Default host directory of the volumes.
pub const DEFAULT_VOLUMES_DIR: &str = "/var/athenz/volumes";
/// Default host directory of the agent socket.
pub const DEFAULT_AGENT_DIR: &str = "/var/athenz/agent";
/// Environment variable overriding [`DEFAULT_VOLUMES_DIR`].
pub const VOLUMES_DIR_ENV: &str = "ATHENZ_VOLUMES_DIR";
/// Environment variable overriding [`DEFAULT_AGENT_DIR`].
pub const AGENT_DIR_ENV: &str = "ATHENZ_AGENT_DIR";
/// File name of the agent socket inside the agent dir.
pub const AGENT_SOCKET_NAME: &str = "agent.sock";
/// File name of the node key inside the volumes dir.
pub const NODE_KEY_FILE: &str = ".node-key";
/// Size of the node key.
pub const NODE_KEY_LEN: usize = 32;
/// Largest `data.json` or `state.json` read; both are a few hundred bytes.
pub const MAX_VOLUME_FILE_LEN: u64 = crate::files::single::MAX_JSON_FILE_LEN;

/// Lowercase hex (volume ids, serials).
pub use crate::encoding::hex;
/// Errors of the volume layer: those of its files, each naming the path involved.
pub use crate::files::single::FileError as VolumeError;
/// The volume files' reads and writes (single files, atomic; JSON capped in size).
pub use crate::files::single::{
    read_json_file, sync_dir, write_file_atomic, write_file_atomic_unsynced, write_json_file,
    write_json_record, write_new_file,
};

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> VolumeError + 'a {
    move |source| VolumeError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// A volume id: exactly 64 lowercase hex characters. The only way to name a volume.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeId(String);

/// An id that is not 64 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid volume id: must be 64 lowercase hex characters (got {0})")]
pub struct InvalidVolumeId(pub Quoted);

impl VolumeId {
    /// Length of an id in characters.
    pub const LEN: usize = 64;

    /// Parses an id received from outside (a pod, a URL path). Nothing else is accepted: no
    /// uppercase, no whitespace, no separators, no empty string.
    pub fn parse(raw: &str) -> Result<Self, InvalidVolumeId> {
        let ok = raw.len() == Self::LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidVolumeId(Quoted::new(raw)))
        }
    }

    /// The id of the volume mounted at `mount_dir`, exactly as kubelet passed it.
    pub fn for_mount_dir(key: &NodeKey, mount_dir: &str) -> Self {
        // HMAC accepts keys of any length, so this cannot fail for a 32-byte key.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0)
            .unwrap_or_else(|_| unreachable!("HMAC-SHA256 takes keys of any length"));
        mac.update(mount_dir.as_bytes());
        Self(hex(&mac.finalize().into_bytes()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VolumeId({})", self.0)
    }
}

/// The node's secret HMAC key. Ids are unguessable without it, so a pod cannot name another pod's
/// volume even knowing its mount path.
#[derive(Clone)]
pub struct NodeKey([u8; NODE_KEY_LEN]);

impl NodeKey {
    /// A key from known bytes (tests, benchmarks).
    pub fn from_bytes(bytes: [u8; NODE_KEY_LEN]) -> Self {
        Self(bytes)
    }
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NodeKey(<redacted>)")
    }
}

/// The volumes directory and every path under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumesDir {
    root: PathBuf,
}

impl VolumesDir {
    /// The volumes dir at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The volumes dir from `ATHENZ_VOLUMES_DIR`, else the default.
    pub fn from_env() -> Self {
        Self::new(env_path(VOLUMES_DIR_ENV, DEFAULT_VOLUMES_DIR))
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the directory (0700) if it is missing.
    pub fn ensure(&self) -> Result<(), VolumeError> {
        // one lstat when it is there (every publish asks); made only when missing
        let meta = match fs::symlink_metadata(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(&self.root).map_err(io_err("creating", &self.root))?;
                fs::symlink_metadata(&self.root)
            }
            other => other,
        }
        .map_err(io_err("inspecting", &self.root))?;
        if !meta.is_dir() {
            return Err(VolumeError::Invalid {
                path: self.root.clone(),
                reason: "is not a directory".into(),
            });
        }
        if meta.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(&self.root, fs::Permissions::from_mode(0o700))
                .map_err(io_err("restricting", &self.root))?;
        }
        Ok(())
    }

    /// Every volume recorded here, with its paths and `data.json`: the one walk over the
    /// directory (the agent's status report, the CSI driver's resume after a restart). Entries
    /// that are not volume ids are skipped before any path is built from them, and so are
    /// volumes without a readable `data.json` (a mount in progress). An error only if the
    /// directory itself cannot be read.
    pub fn recorded(&self) -> std::io::Result<impl Iterator<Item = RecordedVolume> + '_> {
        let entries = fs::read_dir(&self.root)?;
        Ok(entries.flatten().filter_map(|entry| {
            let id = VolumeId::parse(entry.file_name().to_str()?).ok()?;
            let paths = self.volume(&id);
            let data = read_json_file::<VolumeData>(&paths.data_json).ok()?;
            Some(RecordedVolume { id, paths, data })
        }))
    }

    /// Path of the node key.
    pub fn node_key_path(&self) -> PathBuf {
        self.root.join(NODE_KEY_FILE)
    }

    /// Loads the node key, creating it on first use.
    ///
    /// Creation is race-safe: the key is written in full to a private temporary file which is then
    /// hard-linked into place; `link` fails if another process won, and then the winner's key is
    /// read. No process ever sees a partly written key.
    pub fn load_or_create_node_key(&self) -> Result<NodeKey, VolumeError> {
        self.ensure()?;
        let path = self.node_key_path();
        match read_node_key(&path) {
            Ok(key) => return Ok(key),
            Err(VolumeError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut bytes = [0u8; NODE_KEY_LEN];
        crate::random::fill(&mut bytes).map_err(|e| VolumeError::Invalid {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let tmp = self.root.join(format!(
            "{NODE_KEY_FILE}.tmp-{}",
            crate::random::hex_name::<8>()
        ));
        let written = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()
        })();
        written.map_err(io_err("writing", &tmp))?;
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(&self.root)?;
                Ok(NodeKey(bytes))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_node_key(&path),
            Err(e) => Err(io_err("installing", &path)(e)),
        }
    }

    /// The paths of volume `id`.
    pub fn volume(&self, id: &VolumeId) -> VolumePaths {
        let dir = self.root.join(id.as_str());
        VolumePaths {
            data_json: dir.join("data.json"),
            state_json: dir.join("state.json"),
            mount: dir.join("mount"),
            id_file: dir.join("mount").join("id"),
            connect: dir.join("mount").join("connect"),
            files: dir.join("files"),
            status_json: dir.join("status.json"),
            dir,
        }
    }
}

/// The agent directory (holding `agent.sock`), from `ATHENZ_AGENT_DIR` or the default.
pub fn agent_dir_from_env() -> PathBuf {
    env_path(AGENT_DIR_ENV, DEFAULT_AGENT_DIR)
}

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

fn read_node_key(path: &Path) -> Result<NodeKey, VolumeError> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(path)
        .map_err(io_err("reading", path))?;
    let meta = file.metadata().map_err(io_err("inspecting", path))?;
    let invalid = |reason: &str| VolumeError::Invalid {
        path: path.to_owned(),
        reason: reason.into(),
    };
    if !meta.is_file() {
        return Err(invalid("node key is not a regular file"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(invalid(
            "node key is readable by group or others; it must be 0600",
        ));
    }
    if meta.len() != NODE_KEY_LEN as u64 {
        return Err(invalid("node key is not 32 bytes"));
    }
    let mut bytes = [0u8; NODE_KEY_LEN];
    file.read_exact(&mut bytes)
        .map_err(io_err("reading", path))?;
    Ok(NodeKey(bytes))
}

/// `O_NOFOLLOW`: the node key and volume files are never reached through a symlink.
const fn libc_o_nofollow() -> i32 {
    libc::O_NOFOLLOW
}

/// One volume found by [`VolumesDir::recorded`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedVolume {
    /// Its id (the directory's name, validated).
    pub id: VolumeId,
    /// Its paths.
    pub paths: VolumePaths,
    /// Its `data.json`.
    pub data: VolumeData,
}

/// Paths of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePaths {
    /// `<volumes-dir>/<id>`.
    pub dir: PathBuf,
    /// `data.json`: who the volume belongs to.
    pub data_json: PathBuf,
    /// `state.json`: the agent's refresh state.
    pub state_json: PathBuf,
    /// `mount/`: what the pod sees.
    pub mount: PathBuf,
    /// `mount/id`: the id, for the SIA.
    pub id_file: PathBuf,
    /// `mount/connect`: where the agent dir is bound.
    pub connect: PathBuf,
    /// `files/`: in CSI files mode, the memory-backed directory the agent writes the credential
    /// set into, bound read-only at the target.
    pub files: PathBuf,
    /// `status.json`: the agent's last failure for the volume and its next re-issue
    /// ([`VolumeStatusRecord`]), for `athenz-identity-agent status`.
    pub status_json: PathBuf,
}

/// `data.json`: written by the driver at mount, read by the agent. Fields are what kubelet passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeData {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Pod service account.
    pub service_account: String,
    /// The mount dir kubelet passed (the id is computed over it).
    pub mount_dir: String,
    /// Whether kubelet asked for read-write (the pod's view is read-only regardless).
    pub read_write: bool,
    /// When the volume was mounted.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Set when the CSI driver published the volume (absent for flex volumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi: Option<CsiVolume>,
}

/// How a CSI volume was published (docs/design.md §4.10): what a repeated publish of the same
/// target must match, and what a restarted agent needs to find its files-mode volumes again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiVolume {
    /// Kubelet's `volume_id` (`csi-<sha256>` for an inline ephemeral volume).
    pub volume_id: String,
    /// Socket mode (the flex layout) or files mode (the agent writes the credentials); stored
    /// as its `volumeAttributes.mode` (`socket`, `files`).
    #[serde(with = "crate::node::volume_mode::csi_attribute")]
    pub mode: VolumeMode,
    /// The group (kubelet's `volume_mount_group`, the pod's fsGroup) that may read the key in
    /// files mode; without it the key is readable by root only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// Files mode: whether the certificate names the pod's IP (`volumeAttributes.ipSAN`). With
    /// it the agent issues twice (the volume is published before the pod has an IP, then again
    /// once it has one); without it once. A record written before the attribute existed had
    /// the IP, and keeps it.
    #[serde(default = "ip_san_before_the_attribute")]
    pub ip_san: bool,
}

/// What a CSI volume recorded before `ipSAN` existed did: name the pod's IP.
fn ip_san_before_the_attribute() -> bool {
    true
}

impl VolumeData {
    /// How the volume was made: flex unless the CSI driver published it.
    pub fn mode(&self) -> VolumeMode {
        self.csi.as_ref().map_or(VolumeMode::Flex, |csi| csi.mode)
    }

    /// Checks every field against its Kubernetes rule.
    pub fn validate(&self) -> Result<(), crate::names::NameError> {
        use crate::names::*;
        validate_dns_label("pod.namespace", &self.namespace)?;
        validate_dns_subdomain("pod.name", &self.pod_name)?;
        validate_uid("pod.uid", &self.pod_uid)?;
        validate_dns_subdomain("serviceAccount.name", &self.service_account)
    }
}

/// Where a pod's private key is made (`--key-source` of the agent and the SIA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KeySource {
    /// In the pod, by its SIA; only CSRs and certificates cross the socket.
    #[default]
    Pod,
    /// By the agent, handed to the pod over the socket (and shown back at every refresh).
    Agent,
}

impl KeySource {
    /// The setting's value, as metrics and `status` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pod => "pod",
            Self::Agent => "agent",
        }
    }
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `state.json`: what the agent needs to refresh a volume's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeState {
    /// Provider that launched the instance.
    pub provider: String,
    /// Instance id (the pod UID).
    pub instance_id: String,
    /// Athenz domain.
    pub domain: String,
    /// Athenz service.
    pub service: String,
    /// UID of the pod the identity was issued to.
    pub pod_uid: String,
    /// Serial of the current certificate, lowercase hex.
    pub cert_serial: String,
    /// Serial of the certificate presented for the last refresh, which ZTS too still accepts
    /// (Athenz's `prevSerial`): a pod whose files were not updated after that refresh (its
    /// answer lost, its write failed) presents it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_cert_serial: Option<String>,
    /// When the current certificate expires.
    #[serde(with = "time::serde::rfc3339")]
    pub cert_expiry: OffsetDateTime,
    /// When this state was written.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// Where the certificate's key was made (absent in states written before the setting
    /// existed, when the agent made every key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_source: Option<KeySource>,
}

/// `status.json`: what `athenz-identity-agent status` shows beyond `state.json` — the last
/// failure the agent met for the volume (cleared by the next success) and, in CSI files mode,
/// when the agent re-issues next. Written only when it changes, so a pod retrying one failure does
/// not make the agent write on every try.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatusRecord {
    /// The last failure, if the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
    /// When the agent re-issues next (CSI files mode only; the pod's SIA refreshes otherwise).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_refresh: Option<OffsetDateTime>,
}

/// A failure, when it happened and what it was (the message the pod or kubelet was given).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastError {
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The failure, as the agent logged it.
    pub message: String,
}

impl VolumeStatusRecord {
    /// The record at `path`; empty if there is none or it is unreadable (it is informational).
    pub fn read(path: &Path) -> Self {
        read_json_file(path).unwrap_or_default()
    }

    /// Changes the record at `path` with `change`, writing only if that changed it.
    pub fn update(path: &Path, change: impl FnOnce(&mut Self)) -> Result<(), VolumeError> {
        let before = Self::read(path);
        let mut after = before.clone();
        change(&mut after);
        if after == before {
            return Ok(());
        }
        let json = serde_json::to_vec(&after).map_err(|source| VolumeError::Json {
            path: path.to_owned(),
            source,
        })?;
        // informational: atomic for readers, but not worth an fsync on every change
        write_file_atomic_unsynced(path, &json, 0o600)
    }

    /// Sets the last error to `message` at `now`, unless it already says that.
    pub fn set_error(&mut self, message: &str, now: OffsetDateTime) {
        if self.last_error.as_ref().map(|e| e.message.as_str()) != Some(message) {
            self.last_error = Some(LastError {
                at: now,
                message: message.to_owned(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_status_record_is_written_only_when_it_changes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let inode = || fs::metadata(&path).unwrap().ino();
        let t0 = OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000);
        // nothing recorded: clearing writes nothing
        VolumeStatusRecord::update(&path, |r| r.last_error = None).unwrap();
        assert!(!path.exists());
        VolumeStatusRecord::update(&path, |r| r.set_error("ZTS unavailable", t0)).unwrap();
        let first = inode();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        // the same failure again, later: the record (and its time) stay as they were
        let later = t0 + time::Duration::minutes(1);
        VolumeStatusRecord::update(&path, |r| r.set_error("ZTS unavailable", later)).unwrap();
        assert_eq!(inode(), first);
        let record = VolumeStatusRecord::read(&path);
        assert_eq!(record.last_error.as_ref().unwrap().at, t0);
        // another failure, then success clears it
        VolumeStatusRecord::update(&path, |r| r.set_error("403 denied", later)).unwrap();
        assert_ne!(inode(), first);
        VolumeStatusRecord::update(&path, |r| {
            r.last_error = None;
            r.next_refresh = Some(later);
        })
        .unwrap();
        let record = VolumeStatusRecord::read(&path);
        assert_eq!(record.last_error, None);
        assert_eq!(record.next_refresh, Some(later));
        let json = fs::read_to_string(&path).unwrap();
        assert!(json.contains("\"nextRefresh\""), "{json}");
        // a damaged record reads as empty, and the next change replaces it
        fs::write(&path, b"{not json").unwrap();
        assert_eq!(
            VolumeStatusRecord::read(&path),
            VolumeStatusRecord::default()
        );
    }

    #[test]
    fn ids_are_hmac_hex() {
        let key = NodeKey::from_bytes([7; 32]);
        let id = VolumeId::for_mount_dir(
            &key,
            "/var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity",
        );
        assert_eq!(id.as_str().len(), 64);
        assert_eq!(VolumeId::parse(id.as_str()).unwrap(), id);
        // stable for the same input, different for another path or key
        assert_eq!(
            id,
            VolumeId::for_mount_dir(
                &key,
                "/var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity"
            )
        );
        assert_ne!(id, VolumeId::for_mount_dir(&key, "/other"));
        assert_ne!(
            id,
            VolumeId::for_mount_dir(
                &NodeKey::from_bytes([8; 32]),
                "/var/lib/kubelet/pods/x/volumes/athenz~volume-driver/athenz-identity"
            )
        );
    }

    #[test]
    fn hmac_matches_rfc4231_test_case_2() {
        // RFC 4231 test case 2 uses key "Jefe"; check our hex and HMAC wiring with it.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn parse_rejects_everything_but_64_lowercase_hex() {
        let good = "a".repeat(64);
        VolumeId::parse(&good).unwrap();
        let cases = [
            String::new(),
            "a".repeat(63),
            "a".repeat(65),
            "A".repeat(64),
            "g".repeat(64),
            format!("../{}", "a".repeat(61)),
            format!("{}/", "a".repeat(63)),
            format!("{}\0", "a".repeat(63)),
            format!("{}%2e", "a".repeat(60)),
            format!(" {}", "a".repeat(63)),
            "é".repeat(32),
        ];
        for bad in cases {
            let err = VolumeId::parse(&bad).unwrap_err();
            assert!(err.to_string().contains("64 lowercase hex"), "{bad:?}");
        }
    }

    #[test]
    fn node_key_is_created_once_with_mode_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = VolumesDir::new(tmp.path().join("volumes"));
        let key = dir.load_or_create_node_key().unwrap();
        let again = dir.load_or_create_node_key().unwrap();
        assert_eq!(key.0, again.0);
        let meta = fs::metadata(dir.node_key_path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(dir.root()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(
            !format!("{key:?}").contains('7'),
            "debug must not print bytes"
        );
    }

    #[test]
    fn concurrent_creation_agrees_on_one_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(VolumesDir::new(tmp.path().join("volumes")));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let dir = dir.clone();
                std::thread::spawn(move || dir.load_or_create_node_key().unwrap().0)
            })
            .collect();
        let keys: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(keys.iter().all(|k| *k == keys[0]));
        // no temporary files are left behind
        let names: Vec<_> = fs::read_dir(dir.root())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [NODE_KEY_FILE]);
    }

    #[test]
    fn bad_node_keys_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = VolumesDir::new(tmp.path());
        dir.ensure().unwrap();
        fs::write(dir.node_key_path(), b"short").unwrap();
        fs::set_permissions(dir.node_key_path(), fs::Permissions::from_mode(0o600)).unwrap();
        let err = dir.load_or_create_node_key().unwrap_err();
        assert!(err.to_string().contains("not 32 bytes"), "{err}");
        fs::write(dir.node_key_path(), [1u8; 32]).unwrap();
        fs::set_permissions(dir.node_key_path(), fs::Permissions::from_mode(0o644)).unwrap();
        let err = dir.load_or_create_node_key().unwrap_err();
        assert!(err.to_string().contains("0600"), "{err}");
        fs::remove_file(dir.node_key_path()).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.node_key_path()).unwrap();
        assert!(dir.load_or_create_node_key().is_err(), "followed a symlink");
    }

    #[test]
    fn layout_paths() {
        let dir = VolumesDir::new("/v");
        let id = VolumeId::parse(&"0".repeat(64)).unwrap();
        let p = dir.volume(&id);
        let base = format!("/v/{}", "0".repeat(64));
        assert_eq!(p.dir, Path::new(&base));
        assert_eq!(p.data_json, Path::new(&format!("{base}/data.json")));
        assert_eq!(p.state_json, Path::new(&format!("{base}/state.json")));
        assert_eq!(p.id_file, Path::new(&format!("{base}/mount/id")));
        assert_eq!(p.connect, Path::new(&format!("{base}/mount/connect")));
    }

    /// A record replaces the old one whole, owner-only whatever the umask, and leaves no
    /// temporary file beside it; a reader never sees a part of it.
    #[test]
    fn a_record_is_replaced_whole_and_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let first = serde_json::json!({"certSerial": "01", "pad": "x".repeat(3000)});
        let second = serde_json::json!({"certSerial": "02"});
        write_json_record(&path, &first).unwrap();
        write_json_record(&path, &second).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let back: serde_json::Value = read_json_file(&path).unwrap();
        assert_eq!(back, second, "the second record, not a mix of both");
        let names: Vec<String> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["state.json"], "no temporary file is left");
        // a record whose directory is gone fails naming the path, and nothing is created
        let missing = tmp.path().join("gone").join("state.json");
        let err = write_json_record(&missing, &second)
            .unwrap_err()
            .to_string();
        assert!(err.contains("gone/state.json"), "{err}");
    }

    #[test]
    fn json_files_round_trip_and_limits() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("data.json");
        let data = VolumeData {
            namespace: "media-sports".into(),
            pod_name: "web".into(),
            pod_uid: "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c".into(),
            service_account: "web".into(),
            mount_dir: "/var/lib/kubelet/pods/x".into(),
            read_write: false,
            created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            csi: None,
        };
        data.validate().unwrap();
        write_json_file(&path, &data, 0o600).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let back: VolumeData = read_json_file(&path).unwrap();
        assert_eq!(back, data);
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\"createdAt\": \"2023-11-14T22:13:20Z\""),
            "{text}"
        );
        assert!(
            !text.contains("csi"),
            "a flex volume's data.json is unchanged: {text}"
        );
        let csi = VolumeData {
            csi: Some(CsiVolume {
                volume_id: "csi-abc".into(),
                mode: VolumeMode::CsiFiles,
                group: Some(2000),
                ip_san: false,
            }),
            ..data.clone()
        };
        write_json_file(&path, &csi, 0o600).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"mode\": \"files\""), "{text}");
        assert!(text.contains("\"ipSan\": false"), "{text}");
        assert_eq!(read_json_file::<VolumeData>(&path).unwrap(), csi);
        // a record from before `ipSAN` existed keeps the IP SAN it was issued with
        let mut older: serde_json::Value = serde_json::from_str(&text).unwrap();
        older["csi"].as_object_mut().unwrap().remove("ipSan");
        fs::write(&path, older.to_string()).unwrap();
        let older = read_json_file::<VolumeData>(&path).unwrap();
        assert!(older.csi.unwrap().ip_san);

        fs::write(&path, vec![b' '; 70 * 1024]).unwrap();
        let err = read_json_file::<VolumeData>(&path).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
        fs::write(&path, b"{\"namespace\": 1}").unwrap();
        let err = read_json_file::<VolumeData>(&path).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        let bad = VolumeData {
            pod_uid: "../../x".into(),
            ..data
        };
        assert!(bad.validate().unwrap_err().to_string().contains("pod.uid"));
    }
}
