//! Faults a chaos run injects into the stand-ins: a small JSON file the run rewrites (atomically)
//! and each stand-in process follows. A file, not a control route, so the stand-ins serve
//! exactly the routes of what they stand in for, and injecting a fault needs no credentials:
//! whoever may write the stack's state directory already owns the stack.
//!
//! `zts --faults-file F` follows `zts_instance_status` and `zts_next_ca`; `kube-standins --faults-file F` the
//! `api_*` and `kubelet_*` fields. A missing file means no fault; a malformed one is logged
//! and the faults in force are kept.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a stand-in looks at the file.
pub const POLL: Duration = Duration::from_millis(100);

/// Largest faults file read (it is a handful of fields).
const MAX_FILE: u64 = 4096;

/// The faults in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// The dev ZTS answers every instance register and refresh with this status (4xx or 5xx)
    /// and a ZTS error body, as a ZTS in trouble does.
    pub zts_instance_status: Option<u16>,
    /// The dev ZTS serves and signs under its next CA (`next-ca.pem` in its state directory),
    /// as a ZTS moved to a new CA does once every client trusts both. One way: false afterwards
    /// does not move it back.
    pub zts_next_ca: bool,
    /// The API stand-in answers 404 to every single-pod read, as for a deleted pod: the
    /// callback then denies every launch and refresh.
    pub api_pods_missing: bool,
    /// The API stand-in's port is closed: every connection is refused, as with an API server
    /// that is down (the callback then answers 504 and starting pods wait).
    pub api_unreachable: bool,
    /// The API stand-in answers every request with this status (429 or 5xx) and a Kubernetes
    /// `Status`, as an overloaded or failing API server does.
    pub api_status: Option<u16>,
    /// The kubelet stand-ins answer `/pods` after this many milliseconds.
    pub kubelet_delay_ms: u64,
    /// The kubelet stand-ins answer `/pods` with 500.
    pub kubelet_failing: bool,
    /// The kubelet stand-ins list no pods, as a kubelet that has not synced them.
    pub kubelet_omit_pods: bool,
}

/// Why a faults file was not taken.
#[derive(Debug, thiserror::Error)]
pub enum FaultsError {
    /// Reading or writing it failed.
    #[error("faults file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// It is not a faults document.
    #[error("faults file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Faults {
    /// Parses and checks a faults document.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        if !value.is_object() {
            return Err("not a JSON object".into());
        }
        let faults: Self = serde_json::from_value(value).map_err(|e| e.to_string())?;
        if let Some(status) = faults.zts_instance_status
            && !(400..=599).contains(&status)
        {
            return Err(format!(
                "zts_instance_status {status} is not an error status (400-599)"
            ));
        }
        if let Some(status) = faults.api_status
            && !(status == 429 || (500..=599).contains(&status))
        {
            return Err(format!(
                "api_status {status} is not a failing API server's status (429 or 500-599)"
            ));
        }
        if faults.kubelet_delay_ms > 60_000 {
            return Err(format!(
                "kubelet_delay_ms {} is over a minute",
                faults.kubelet_delay_ms
            ));
        }
        Ok(faults)
    }

    /// The faults in `path`; none when the file does not exist.
    pub fn read(path: &Path) -> Result<Self, FaultsError> {
        use std::io::Read;
        let io = |source| FaultsError::Io {
            path: path.to_owned(),
            source,
        };
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(io(e)),
        };
        let mut json = Vec::new();
        file.take(MAX_FILE + 1).read_to_end(&mut json).map_err(io)?;
        if json.len() as u64 > MAX_FILE {
            return Err(FaultsError::Invalid {
                path: path.to_owned(),
                reason: format!("larger than {MAX_FILE} bytes"),
            });
        }
        Self::parse(&json).map_err(|reason| FaultsError::Invalid {
            path: path.to_owned(),
            reason,
        })
    }

    /// Puts these faults in force: writes `path` atomically (a stand-in never reads half).
    pub fn write(&self, path: &Path) -> Result<(), FaultsError> {
        let io = |source| FaultsError::Io {
            path: path.to_owned(),
            source,
        };
        let json = serde_json::to_vec_pretty(self).map_err(|e| io(e.into()))?;
        let staging = path.with_extension("tmp");
        std::fs::write(&staging, json).map_err(io)?;
        std::fs::rename(&staging, path).map_err(io)
    }
}

/// Follows `path` for ever: calls `apply` with the faults at the start and whenever they
/// change. Run it as a task beside the stand-in's server.
pub async fn follow(path: PathBuf, mut apply: impl FnMut(&Faults)) {
    let mut current = Faults::default();
    apply(&current);
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        match Faults::read(&path) {
            Ok(faults) if faults != current => {
                tracing::warn!(?faults, "injecting faults");
                apply(&faults);
                current = faults;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "faults file not taken; keeping the faults in force")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_missing_file_is_no_fault_and_a_written_one_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.json");
        assert_eq!(Faults::read(&path).unwrap(), Faults::default());
        let faults = Faults {
            zts_instance_status: Some(503),
            kubelet_delay_ms: 2000,
            ..Faults::default()
        };
        faults.write(&path).unwrap();
        assert_eq!(Faults::read(&path).unwrap(), faults);
        assert!(!path.with_extension("tmp").exists());
    }

    #[test]
    fn malformed_hostile_and_oversized_files_are_refused_with_the_reason() {
        for (json, want) in [
            (&b"{"[..], "EOF"),
            (b"[]", "not a JSON object"),
            (b"\"faults\"", "not a JSON object"),
            (br#"{"zts_instance_status": 200}"#, "not an error status"),
            (br#"{"zts_instance_status": 70000}"#, "invalid value"),
            (br#"{"kubelet_delay_ms": 3600000}"#, "over a minute"),
            (
                br#"{"api_status": 404}"#,
                "not a failing API server's status",
            ),
            (
                br#"{"api_status": 200}"#,
                "not a failing API server's status",
            ),
            (br#"{"api_unreachable": "yes"}"#, "invalid type"),
            (
                br#"{"kubelet_failing": true, "rm": "-rf"}"#,
                "unknown field",
            ),
            (br#"{"kubelet_failing": "yes"}"#, "invalid type"),
        ] {
            let err = Faults::parse(json).unwrap_err();
            assert!(
                err.contains(want),
                "{}: {err}",
                String::from_utf8_lossy(json)
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.json");
        let mut big = br#"{"kubelet_failing": true"#.to_vec();
        big.resize(10_000, b' ');
        big.push(b'}');
        std::fs::write(&path, big).unwrap();
        let err = Faults::read(&path).unwrap_err().to_string();
        assert!(err.contains("larger than 4096 bytes"), "{err}");
    }

    #[tokio::test]
    async fn follow_applies_changes_and_keeps_faults_through_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.json");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = {
            let seen = seen.clone();
            tokio::spawn(follow(path.clone(), move |f| {
                seen.lock().unwrap().push(f.clone())
            }))
        };
        tokio::time::sleep(POLL * 2).await;
        let failing = Faults {
            kubelet_failing: true,
            ..Faults::default()
        };
        failing.write(&path).unwrap();
        tokio::time::sleep(POLL * 2).await;
        std::fs::write(&path, b"not json").unwrap();
        tokio::time::sleep(POLL * 2).await;
        Faults::default().write(&path).unwrap();
        tokio::time::sleep(POLL * 2).await;
        task.abort();
        // the start, the fault, its end: the bad file changed nothing
        assert_eq!(
            *seen.lock().unwrap(),
            [Faults::default(), failing, Faults::default()]
        );
    }
}
