//! The JWT public keys: a directory of `v<N>.pem` (SubjectPublicKeyInfo PEM), re-read periodically
//! so added and removed versions take effect within seconds (docs/design.md §4.4). Each key
//! remembers its family, so a token's `alg` must match the key its `kid` names.

use athenz_core::crypto::{KeyKind, PublicKey};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

/// A verification key.
#[derive(Clone)]
pub struct VerifyKey {
    /// The only algorithm this key verifies.
    pub alg: Algorithm,
    /// jsonwebtoken's parsed key.
    pub key: DecodingKey,
}

/// The keys by kid (`v<N>`).
pub struct PublicKeys {
    dir: PathBuf,
    keys: RwLock<Arc<BTreeMap<String, VerifyKey>>>,
    /// The key files as they were when last read: a reload with the same ones parses nothing.
    read_from: Mutex<Stamps>,
}

/// Each `v<N>.pem` file's inode, modification time and length: a Secret or ConfigMap volume
/// swaps in new files (new inodes), and an edit in place changes the time or the length.
type Stamps = BTreeMap<String, (u64, Option<SystemTime>, u64)>;

/// The stamps of the key files in `dir` (the files a symlink names, as a volume's are).
fn stamps(dir: &Path) -> std::io::Result<Stamps> {
    use std::os::unix::fs::MetadataExt;
    let mut stamps = Stamps::new();
    for entry in std::fs::read_dir(dir)?.filter_map(Result::ok) {
        let Some(kid) = entry.file_name().to_str().and_then(version_name) else {
            continue;
        };
        if let Ok(meta) = std::fs::metadata(entry.path()) {
            stamps.insert(kid, (meta.ino(), meta.modified().ok(), meta.len()));
        }
    }
    Ok(stamps)
}

fn version_name(name: &str) -> Option<String> {
    let digits = name.strip_prefix('v')?.strip_suffix(".pem")?;
    (!digits.is_empty() && digits.len() <= 18 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("v{digits}"))
}

fn parse_key(pem: &str) -> Result<VerifyKey, String> {
    let public = PublicKey::from_pem(pem).map_err(|e| e.to_string())?;
    match public.kind() {
        KeyKind::EcP256 => Ok(VerifyKey {
            alg: Algorithm::ES256,
            key: DecodingKey::from_ec_pem(pem.as_bytes()).map_err(|e| e.to_string())?,
        }),
        KeyKind::Rsa => Ok(VerifyKey {
            alg: Algorithm::RS256,
            key: DecodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| e.to_string())?,
        }),
        KeyKind::Other => Err("only EC P-256 and RSA keys are supported".into()),
    }
}

fn read_dir(dir: &Path) -> Result<BTreeMap<String, VerifyKey>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut keys = BTreeMap::new();
    for entry in entries.filter_map(Result::ok) {
        let Some(kid) = entry.file_name().to_str().and_then(version_name) else {
            continue;
        };
        let path = entry.path();
        let parsed = std::fs::metadata(&path)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                if m.len() > 64 * 1024 {
                    Err("too large".to_string())
                } else {
                    std::fs::read_to_string(&path).map_err(|e| e.to_string())
                }
            })
            .and_then(|pem| parse_key(&pem));
        match parsed {
            Ok(key) => {
                keys.insert(kid, key);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "skipping an unusable public key")
            }
        }
    }
    Ok(keys)
}

impl PublicKeys {
    /// Loads the directory; fails if it holds no usable key.
    pub fn load(dir: &Path) -> Result<Self, String> {
        // stamped before reading: a file changed in between is read again at the next reload
        let read_from = stamps(dir).unwrap_or_default();
        let keys = read_dir(dir)?;
        if keys.is_empty() {
            return Err(format!(
                "no usable v<N>.pem public key in {}",
                dir.display()
            ));
        }
        Ok(Self {
            dir: dir.to_owned(),
            keys: RwLock::new(Arc::new(keys)),
            read_from: Mutex::new(read_from),
        })
    }

    /// The key of `kid`.
    pub fn get(&self, kid: &str) -> Option<VerifyKey> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(kid)
            .cloned()
    }

    /// Known kids.
    pub fn kids(&self) -> Vec<String> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Re-reads the directory if its key files changed (added, removed and replaced versions
    /// take effect); true if it did.
    pub fn reload(&self) -> bool {
        let now = match stamps(&self.dir) {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %e, dir = %self.dir.display(), "cannot list the public keys; keeping the current ones");
                return false;
            }
        };
        let mut read_from = self
            .read_from
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *read_from == now {
            return false;
        }
        match read_dir(&self.dir) {
            Ok(keys) => {
                *self
                    .keys
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
                *read_from = now;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot re-read the public keys; keeping the current ones");
                false
            }
        }
    }

    /// Re-reads every `interval` in the background.
    pub fn spawn_watcher(
        self: &Arc<Self>,
        interval: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        athenz_core::daemon::every(interval, move || {
            this.reload();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::crypto::{KeyAlgorithm, PrivateKey};

    fn public_pem(alg: KeyAlgorithm) -> String {
        let private = PrivateKey::generate(alg).unwrap().to_pkcs8_pem().unwrap();
        athenz_jwt_service::signer::JwtSigner::from_pem(private.expose().as_bytes())
            .unwrap()
            .public_key_pem()
            .unwrap()
    }

    /// A reload parses the keys only when a file was added, removed or replaced: an idle
    /// callback re-listed its keys every 5 s and parsed every one of them again.
    #[test]
    fn only_changed_key_files_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("v1.pem"), public_pem(KeyAlgorithm::P256)).unwrap();
        let keys = PublicKeys::load(dir.path()).unwrap();
        assert_eq!(keys.get("v1").unwrap().alg, Algorithm::ES256);
        assert!(!keys.reload(), "nothing changed");

        // replaced as a Secret volume replaces it: another file, here another algorithm
        let staged = dir.path().join("..v1.tmp");
        std::fs::write(&staged, public_pem(KeyAlgorithm::Rsa2048)).unwrap();
        std::fs::rename(&staged, dir.path().join("v1.pem")).unwrap();
        assert!(keys.reload());
        assert_eq!(keys.get("v1").unwrap().alg, Algorithm::RS256);
        assert!(!keys.reload());

        std::fs::write(dir.path().join("v2.pem"), public_pem(KeyAlgorithm::P256)).unwrap();
        assert!(keys.reload());
        assert_eq!(keys.kids(), ["v1", "v2"]);
        std::fs::remove_file(dir.path().join("v1.pem")).unwrap();
        assert!(keys.reload());
        assert_eq!(keys.kids(), ["v2"]);

        // a file that is not a key version changes nothing
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert!(!keys.reload());
    }
}
