//! A real OCI runtime (runc or crun, from the distribution's packages) driven by its command line,
//! as containerd's and CRI-O's shims drive it: `run` a bundle, `kill` and `delete` by id, `state`.
//!
//! Two lessons of this host are built in (docs/development.md, "Dependency pitfalls"): a container
//! inherits the runtime's standard streams, so they are a log file and `/dev/null`, never a pipe
//! read to its end; and containers are stopped by id (`kill`, then `delete`), never by signalling
//! the runtime's process, which would orphan them.

use super::{RuntimeError, RuntimeKind};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// How long a `kill`, `delete` or `state` may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// A runc or crun binary with the state directory its containers are kept in.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    kind: RuntimeKind,
    binary: PathBuf,
    state_root: PathBuf,
    /// crun on a cgroup v1 + v2 hybrid host: an empty file bound over the v2 mount's
    /// `cgroup.controllers` in a private mount namespace, for `run` only (crun 1.8 refuses a
    /// hybrid host whose v2 mount has controllers).
    hybrid_mask: Option<(PathBuf, PathBuf)>,
}

/// What `state <id>` says of a container.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ContainerState {
    /// `created`, `running`, `paused` or `stopped`.
    pub status: String,
    /// Its process on the host (0 once stopped).
    pub pid: i32,
}

impl OciRuntime {
    /// The runtime `kind` (runc or crun) found on `PATH`, keeping its containers' state under
    /// `state_root` (its `--root`, one per stack so stacks never see each other's containers).
    pub fn find(kind: RuntimeKind, state_root: &Path) -> Result<Self, RuntimeError> {
        let name = match kind {
            RuntimeKind::Runc => "runc",
            RuntimeKind::Crun => "crun",
            RuntimeKind::Process => {
                return Err(RuntimeError::Unavailable(
                    "`process` is not an OCI runtime".into(),
                ));
            }
        };
        let binary = on_path(name).ok_or_else(|| {
            RuntimeError::Unavailable(format!("{name} is not installed (apt-get install {name})"))
        })?;
        std::fs::create_dir_all(state_root).map_err(|e| RuntimeError::io(state_root, e))?;
        let hybrid_mask = match (kind, hybrid_v2_controllers()) {
            (RuntimeKind::Crun, Some(controllers)) => {
                let empty = state_root.join("empty-cgroup.controllers");
                std::fs::write(&empty, b"").map_err(|e| RuntimeError::io(&empty, e))?;
                Some((empty, controllers))
            }
            _ => None,
        };
        Ok(Self {
            kind,
            binary,
            state_root: state_root.to_owned(),
            hybrid_mask,
        })
    }

    /// runc or crun.
    pub fn kind(&self) -> RuntimeKind {
        self.kind
    }

    /// The runtime's binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        command.arg("--root").arg(&self.state_root).args(args);
        command
    }

    /// `run --bundle <bundle> --pid-file <pid_file> <id>` in the foreground: the child is the
    /// runtime, which starts the container, waits for its process and exits with its status
    /// (runc and crun both remove a container they ran in the foreground when it ends). The
    /// container's stdout and stderr are `log`, its stdin `/dev/null`.
    pub fn run(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        log: &Path,
    ) -> Result<tokio::process::Child, RuntimeError> {
        let out = std::fs::File::create(log).map_err(|e| RuntimeError::io(log, e))?;
        let err = out.try_clone().map_err(|e| RuntimeError::io(log, e))?;
        let bundle = bundle.display().to_string();
        let pid_file = pid_file.display().to_string();
        let run_args = ["run", "--bundle", &bundle, "--pid-file", &pid_file, id];
        let mut command = match &self.hybrid_mask {
            None => self.command(&run_args),
            Some((empty, controllers)) => {
                // unshare execs sh, which execs crun: the child is crun itself
                let mut c = tokio::process::Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
                    .arg(r#"mount --bind "$0" "$1" && shift && exec "$@""#)
                    .arg(empty)
                    .arg(controllers)
                    .arg(&self.binary)
                    .arg("--root")
                    .arg(&self.state_root)
                    .args(run_args);
                c
            }
        };
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(false);
        command.spawn().map_err(|e| RuntimeError::Spawn {
            what: format!("{} run {id}", self.binary.display()),
            reason: e.to_string(),
        })
    }

    /// `kill <id> <signal>`; a container that is already gone, or whose process has ended
    /// (runc: "container not running"; crun: "No such process"), is not an error.
    pub async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        match self.control(&["kill", id, signal]).await {
            Ok(_) => Ok(()),
            Err(RuntimeError::Failed { ref output, .. })
                if is_gone(output)
                    || output.contains("not running")
                    || output.contains("No such process") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `delete --force <id>`; a container that is already gone is not an error.
    pub async fn delete(&self, id: &str) -> Result<(), RuntimeError> {
        match self.control(&["delete", "--force", id]).await {
            Ok(_) => Ok(()),
            Err(RuntimeError::Failed { ref output, .. }) if is_gone(output) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `state <id>`, or `None` when the runtime does not know the container.
    pub async fn state(&self, id: &str) -> Result<Option<ContainerState>, RuntimeError> {
        match self.control(&["state", id]).await {
            Ok(json) => serde_json::from_str(&json)
                .map(Some)
                .map_err(|e| RuntimeError::Failed {
                    what: format!("state {id}"),
                    output: format!("unreadable answer ({e}): {json}"),
                }),
            Err(RuntimeError::Failed { ref output, .. }) if is_gone(output) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The ids of every container under this runtime's state directory.
    pub async fn list(&self) -> Result<Vec<String>, RuntimeError> {
        let text = self.control(&["list", "--quiet"]).await?;
        Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// Runs a control command (its output is read whole: these commands start no container).
    async fn control(&self, args: &[&str]) -> Result<String, RuntimeError> {
        let what = args.join(" ");
        let output = tokio::time::timeout(
            CONTROL_TIMEOUT,
            self.command(args).stdin(Stdio::null()).output(),
        )
        .await
        .map_err(|_| RuntimeError::Timeout {
            what: what.clone(),
            after: CONTROL_TIMEOUT,
        })?
        .map_err(|e| RuntimeError::Spawn {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(RuntimeError::Failed {
                what,
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            })
        }
    }
}

/// runc: "container does not exist"; crun: "No such file or directory" for an unknown id.
fn is_gone(output: &str) -> bool {
    output.contains("does not exist") || output.contains("No such file or directory")
}

/// `name` in a directory of `PATH`, executable.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// On a hybrid host (cgroup v1 hierarchies, and the v2 one mounted beside them) whose v2 mount
/// has controllers enabled: that mount's `cgroup.controllers`.
fn hybrid_v2_controllers() -> Option<PathBuf> {
    let (v2, v1) = crate::cgroups::hierarchies();
    let v2 = v2?;
    v1?;
    let controllers = v2.join("cgroup.controllers");
    let text = std::fs::read_to_string(&controllers).ok()?;
    (!text.trim().is_empty()).then_some(controllers)
}
