//! How a pod's processes are started on the stack's node — the one place that knows:
//!
//! - `runc` / `crun`: as kubelet has a CRI runtime do it, a sandbox per pod and each container an
//!   OCI bundle run by the real runtime ([`athenz_testbed::runtime`]), the identity volume
//!   read-only at the initializer's `/var/athenz/identity` and the credentials volume at
//!   `/var/run/athenz`, the binaries in a read-only root file system;
//! - `process`: the stand-in for hosts without a runtime (or not root), a plain process that a
//!   shell moves into a kubelet-shaped cgroup, seeing the host's paths.
//!
//! `node.rs`, the demo, bench, chaos and the end-to-end tests ask for a pod's container through
//! [`PodRuntime`] and never know which is underneath. The sandboxes and containers belong to the
//! process that started them (as a runtime's shims do); [`PodRuntime::of`] gives every caller in
//! a process the same one for a stack.

use crate::pod_dirs::PodVolume;
use crate::procs::Process;

mod container;
use crate::stack_json::{RuntimeInfo, StackInfo};
use anyhow::Context;
use athenz_testbed::runtime::{
    ContainerSpec, OciRuntime, Pod, Qos, Rootfs, RuntimeKind, VolumeMount,
};
pub use container::PodContainer;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Where the pod's containers see the identity volume: the initializer's `identityMountPath`.
pub const IDENTITY_PATH: &str = "/var/athenz/identity";
/// Where they see the credentials volume: the initializer's `credentialsMountPath`.
pub const CREDENTIALS_PATH: &str = "/var/run/athenz";
/// Where they see ZTS's CA bundle (`SERVER_CA_CERT`), as an operator's template mounts it from
/// a ConfigMap.
pub const ZTS_CA_PATH: &str = "/etc/athenz/zts-ca.pem";
/// The SIA in the containers' root file system (outside `/usr`, which is the host's, bound
/// read-only).
const SIA_IN_IMAGE: &str = "/opt/athenz/bin/athenz-sia";
/// The devstack itself there (its hidden pod-side commands).
const DEVSTACK_IN_IMAGE: &str = "/opt/athenz/bin/athenz-devstack";
/// Kubelet's default termination grace period (`terminationGracePeriodSeconds`).
pub const GRACE: Duration = Duration::from_secs(30);
/// Every pod here is BestEffort: the initializer's containers and the stand-in apps set no
/// requests.
const QOS: Qos = Qos::BestEffort;

/// A program a pod's container runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodProgram {
    /// `athenz-sia`.
    Sia,
    /// `athenz-devstack` (its hidden pod-side commands, e.g. `pod-refresh-once`).
    Devstack,
}

/// What one of a pod's containers runs.
#[derive(Debug, Clone)]
pub struct PodCommand<'a> {
    /// The container's name in the pod (`sia-init`, `sia-refresh`, ...).
    pub name: &'a str,
    pub program: PodProgram,
    pub args: Vec<String>,
    /// Its environment (paths as [`PodRuntime::paths`] gives them).
    pub env: Vec<(&'static str, String)>,
}

/// The paths a pod's process uses for its volumes, as it sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPaths {
    /// The identity volume (its `id` file and `connect/` socket directory).
    pub identity_dir: String,
    /// The agent's socket.
    pub socket: String,
    /// The id file.
    pub id_file: String,
    /// The credentials volume.
    pub credentials_dir: String,
    /// Where the process runs.
    pub cwd: PathBuf,
}

impl PodPaths {
    /// As a host process sees them, run in the identity volume's mount dir (relative there:
    /// under kubelet's pod directory the socket's path would exceed the 108 bytes a Unix socket
    /// address holds).
    pub fn host(volume: &PodVolume) -> Self {
        Self {
            identity_dir: ".".into(),
            socket: format!("connect/{}", athenz_core::volume::AGENT_SOCKET_NAME),
            id_file: "id".into(),
            credentials_dir: volume.credentials_dir.display().to_string(),
            cwd: volume.mount_dir.clone(),
        }
    }

