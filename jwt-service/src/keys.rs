//! The signing key directory: private keys named `v<N>.pem`; the highest usable N signs. Other
//! names are ignored quietly (a Kubernetes secret volume holds `..data` links and the like). The
//! directory is re-read periodically, so a new version signs without a restart; an unreadable new
//! file is logged and skipped, and the previous key keeps signing.

use crate::signer::JwtSigner;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// The key that signs now.
#[derive(Debug)]
pub struct ActiveKey {
    /// `v<N>`, the JWT `kid`.
    pub kid: String,
    /// N.
    pub version: u64,
    /// The parsed key.
    pub signer: JwtSigner,
}

/// Which file a key was loaded from: (version, mtime, length).
type Origin = (u64, Option<SystemTime>, u64);

/// Watches a key directory.
pub struct KeyDir {
    dir: PathBuf,
    active: RwLock<Arc<ActiveKey>>,
    /// (version, mtime, len) of the file the active key came from.
    loaded_from: RwLock<Origin>,
}

/// The version in a file name `v<N>.pem`, if it is one.
pub fn version_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix('v')?.strip_suffix(".pem")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 18 {
        return None;
    }
    digits.parse().ok()
}

/// Candidate key files, highest version first.
fn candidates(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            version_of(name.to_str()?).map(|v| (v, e.path()))
        })
        .collect();
    found.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    Ok(found)
}

fn stamp(path: &Path) -> (Option<SystemTime>, u64) {
    std::fs::metadata(path)
        .map(|m| (m.modified().ok(), m.len()))
        .unwrap_or((None, 0))
}

fn load_best(dir: &Path) -> Result<(ActiveKey, Origin), String> {
    let files = candidates(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut problems = Vec::new();
    for (version, path) in files {
        let (mtime, len) = stamp(&path);
        if len > 64 * 1024 {
            problems.push(format!("{}: too large", path.display()));
            continue;
        }
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|pem| JwtSigner::from_pem(&pem))
        {
            Ok(signer) => {
                return Ok((
                    ActiveKey {
                        kid: format!("v{version}"),
                        version,
                        signer,
                    },
                    (version, mtime, len),
                ));
            }
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    Err(if problems.is_empty() {
        format!("no v<N>.pem private key in {}", dir.display())
    } else {
        format!(
            "no usable key in {}: {}",
            dir.display(),
            problems.join("; ")
        )
    })
}

impl KeyDir {
    /// Loads the highest usable key; fails if there is none.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let (key, from) = load_best(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            active: RwLock::new(Arc::new(key)),
            loaded_from: RwLock::new(from),
        })
    }

    /// The key that signs now.
    pub fn active(&self) -> Arc<ActiveKey> {
        Arc::clone(
            &self
                .active
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Re-reads the directory; returns the new kid if the signing key changed.
    pub fn reload(&self) -> Option<String> {
        let best = candidates(&self.dir).ok()?.into_iter().next()?;
        let (mtime, len) = stamp(&best.1);
        let current = *self
            .loaded_from
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current == (best.0, mtime, len) {
            return None;
        }
        match load_best(&self.dir) {
            Ok((key, from)) => {
                let kid = key.kid.clone();
                *self
                    .active
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(key);
                *self
                    .loaded_from
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = from;
                Some(kid)
            }
            Err(e) => {
                tracing::warn!(error = %e, "signing keys changed but none is usable; keeping the current key");
                None
            }
        }
    }

    /// Re-reads the directory every `interval` in the background.
    pub fn spawn_watcher(
        self: &Arc<Self>,
        interval: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        athenz_core::daemon::every(interval, move || {
            if let Some(kid) = this.reload() {
                tracing::info!(%kid, "now signing with a new key version");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names() {
        assert_eq!(version_of("v1.pem"), Some(1));
        assert_eq!(version_of("v12.pem"), Some(12));
        for bad in [
            "v.pem",
            "1.pem",
            "v1.key",
            "v1.pem.bak",
            "..data",
            "vx.pem",
            "v-1.pem",
            "V1.pem",
        ] {
            assert_eq!(version_of(bad), None, "{bad}");
        }
    }
}
