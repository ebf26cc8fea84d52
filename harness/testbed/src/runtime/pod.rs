//! A pod as kubelet has a CRI runtime make it: a sandbox, then containers in it, each an OCI
//! bundle run by the real runtime; init containers to completion (restarted with back-off while
//! they fail), the others left running; and deletion as kubelet does it (SIGTERM, the grace
//! period, SIGKILL, `delete`, the pod's cgroup removed in every hierarchy: the runtime leaves
//! `pod<uid>` behind).

use super::bundle::{self, BundleSpec, Namespaces, Rootfs, VolumeMount};
use super::oci::OciRuntime;
use super::{Qos, RuntimeError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::Child;

/// How long a container may take to start (its process running).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a container may take to go once SIGKILLed.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// What a container runs.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// Program and arguments (paths in the container).
    pub args: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Working directory in the container.
    pub cwd: String,
    /// The pod's volumes it mounts.
    pub volumes: Vec<VolumeMount>,
}

/// A container started: its id and host pid, and what starting it cost.
#[derive(Debug, Clone)]
pub struct Started {
    /// Container id (64 hex digits, as containerd makes them).
    pub id: String,
    /// Its process, as the host sees it.
    pub pid: i32,
    /// From asking the runtime to the container's process running (create + start).
    pub runtime_share: Duration,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

/// A container that ran to its end.
#[derive(Debug, Clone)]
pub struct Finished {
    /// How it started.
    pub started: Started,
    /// Its exit status (128 + the signal when killed by one), as the runtime reports it.
    pub exit_code: i32,
}

impl Finished {
    /// Its log, read whole.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.started.log).unwrap_or_default()
    }
}

/// Kubelet's restart back-off for a failing container: 10 s, doubling, at most 5 min
/// (`pkg/kubelet/kubelet.go`, `backOffPeriod` and `MaxContainerBackOff`).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

struct Running {
    started: Started,
    child: Child,
}

/// A pod: its sandbox and the containers running in it.
pub struct Pod {
    runtime: Arc<OciRuntime>,
    uid: String,
    /// `/<cgroup root>/kubepods[/<qos>]/pod<uid>`.
    cgroup_parent: String,
    dir: PathBuf,
    rootfs: Rootfs,
    sandbox: Started,
    /// The sandbox's runtime process, until the pod is removed.
    sandbox_child: std::sync::Mutex<Option<Child>>,
    /// Running containers by name (a std mutex: never held across an await).
    containers: std::sync::Mutex<BTreeMap<String, Running>>,
}