    /// In a container, where the initializer mounts the volumes (its defaults).
    pub fn in_container() -> Self {
        Self {
            identity_dir: IDENTITY_PATH.into(),
            socket: format!(
                "{IDENTITY_PATH}/connect/{}",
                athenz_core::volume::AGENT_SOCKET_NAME
            ),
            id_file: format!("{IDENTITY_PATH}/id"),
            credentials_dir: CREDENTIALS_PATH.into(),
            cwd: PathBuf::from("/"),
        }
    }

    /// The SIA's path settings, as the initializer injects them (`ID_FILE`, `ENDPOINT`,
    /// `OUT_DIR`).
    pub fn sia_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ID_FILE", self.id_file.clone()),
            ("ENDPOINT", self.socket.clone()),
            ("OUT_DIR", self.credentials_dir.clone()),
        ]
    }
}

/// A container that ran to its end.
#[derive(Debug, Clone)]
pub struct Ran {
    /// It exited 0.
    pub success: bool,
    /// Its exit status, as text (`exit status: 3`).
    pub status: String,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr (with a runtime, stdout and stderr are one log).
    pub stderr: String,
    /// When the sandbox was ready (or the process about to be started) and the container was
    /// asked for: with the program's own start time, the runtime's whole part up to the
    /// program's first instruction.
    pub asked_at: std::time::SystemTime,
    /// The sandbox's start, when this call made it.
    pub sandbox: Option<Duration>,
}

impl Ran {
    /// What it wrote, for an error message (the one log once when stdout and stderr are one).
    pub fn output(&self) -> String {
        if self.stdout == self.stderr {
            self.stderr.trim().to_owned()
        } else {
            format!("{} {}", self.stdout.trim(), self.stderr.trim())
        }
    }
}

/// One way of starting pods' processes, for one stack.
pub struct PodRuntime {
    info: RuntimeInfo,
    /// The stand-in's cgroup root (a v2 directory), for `process` and for [`PodRuntime::in_pod`].
    cgroup_dir: Option<PathBuf>,
    oci: Option<Oci>,
}

struct Oci {
    runtime: Arc<OciRuntime>,
    rootfs: Rootfs,
    /// `linux.cgroupsPath`'s first component, the stack's own (as kubelet's `--cgroup-root`).
    cgroup_root: String,
    pods_dir: PathBuf,
    /// Each pod's sandbox, made once by the first container that needs it (pods' sandboxes
    /// start in parallel, as kubelet's pod workers make them).
    sandboxes: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Arc<Pod>>>>>,
    host_network: tokio::sync::Mutex<std::collections::HashSet<String>>,
    zts_ca: PathBuf,
}

/// A stack, as the registry tells stacks apart: a later stack may reuse an earlier one's
/// directories (the bench runs one after another in one state dir), never its cgroup root.
type StackKey = (PathBuf, Option<PathBuf>);

type Registry = Mutex<HashMap<StackKey, Arc<PodRuntime>>>;

fn key(stack: &StackInfo) -> StackKey {
    (stack.volumes_dir.clone(), stack.pod_cgroup_root.clone())
}

fn registry() -> &'static Registry {
    static RUNTIMES: OnceLock<Registry> = OnceLock::new();
    RUNTIMES.get_or_init(Registry::default)
}

impl PodRuntime {
    /// The stack's pod runtime in this process (made at the first call).
    pub fn of(stack: &StackInfo) -> anyhow::Result<Arc<Self>> {
        let key = key(stack);
        let mut runtimes = registry()
            .lock()
            .map_err(|_| anyhow::anyhow!("the pod runtimes' registry is poisoned"))?;
        if let Some(runtime) = runtimes.get(&key) {
            return Ok(runtime.clone());
        }
        let runtime = Arc::new(Self::new(stack)?);
        runtimes.insert(key, runtime.clone());
        Ok(runtime)
    }

