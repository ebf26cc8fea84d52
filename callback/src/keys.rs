//! The JWT public keys: a directory of `v<N>.pem` (SubjectPublicKeyInfo PEM), re-read periodically
//! so added and removed versions take effect within seconds (docs/design.md §4.4). Each key
//! remembers its family, so a token's `alg` must match the key its `kid` names.

use athenz_core::crypto::{KeyKind, PublicKey};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

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

    /// Re-reads the directory (added and removed versions take effect).
    pub fn reload(&self) {
        match read_dir(&self.dir) {
            Ok(keys) => {
                *self
                    .keys
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot re-read the public keys; keeping the current ones")
            }
        }
    }

    /// Re-reads every `interval` in the background.
    pub fn spawn_watcher(
        self: &Arc<Self>,
        interval: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        athenz_core::daemon::every(interval, move || this.reload())
    }
}