impl Pod {
    /// Makes pod `uid`'s sandbox (a pause process holding its network, IPC and UTS namespaces,
    /// loopback up, in the pod's cgroup; the host's network with `host_network`, as for a
    /// `hostNetwork: true` pod), its bundles and logs under `dir`.
    pub async fn start(
        runtime: Arc<OciRuntime>,
        uid: &str,
        qos: Qos,
        cgroup_root: &str,
        rootfs: Rootfs,
        dir: &Path,
        host_network: bool,
    ) -> Result<Self, RuntimeError> {
        athenz_core::names::validate_uid("pod uid", uid)
            .map_err(|e| RuntimeError::Invalid(e.to_string()))?;
        let cgroup_parent = format!(
            "/{}/{}pod{uid}",
            cgroup_root.trim_matches('/'),
            qos.kubepods_dir()
        );
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io(dir, e))?;
        let pause = ContainerSpec {
            // coreutils' sleep as the pause process: the sandbox is stopped with SIGKILL, as
            // containerd stops a sandbox's task
            args: vec!["/usr/bin/sleep".into(), "infinity".into()],
            cwd: "/".into(),
            ..ContainerSpec::default()
        };
        let namespaces = if host_network {
            Namespaces::HostNetworkSandbox
        } else {
            Namespaces::Sandbox
        };
        let sandbox = launch(
            &runtime,
            &cgroup_parent,
            dir,
            &rootfs,
            "sandbox",
            &pause,
            namespaces,
        )
        .await?;
        let pod = Self {
            runtime,
            uid: uid.to_owned(),
            cgroup_parent,
            dir: dir.to_owned(),
            rootfs,
            sandbox: sandbox.started,
            sandbox_child: std::sync::Mutex::new(Some(sandbox.child)),
            containers: std::sync::Mutex::new(BTreeMap::new()),
        };
        if !host_network {
            pod.loopback_up().await?;
        }
        Ok(pod)
    }

    /// The pod's uid.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The sandbox's process on the host.
    pub fn sandbox_pid(&self) -> i32 {
        self.sandbox.pid
    }

    /// What starting the sandbox cost.
    pub fn sandbox_started(&self) -> &Started {
        &self.sandbox
    }

    /// The pod's cgroup, as `linux.cgroupsPath` names its parent.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// The CNI loopback plugin's work: `lo` up in the sandbox's network namespace.
    async fn loopback_up(&self) -> Result<(), RuntimeError> {
        let net = format!("--net=/proc/{}/ns/net", self.sandbox_pid());
        let output = tokio::time::timeout(
            START_TIMEOUT,
            tokio::process::Command::new("nsenter")
                .args([net.as_str(), "ip", "link", "set", "lo", "up"])
                .output(),
        )
        .await
        .map_err(|_| RuntimeError::Timeout {
            what: "bringing the sandbox's loopback up".into(),
            after: START_TIMEOUT,
        })?
        .map_err(|e| RuntimeError::Spawn {
            what: "nsenter ip link set lo up".into(),
            reason: e.to_string(),
        })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(RuntimeError::Failed {
                what: "nsenter ip link set lo up".into(),
                output: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        }
    }

    /// Starts container `name` and leaves it running (a sidecar or an application).
    pub async fn start_container(
        &self,
        name: &str,
        spec: &ContainerSpec,
    ) -> Result<Started, RuntimeError> {
        if self.lock().contains_key(name) {
            return Err(RuntimeError::Invalid(format!(
                "container {name} of pod {} is there already",
                self.uid
            )));
        }
        let running = self.launch(name, spec).await?;
        let started = running.started.clone();
        self.lock().insert(name.to_owned(), running);
        Ok(started)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Running>> {
        // a panic while holding it leaves a map that is still whole
        self.containers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends `signal` to container `name` through the runtime (`kill <id> <signal>`), as a
    /// node's OOM killer or an operator's `crictl stop` would reach it; it stays listed until
    /// it is stopped or waited for.
    pub async fn kill_container(&self, name: &str, signal: &str) -> Result<(), RuntimeError> {
        let id = self.lock().get(name).map(|r| r.started.id.clone());
        match id {
            Some(id) => self.runtime.kill(&id, signal).await,
            None => Ok(()),
        }
    }

    /// Running container `name`'s id.
    pub fn container_id(&self, name: &str) -> Option<String> {
        self.lock().get(name).map(|r| r.started.id.clone())
    }

    /// Running container `name`'s process on the host.
    pub fn container_pid(&self, name: &str) -> Option<i32> {
        self.lock().get(name).map(|r| r.started.pid)
    }

    /// Container `name`'s log file.
    pub fn container_log_path(&self, name: &str) -> Option<PathBuf> {
        self.lock().get(name).map(|r| r.started.log.clone())
    }

    /// Waits up to `limit` for container `name` to end by itself; then deletes it and gives
    /// its exit status (`None` if there is no such container). Still running at `limit`: an
    /// error, and it keeps running.
    pub async fn wait_container(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<Option<i32>, RuntimeError> {
        let Some(mut running) = self.lock().remove(name) else {
            return Ok(None);
        };
        match tokio::time::timeout(limit, running.child.wait()).await {
            Ok(status) => {
                let status = status.map_err(|e| RuntimeError::Spawn {
                    what: format!("waiting for {name}"),
                    reason: e.to_string(),
                })?;
                self.runtime.delete(&running.started.id).await?;
                Ok(Some(exit_code(status)))
            }
            Err(_) => {
                self.lock().insert(name.to_owned(), running);
                Err(RuntimeError::Timeout {
                    what: format!("container {name} of pod {} to end", self.uid),
                    after: limit,
                })
            }
        }
    }

    /// Runs init container `name` once, to its end (at most `timeout`, then it is killed).
    pub async fn run_once(
        &self,
        name: &str,
        spec: &ContainerSpec,
        timeout: Duration,
    ) -> Result<Finished, RuntimeError> {
        let mut running = self.launch(name, spec).await?;
        let exit_code = match tokio::time::timeout(timeout, running.child.wait()).await {
            Ok(status) => exit_code(status.map_err(|e| RuntimeError::Spawn {
                what: format!("waiting for {name}"),
                reason: e.to_string(),
            })?),
            Err(_) => {
                self.kill_and_reap(&mut running).await?;
                return Err(RuntimeError::Timeout {
                    what: format!("init container {name} of pod {}", self.uid),
                    after: timeout,
                });
            }
        };
        self.runtime.delete(&running.started.id).await?;
        Ok(Finished {
            started: running.started,
            exit_code,
        })
    }

    /// Runs init container `name` until it succeeds, as kubelet does: a failure is retried
    /// after `backoff`, doubling; gives up, with the last failure's log, at `deadline`.
    /// Returns every run, the successful one last.
    pub async fn run_init(
        &self,
        name: &str,
        spec: &ContainerSpec,
        backoff: Backoff,
        deadline: Instant,
    ) -> Result<Vec<Finished>, RuntimeError> {
        let mut runs = Vec::new();
        let mut wait = backoff.initial;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let run = match self.run_once(name, spec, left).await {
                Ok(run) => run,
                // the deadline cut this run short: the answer is the failure of the runs that
                // finished, with the last one's log (a loaded node may start the last try with
                // only milliseconds left)
                Err(_) if !runs.is_empty() && Instant::now() >= deadline => {
                    return Err(self.init_gave_up(name, &runs));
                }
                Err(e) => return Err(e),
            };
            let ok = run.exit_code == 0;
            runs.push(run);
            if ok {
                return Ok(runs);
            }
            if Instant::now() + wait >= deadline {
                return Err(self.init_gave_up(name, &runs));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(backoff.max);
        }
    }

    /// The error of init container `name` given up after `runs`, with the last run's log.
    fn init_gave_up(&self, name: &str, runs: &[Finished]) -> RuntimeError {
        RuntimeError::Failed {
            what: format!(
                "init container {name} of pod {} ({} runs)",
                self.uid,
                runs.len()
            ),
            output: runs.last().map(Finished::log_text).unwrap_or_default(),
        }
    }

    /// Stops running container `name` as kubelet does: SIGTERM, up to `grace` for it to end,
    /// then SIGKILL; then `delete`. Returns its exit status, or `None` if it was not running.
    pub async fn stop_container(
        &self,
        name: &str,
        grace: Duration,
    ) -> Result<Option<i32>, RuntimeError> {
        let Some(mut running) = self.lock().remove(name) else {
            return Ok(None);
        };
        stop(&self.runtime, &mut running, grace).await.map(Some)
    }

    /// Whether container `name` is still running (false once its process ended).
    pub fn is_running(&self, name: &str) -> bool {
        self.lock()
            .get_mut(name)
            .is_some_and(|r| matches!(r.child.try_wait(), Ok(None)))
    }

    /// Deletes the pod as kubelet does: every container stopped (SIGTERM, `grace`, SIGKILL)
    /// and deleted, the sandbox killed and deleted, and the pod's cgroup removed in every
    /// hierarchy, where the runtime leaves it.
    pub async fn remove(&self, grace: Duration) -> Result<(), RuntimeError> {
        let containers = std::mem::take(&mut *self.lock());
        // all at once, as kubelet kills a pod's containers
        let stops: Vec<_> = containers
            .into_values()
            .map(|mut running| {
                let runtime = self.runtime.clone();
                tokio::spawn(async move { stop(&runtime, &mut running, grace).await })
            })
            .collect();
        let mut first_error = None;
        for stopping in stops {
            let result = stopping.await.unwrap_or_else(|e| {
                Err(RuntimeError::Failed {
                    what: "stopping a container".into(),
                    output: e.to_string(),
                })
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        let child = self
            .sandbox_child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let killed = match child {
            Some(child) => {
                let mut sandbox = Running {
                    started: self.sandbox.clone(),
                    child,
                };
                kill_and_reap(&self.runtime, &mut sandbox).await
            }
            None => Ok(()),
        };
        let deleted = self.runtime.delete(&self.sandbox.id).await;
        crate::cgroups::remove_everywhere(&self.cgroup_parent);
        match first_error {
            Some(e) => Err(e),
            None => killed.and(deleted),
        }
    }

    async fn kill_and_reap(&self, running: &mut Running) -> Result<(), RuntimeError> {
        kill_and_reap(&self.runtime, running).await?;
        self.runtime.delete(&running.started.id).await
    }

    async fn launch(&self, name: &str, spec: &ContainerSpec) -> Result<Running, RuntimeError> {
        launch(
            &self.runtime,
            &self.cgroup_parent,
            &self.dir,
            &self.rootfs,
            name,
            spec,
            Namespaces::JoinSandbox(self.sandbox_pid()),
        )
        .await
    }
}

/// SIGTERM, up to `grace`, SIGKILL; then `delete`. The exit status.
async fn stop(
    runtime: &OciRuntime,
    running: &mut Running,
    grace: Duration,
) -> Result<i32, RuntimeError> {
    let id = running.started.id.clone();
    if matches!(running.child.try_wait(), Ok(None)) {
        runtime.kill(&id, "TERM").await?;
    }
    let status = match tokio::time::timeout(grace, running.child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            runtime.kill(&id, "KILL").await?;
            tokio::time::timeout(KILL_WAIT, running.child.wait())
                .await
                .map_err(|_| RuntimeError::Timeout {
                    what: format!("container {id} after SIGKILL"),
                    after: KILL_WAIT,
                })?
        }
    }
    .map_err(|e| RuntimeError::Spawn {
        what: format!("waiting for container {id}"),
        reason: e.to_string(),
    })?;
    runtime.delete(&id).await?;
    Ok(exit_code(status))
}

async fn kill_and_reap(runtime: &OciRuntime, running: &mut Running) -> Result<(), RuntimeError> {
    runtime.kill(&running.started.id, "KILL").await?;
    tokio::time::timeout(KILL_WAIT, running.child.wait())
        .await
        .map_err(|_| RuntimeError::Timeout {
            what: format!("container {} after SIGKILL", running.started.id),
            after: KILL_WAIT,
        })?
        .map(|_| ())
        .map_err(|e| RuntimeError::Spawn {
            what: format!("waiting for container {}", running.started.id),
            reason: e.to_string(),
        })
}

/// Writes the bundle of a new container `name` and runs it; returns once its process runs.
async fn launch(
    runtime: &OciRuntime,
    cgroup_parent: &str,
    pod_dir: &Path,
    rootfs: &Rootfs,
    name: &str,
    spec: &ContainerSpec,
    namespaces: Namespaces,
) -> Result<Running, RuntimeError> {
    let id = athenz_core::random::hex_name::<32>();
    let dir = pod_dir.join(format!("{name}-{}", &id[..12]));
    let volumes: Vec<VolumeMount> = rootfs
        .binds()
        .iter()
        .chain(spec.volumes.iter())
        .cloned()
        .collect();
    let cgroups_path = format!("{cgroup_parent}/{id}");
    bundle::write(
        &dir,
        &BundleSpec {
            args: &spec.args,
            env: &spec.env,
            cwd: &spec.cwd,
            rootfs: rootfs.dir(),
            volumes: &volumes,
            cgroups_path: &cgroups_path,
            namespaces,
        },
    )?;
    let pid_file = dir.join("pid");
    let log = dir.join("log");
    let asked = Instant::now();
    let mut child = runtime.run(&id, &dir, &pid_file, &log)?;
    let deadline = asked + START_TIMEOUT;
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            break pid;
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(RuntimeError::Failed {
                what: format!("{} run of {name} ({status})", runtime.kind()),
                output: std::fs::read_to_string(&log).unwrap_or_default(),
            });
        }
        if Instant::now() >= deadline {
            let _ = runtime.kill(&id, "KILL").await;
            let _ = runtime.delete(&id).await;
            return Err(RuntimeError::Timeout {
                what: format!("starting container {name}"),
                after: START_TIMEOUT,
            });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    Ok(Running {
        started: Started {
            id,
            pid,
            runtime_share: asked.elapsed(),
            log,
        },
        child,
    })
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}