    /// Forgets the stack's pod runtime in this process (when the stack stops).
    pub fn forget(stack: &StackInfo) {
        if let Ok(mut runtimes) = registry().lock() {
            runtimes.remove(&key(stack));
        }
    }

    fn new(stack: &StackInfo) -> anyhow::Result<Self> {
        let info = stack.runtime.clone();
        let oci = match info.kind {
            RuntimeKind::Process => None,
            kind => {
                let state = info
                    .state_dir
                    .as_deref()
                    .context("stack.json names a container runtime but no state dir")?;
                let runtime = OciRuntime::find(kind, state)?;
                let rootfs = image_rootfs(stack, &state.join("rootfs"))?;
                Some(Oci {
                    runtime: Arc::new(runtime),
                    rootfs,
                    cgroup_root: info
                        .cgroup_root
                        .clone()
                        .context("stack.json names a container runtime but no cgroup root")?,
                    pods_dir: state.join("pods"),
                    sandboxes: tokio::sync::Mutex::new(HashMap::new()),
                    host_network: tokio::sync::Mutex::new(Default::default()),
                    zts_ca: stack.zts.ca.clone(),
                })
            }
        };
        Ok(Self {
            info,
            cgroup_dir: stack.pod_cgroup_root.clone(),
            oci,
        })
    }

    /// Which runtime.
    pub fn kind(&self) -> RuntimeKind {
        self.info.kind
    }

    /// The paths `volume`'s pod sees: in a container, the initializer's mount paths; as a
    /// process, the host's (relative to the mount dir it runs in: under kubelet's pod directory
    /// the socket's path would exceed the 108 bytes a Unix socket address holds).
    pub fn paths(&self, volume: &PodVolume) -> PodPaths {
        match self.oci {
            Some(_) => PodPaths::in_container(),
            None => PodPaths::host(volume),
        }
    }

    /// ZTS's CA bundle as the pod's processes see it (`SERVER_CA_CERT`).
    pub fn zts_ca(&self, stack: &StackInfo) -> String {
        match self.oci {
            Some(_) => ZTS_CA_PATH.into(),
            None => stack.zts.ca.display().to_string(),
        }
    }

    /// Gives pod `uid` the host's network (`hostNetwork: true`), for a pod whose processes
    /// must reach the stand-ins, which listen on the host's loopback only, or be reached from
    /// the host; before its first container.
    pub async fn use_host_network(&self, uid: &str) {
        if let Some(oci) = &self.oci {
            oci.host_network.lock().await.insert(uid.to_owned());
        }
    }

    /// Runs `program args` as a container of `volume`'s pod named `name`, to its end (at most
    /// `timeout`).
    pub async fn run(
        &self,
        stack: &StackInfo,
        volume: &PodVolume,
        command: &PodCommand<'_>,
        timeout: Duration,
    ) -> anyhow::Result<Ran> {
        let PodCommand {
            name,
            program,
            args,
            env,
        } = command;
        let what = format!("{name} of pod {}", volume.pod.name);
        let Some(oci) = &self.oci else {
            let asked_at = std::time::SystemTime::now();
            let argv = self.in_pod(&volume.uid, &host_argv(stack, *program, args)?)?;
            let mut ran = run_process(&argv, env, &volume.mount_dir, timeout, &what).await?;
            ran.asked_at = asked_at;
            return Ok(ran);
        };
        let (pod, sandbox) = self.sandbox(oci, &volume.uid).await?;
        let asked_at = std::time::SystemTime::now();
        let spec = container_spec(*program, args, env, volume, &oci.zts_ca);
        let finished = pod
            .run_once(name, &spec, timeout)
            .await
            .with_context(|| what.clone())?;
        let log = finished.log_text();
        Ok(Ran {
            success: finished.exit_code == 0,
            status: format!("exit status: {}", finished.exit_code),
            // one log: the SIA logs to stderr and the pod-side commands answer on stdout
            stdout: log.clone(),
            stderr: log,
            asked_at,
            sandbox,
        })
    }

