//! A pod's long-running container (a sidecar), however [`super::PodRuntime`] started it: a
//! container in the pod's sandbox or a process in the pod's cgroup, stopped, killed, restarted
//! and read the same way.

use super::GRACE;
use crate::procs::Process;
use anyhow::bail;
use athenz_testbed::runtime::{ContainerSpec, Pod};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A pod's long-running container (a sidecar), however it was started.
pub enum PodContainer {
    /// A process in the pod's cgroup.
    Process(Box<Process>),
    /// A container in the pod's sandbox.
    Container {
        /// Its pod.
        pod: Arc<Pod>,
        /// Its name in the pod.
        name: String,
        /// What it runs (to start it again).
        spec: ContainerSpec,
        /// Its exit status once [`PodContainer::stop`] ended it.
        stopped: Option<i32>,
    },
}

impl PodContainer {
    /// Fails (with its log) if it has ended.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Process(p) => p.check_alive(),
            Self::Container { pod, name, .. } => {
                if pod.is_running(name) {
                    return Ok(());
                }
                let name = name.clone();
                bail!("container {name} exited; its log:\n{}", self.log_tail())
            }
        }
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        match self {
            Self::Process(p) => p.log_path().to_owned(),
            Self::Container { pod, name, .. } => pod.container_log_path(name).unwrap_or_default(),
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(self.log_path()).unwrap_or_default())
    }

    /// What /proc says of its process now (zeros once it is gone).
    pub fn usage(&self) -> crate::procs::Usage {
        crate::procs::Usage::of(self.pid().unwrap_or(0))
    }

    /// Starts it again if it has ended, as kubelet restarts a container (a new container id in
    /// the same pod); says whether it did.
    pub async fn restart_if_exited(&mut self) -> anyhow::Result<bool> {
        match self {
            Self::Process(p) => p.restart_if_exited(),
            Self::Container {
                pod,
                name,
                spec,
                stopped,
            } => {
                if pod.is_running(name) {
                    return Ok(false);
                }
                pod.stop_container(name, Duration::ZERO).await?;
                pod.start_container(name, spec).await?;
                *stopped = None;
                Ok(true)
            }
        }
    }

    /// Kills it with SIGKILL, through the runtime for a container (by id, as a node's OOM
    /// killer would end it); kubelet's restart is [`PodContainer::restart_if_exited`].
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Process(p) => {
                if let Ok(pid) = i32::try_from(p.pid()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                Ok(())
            }
            Self::Container { pod, name, .. } => Ok(pod.kill_container(name, "KILL").await?),
        }
    }

    /// Its container id (`None` for a process).
    pub fn container_id(&self) -> Option<String> {
        match self {
            Self::Process(_) => None,
            Self::Container { pod, name, .. } => pod.container_id(name),
        }
    }

    /// Its process on the host, while it runs.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Self::Process(p) => Some(p.pid()),
            Self::Container { pod, name, .. } => {
                pod.container_pid(name).and_then(|p| u32::try_from(p).ok())
            }
        }
    }

    /// Waits up to `limit` for it to end by itself; whether it succeeded.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<bool> {
        match self {
            Self::Process(p) => p.wait_exit(limit).await,
            Self::Container {
                pod, name, stopped, ..
            } => {
                let code = match stopped {
                    Some(code) => Some(*code),
                    None => pod.wait_container(name, limit).await?,
                };
                Ok(code == Some(0))
            }
        }
    }

    /// Stops it as kubelet does (SIGTERM, the grace period, SIGKILL).
    pub async fn stop(&mut self) {
        match self {
            Self::Process(p) => p.stop().await,
            Self::Container {
                pod, name, stopped, ..
            } => match pod.stop_container(name, GRACE).await {
                Ok(code) => *stopped = code.or(*stopped),
                Err(e) => tracing::warn!(container = %name, error = %e, "stopping a container"),
            },
        }
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