    /// Starts `program args` as a long-running container of `volume`'s pod (a sidecar), its
    /// log under `log_dir` for a process.
    pub async fn start(
        &self,
        stack: &StackInfo,
        volume: &PodVolume,
        command: &PodCommand<'_>,
        log_dir: &Path,
    ) -> anyhow::Result<PodContainer> {
        let PodCommand {
            name,
            program,
            args,
            env,
        } = command;
        let Some(oci) = &self.oci else {
            let argv = self.in_pod(&volume.uid, &host_argv(stack, *program, args)?)?;
            let (program, args) = argv.split_first().context("an empty argv")?;
            let mut command = crate::procs::Command::new(
                &format!("{name}-{}", volume.pod.name),
                Path::new(program),
                args.to_vec(),
            );
            command.cwd = Some(volume.mount_dir.clone());
            command.env = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect();
            return Ok(PodContainer::Process(Box::new(Process::start(
                command, log_dir,
            )?)));
        };
        let (pod, _) = self.sandbox(oci, &volume.uid).await?;
        let spec = container_spec(*program, args, env, volume, &oci.zts_ca);
        pod.start_container(name, &spec)
            .await
            .with_context(|| format!("starting {name} of pod {}", volume.pod.name))?;
        Ok(PodContainer::Container {
            pod,
            name: (*name).to_owned(),
            spec,
            stopped: None,
        })
    }

    /// `argv` as a process of pod `uid` that is not one of its containers (as `kubectl exec`
    /// or a test's helper): inside a new cgroup of the pod, under the stand-in's cgroup root in
    /// the v2 hierarchy for `process`, and beside the runtime's containers (the cgroupfs shape
    /// under the stack's cgroup root) with a runtime. Without pod cgroups, as is.
    pub fn in_pod(&self, uid: &str, argv: &[String]) -> anyhow::Result<Vec<String>> {
        let (program, args) = argv.split_first().context("an empty argv")?;
        let cgroup = match (&self.oci, &self.cgroup_dir) {
            (Some(oci), _) => {
                let (v2, v1) = athenz_testbed::cgroups::hierarchies();
                let hierarchy = v2.or(v1).context("no cgroup hierarchy is mounted")?;
                let dir = hierarchy
                    .join(&oci.cgroup_root)
                    .join(QOS.kubepods_dir())
                    .join(format!("pod{uid}"))
                    .join(athenz_core::random::hex_name::<32>());
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                dir
            }
            (None, Some(root)) => athenz_testbed::cgroups::container_scope(root, uid)?,
            (None, None) => return Ok(argv.to_vec()),
        };
        Ok(athenz_testbed::cgroups::argv_in_cgroup(
            &cgroup, program, args,
        ))
    }

    /// Removes pod `uid` as kubelet does when it goes: its containers stopped (SIGTERM, the
    /// grace period, SIGKILL) and deleted, its sandbox, and its cgroups in every hierarchy.
    pub async fn remove_pod(&self, uid: &str) -> anyhow::Result<()> {
        match &self.oci {
            Some(oci) => {
                let cell = oci.sandboxes.lock().await.remove(uid);
                if let Some(pod) = cell.as_ref().and_then(|c| c.get()) {
                    // a sidecar's handle may still hold it: it finds its container gone
                    pod.remove(GRACE).await?;
                }
                athenz_testbed::cgroups::remove_everywhere(&format!(
                    "/{}/{}pod{uid}",
                    oci.cgroup_root,
                    QOS.kubepods_dir()
                ));
            }
            None => {
                if let Some(root) = &self.cgroup_dir {
                    athenz_testbed::cgroups::remove_tree(&athenz_testbed::cgroups::pod_slice(
                        root, uid,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Pod `uid`'s sandbox, made now if it has none (with how long that took).
    async fn sandbox(&self, oci: &Oci, uid: &str) -> anyhow::Result<(Arc<Pod>, Option<Duration>)> {
        let cell = oci
            .sandboxes
            .lock()
            .await
            .entry(uid.to_owned())
            .or_default()
            .clone();
        let mut made_in = None;
        let pod = cell
            .get_or_try_init(|| async {
                let started = std::time::Instant::now();
                let host_network = oci.host_network.lock().await.contains(uid);
                let pod = Pod::start(
                    oci.runtime.clone(),
                    uid,
                    QOS,
                    &oci.cgroup_root,
                    oci.rootfs.clone(),
                    &oci.pods_dir.join(uid),
                    host_network,
                )
                .await
                .with_context(|| format!("the sandbox of pod {uid}"))?;
                made_in = Some(started.elapsed());
                anyhow::Ok(Arc::new(pod))
            })
            .await?;
        Ok((pod.clone(), made_in))
    }
}

/// The program's host binary and `args`, for `process`.
fn host_argv(
    stack: &StackInfo,
    program: PodProgram,
    args: &[String],
) -> anyhow::Result<Vec<String>> {
    let sia = stack.sia.first().context("an empty SIA argv")?;
    let mut argv = match program {
        PodProgram::Sia => stack.sia.clone(),
        PodProgram::Devstack => vec![
            Path::new(sia)
                .with_file_name("athenz-devstack")
                .display()
                .to_string(),
        ],
    };
    argv.extend(args.iter().cloned());
    Ok(argv)
}

/// The container for `program args`, with the pod's two volumes where the initializer puts
/// them and ZTS's CA bundle.
fn container_spec(
    program: PodProgram,
    args: &[String],
    env: &[(&'static str, String)],
    volume: &PodVolume,
    zts_ca: &Path,
) -> ContainerSpec {
    let binary = match program {
        PodProgram::Sia => SIA_IN_IMAGE,
        PodProgram::Devstack => DEVSTACK_IN_IMAGE,
    };
    ContainerSpec {
        args: std::iter::once(binary.to_owned())
            .chain(args.iter().cloned())
            .collect(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
        cwd: "/".into(),
        volumes: vec![
            VolumeMount {
                destination: IDENTITY_PATH.into(),
                source: volume.mount_dir.clone(),
                read_only: true,
            },
            VolumeMount {
                destination: CREDENTIALS_PATH.into(),
                source: volume.credentials_dir.clone(),
                read_only: false,
            },
            VolumeMount {
                destination: ZTS_CA_PATH.into(),
                source: zts_ca.to_owned(),
                read_only: true,
            },
        ],
    }
}

/// The containers' image: the SIA and the devstack at their paths (the files the stack's
/// `athenz-sia` and `athenz-devstack` resolve to), the C library from the host's `/usr`.
fn image_rootfs(stack: &StackInfo, dir: &Path) -> anyhow::Result<Rootfs> {
    let sia = stack.sia.first().context("an empty SIA argv")?;
    let resolve =
        |p: &Path| std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()));
    let sia_binary = resolve(Path::new(sia))?;
    let devstack = resolve(&Path::new(sia).with_file_name("athenz-devstack"))?;
    Ok(Rootfs::prepare(
        dir,
        &[(sia_binary, SIA_IN_IMAGE), (devstack, DEVSTACK_IN_IMAGE)],
        &[IDENTITY_PATH, CREDENTIALS_PATH],
    )?)
}

/// Runs `argv` (already placed in the pod) to its end, as `process` runs a pod's container.
async fn run_process(
    argv: &[String],
    env: &[(&'static str, String)],
    cwd: &Path,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<Ran> {
    let (program, args) = argv.split_first().context("an empty argv")?;
    let output = tokio::time::timeout(
        timeout,
        tokio::process::Command::new(program)
            .args(args)
            .current_dir(cwd)
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{what}: no answer within {timeout:?}"))?
    .with_context(|| format!("{what}: cannot run {program}"))?;
    Ok(Ran {
        success: output.status.success(),
        status: output.status.to_string(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        asked_at: std::time::SystemTime::now(),
        sandbox: None,
    })
}
