//! Where a cluster keeps everything, and `processes.json`: the processes it started, recorded
//! as each starts, so `cluster down` (another process, maybe after `cluster up` was killed) finds
//! every one and never a stranger that reused a pid.

use crate::procs::Process;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the sockets live: a Unix socket path must stay under 108 bytes, a state dir need not.
pub const RUN_ROOT: &str = "/run/athenz-devstack-cluster";

/// The paths of one cluster.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The state dir, absolute.
    pub dir: PathBuf,
    /// The Kubernetes and containerd binaries, absolute.
    pub kube_bin: PathBuf,
    /// Certificates and keys.
    pub pki: PathBuf,
    /// One log per component.
    pub logs: PathBuf,
    /// The components' kubeconfigs (the admin's is [`Layout::kubeconfig`]).
    pub kubeconfigs: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// etcd's data.
    pub etcd_data: PathBuf,
    /// containerd's root, state and config.
    pub containerd: PathBuf,
    /// This cluster's sockets: `/run/athenz-devstack-cluster/<hash of the state dir>` (the
    /// shims' socket dir, `<run_dir>/s`, must fit containerd's 42 bytes).
    pub run_dir: PathBuf,
    /// CNI configuration (containerd's `conf_dir`).
    pub cni_conf_dir: PathBuf,
    /// host-local IPAM's `dataDir`: the addresses handed out.
    pub cni_ipam_dir: PathBuf,
    /// The kubelet's config file and the pods' logs.
    pub kubelet: PathBuf,
    /// kube-proxy's config file.
    pub kube_proxy: PathBuf,
    /// Images built here (the pause image) and buildah's storage.
    pub images: PathBuf,
    /// `cluster.json`, written once the node is Ready.
    pub cluster_json: PathBuf,
    /// `processes.json`, written as each process starts.
    pub processes_json: PathBuf,
    /// The Athenz side: the dev ZTS's state, the control plane's keys, the copy of `deploy/`.
    pub athenz: PathBuf,
    /// The further nodes' directories (`nodes/<n>/`, see [`Layout::node`]).
    pub nodes: PathBuf,
}

/// The directories and sockets of one node's containerd, CNI, kubelet and kube-proxy: the
/// primary's are the state dir's own (`containerd/`, `cni/`, `kubelet/`, `kube-proxy/` and the
/// run dir), each further node's under `nodes/<n>/` and `<run dir>/n<n>/`.
#[derive(Debug, Clone)]
pub struct NodeDirs {
    /// The node's own directory (the state dir for the primary).
    pub dir: PathBuf,
    /// containerd's root, state and config.
    pub containerd: PathBuf,
    /// CNI configuration (containerd's `conf_dir`).
    pub cni_conf_dir: PathBuf,
    /// host-local IPAM's `dataDir`.
    pub cni_ipam_dir: PathBuf,
    /// The kubelet's config file and the pods' logs.
    pub kubelet: PathBuf,
    /// kube-proxy's config file.
    pub kube_proxy: PathBuf,
    /// containerd's sockets and runc's state.
    pub run_dir: PathBuf,
    /// The shims' socket dir (containerd refuses one over 42 bytes).
    pub shims: PathBuf,
}

impl NodeDirs {
    /// containerd's socket (the kubelet's CRI endpoint).
    pub fn containerd_socket(&self) -> PathBuf {
        self.run_dir.join("containerd.sock")
    }

    fn all(&self) -> [&PathBuf; 7] {
        [
            &self.containerd,
            &self.cni_conf_dir,
            &self.cni_ipam_dir,
            &self.kubelet,
            &self.kube_proxy,
            &self.run_dir,
            &self.shims,
        ]
    }

    /// Makes every directory.
    pub fn create(&self) -> anyhow::Result<()> {
        for d in self.all() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(())
    }
}

impl Layout {
    /// The layout of a cluster to start in `state_dir` (created) with binaries from `kube_bin`.
    pub fn new(state_dir: &Path, kube_bin: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let dir = std::fs::canonicalize(state_dir)
            .with_context(|| format!("resolving {}", state_dir.display()))?;
        if !kube_bin.join("kube").is_file() {
            anyhow::bail!(
                "no Kubernetes binaries at {} (no kube there): run harness/real-node/kube/build.sh, or pass \
                 --kube-bin DIR",
                kube_bin.display()
            );
        }
        let kube_bin = std::fs::canonicalize(kube_bin)
            .with_context(|| format!("resolving {}", kube_bin.display()))?;
        let layout = Self::at(dir, kube_bin);
        layout.create_dirs()?;
        Ok(layout)
    }

    /// Removes what an earlier cluster in this state dir left (its etcd data, containerd's
    /// images and containers, PKI, configs and logs; not the image build cache) and makes the
    /// directories again. Only after [`super::teardown::clean`]: nothing may be mounted there.
    pub fn reset(&self) -> anyhow::Result<()> {
        for d in [
            &self.pki,
            &self.logs,
            &self.kubeconfigs,
            &self.etcd_data,
            &self.containerd,
            &self.cni_conf_dir,
            &self.cni_ipam_dir,
            &self.kubelet,
            &self.kube_proxy,
            &self.athenz,
            &self.nodes,
        ] {
            if d.exists() {
                std::fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
            }
        }
        for f in [&self.kubeconfig, &self.cluster_json] {
            let _ = std::fs::remove_file(f);
        }
        self.create_dirs()
    }

    fn create_dirs(&self) -> anyhow::Result<()> {
        for d in [
            &self.pki,
            &self.logs,
            &self.kubeconfigs,
            &self.etcd_data,
            &self.containerd,
            &self.run_dir,
            &self.cni_conf_dir,
            &self.cni_ipam_dir,
            &self.kubelet,
            &self.kube_proxy,
            &self.images,
        ] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(())
    }

    /// The layout of an existing cluster (for `cluster down`, tests): the binaries are those its
    /// `processes.json` names (the default ones if it has none).
    pub fn existing(state_dir: &Path) -> anyhow::Result<Self> {
        let dir = std::fs::canonicalize(state_dir)
            .with_context(|| format!("no state dir {}", state_dir.display()))?;
        let recorded = Processes::read(&dir.join("processes.json"));
        let kube_bin = match recorded {
            Some(p) => p.kube_bin,
            None => super::default_kube_bin(),
        };
        Ok(Self::at(dir, kube_bin))
    }

    /// The layout without touching the disk.
    pub(super) fn at(dir: PathBuf, kube_bin: PathBuf) -> Self {
        Self {
            pki: dir.join("pki"),
            logs: dir.join("logs"),
            kubeconfigs: dir.join("kubeconfigs"),
            kubeconfig: dir.join("kubeconfig"),
            etcd_data: dir.join("etcd"),
            containerd: dir.join("containerd"),
            // 8 hex digits: containerd refuses a shim socket dir over 42 bytes
            run_dir: Path::new(RUN_ROOT).join(format!("{:08x}", fnv1a(&dir) as u32)),
            cni_conf_dir: dir.join("cni").join("net.d"),
            cni_ipam_dir: dir.join("cni").join("ipam"),
            kubelet: dir.join("kubelet"),
            kube_proxy: dir.join("kube-proxy"),
            images: dir.join("images"),
            cluster_json: dir.join("cluster.json"),
            processes_json: dir.join("processes.json"),
            athenz: dir.join("athenz"),
            nodes: dir.join("nodes"),
            kube_bin,
            dir,
        }
    }

    /// A binary of the build: `kube-apiserver`, `kubectl`, `containerd`, `ctr`, ...
    pub fn bin(&self, name: &str) -> PathBuf {
        self.kube_bin.join(name)
    }

    /// The primary node's containerd socket (the kubelet's CRI endpoint).
    pub fn containerd_socket(&self) -> PathBuf {
        self.run_dir.join("containerd.sock")
    }

    /// The directories of node `index` (0: the primary).
    pub fn node(&self, index: usize) -> NodeDirs {
        if index == 0 {
            return NodeDirs {
                dir: self.dir.clone(),
                containerd: self.containerd.clone(),
                cni_conf_dir: self.cni_conf_dir.clone(),
                cni_ipam_dir: self.cni_ipam_dir.clone(),
                kubelet: self.kubelet.clone(),
                kube_proxy: self.kube_proxy.clone(),
                run_dir: self.run_dir.clone(),
                shims: self.run_dir.join("s"),
            };
        }
        let n = index + 1;
        let dir = self.nodes.join(n.to_string());
        NodeDirs {
            containerd: dir.join("containerd"),
            cni_conf_dir: dir.join("cni").join("net.d"),
            cni_ipam_dir: dir.join("cni").join("ipam"),
            kubelet: dir.join("kubelet"),
            kube_proxy: dir.join("kube-proxy"),
            run_dir: self.run_dir.join(format!("n{n}")),
            shims: self.run_dir.join(format!("s{n}")),
            dir,
        }
    }

    /// Every node's containerd socket that answers to a file now: the primary's, then the
    /// further nodes' (images are imported into each).
    pub fn containerd_sockets(&self) -> Vec<PathBuf> {
        let mut further: Vec<PathBuf> = std::fs::read_dir(&self.run_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix('n'))
                    .is_some_and(|n| n.parse::<usize>().is_ok())
            })
            .map(|e| e.path().join("containerd.sock"))
            .filter(|socket| socket.exists())
            .collect();
        further.sort();
        let mut sockets = vec![self.containerd_socket()];
        sockets.extend(further);
        sockets
    }

    /// Records this process as the cluster's supervisor, before anything starts.
    pub fn write_supervisor_pid(&self) -> anyhow::Result<()> {
        let mut processes = Processes::read(&self.processes_json).unwrap_or_default();
        processes.kube_bin.clone_from(&self.kube_bin);
        processes.supervisor = ProcessId::of(std::process::id());
        processes.write(&self.processes_json)
    }

    /// The pid of the `cluster up` running this cluster, if it still runs.
    pub fn running_supervisor(&self) -> Option<u32> {
        let processes = Processes::read(&self.processes_json)?;
        let me = std::process::id();
        processes
            .supervisor
            .filter(|s| s.pid != me && s.is_running())
            .map(|s| s.pid)
    }
}

/// The node's host-wide state (`/var/lib/kubelet`, the `/kubepods` cgroups, `cni0`, the
/// `KUBE-*`/`CNI-*` chains) can belong to one cluster at a time: held by the `cluster up` that
/// runs it (the kernel drops the lock however that process ends), and by `cluster down` while it
/// removes that state. The file names the holder's state dir.
pub struct NodeLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// The lock's file.
fn node_lock_path() -> PathBuf {
    Path::new(RUN_ROOT).join("node.lock")
}

impl NodeLock {
    /// Takes the lock for the cluster in `state_dir`; `Err` with the holder's state dir when
    /// another process holds it.
    pub fn take(state_dir: &Path) -> anyhow::Result<Result<Self, String>> {
        use nix::fcntl::{Flock, FlockArg};
        use std::io::Write;
        std::fs::create_dir_all(RUN_ROOT).with_context(|| format!("creating {RUN_ROOT}"))?;
        let path = node_lock_path();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err(_) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Ok(Err(holder.trim().to_owned()));
            }
        };
        lock.set_len(0)
            .and_then(|()| writeln!(lock, "{}", state_dir.display()))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(Ok(Self { _lock: lock }))
    }
}

/// `processes.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Processes {
    /// The binaries (what the components' `/proc/<pid>/exe` point into).
    pub kube_bin: PathBuf,
    /// `cluster up` itself.
    pub supervisor: Option<ProcessId>,
    /// Each component, by name.
    pub components: BTreeMap<String, ProcessId>,
}

impl Processes {
    /// Reads it; `None` if it is missing or unreadable.
    pub fn read(path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes it atomically.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        crate::json_file::write_atomically(path, self)
    }
}

/// The pids of the processes, by name, and this process's as `supervisor`.
pub fn pids(processes: &[Process]) -> BTreeMap<String, u32> {
    let mut pids: BTreeMap<String, u32> = processes
        .iter()
        .map(|p| (p.command.name.clone(), p.pid()))
        .collect();
    pids.insert("supervisor".to_owned(), std::process::id());
    pids
}

/// Records the processes in `processes.json` (`cluster down` reads it).
pub fn write_pids(layout: &Layout, processes: &[Process]) -> anyhow::Result<()> {
    let mut recorded = Processes::read(&layout.processes_json).unwrap_or_default();
    recorded.kube_bin.clone_from(&layout.kube_bin);
    for process in processes {
        if let Some(id) = ProcessId::of(process.pid()) {
            recorded.components.insert(process.command.name.clone(), id);
        }
    }
    recorded.write(&layout.processes_json)
}

/// A process as the kernel knows it: its pid and its start time, which a later process that
/// reuses the pid does not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
}

impl ProcessId {
    /// The process with this pid now; `None` if there is none.
    pub fn of(pid: u32) -> Option<Self> {
        let (state, start) = stat(pid)?;
        (state != 'Z').then_some(Self { pid, start })
    }

    /// Whether this very process still runs (a zombie does not count).
    pub fn is_running(&self) -> bool {
        stat(self.pid).is_some_and(|(state, start)| state != 'Z' && start == self.start)
    }
}

/// The state letter and start time of a process, from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name is in parentheses and may hold anything: read after the last ')'
    let after = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // field 3 (state) is the first after the name, field 22 (starttime) the 20th
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// FNV-1a over a path's bytes: a stable short name for the state dir's run dir.
fn fnv1a(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_running_and_a_reused_pid_is_not() {
        let me = ProcessId::of(std::process::id()).unwrap();
        assert!(me.is_running());
        let reused = ProcessId {
            start: me.start + 1,
            ..me
        };
        assert!(!reused.is_running());
        assert!(ProcessId::of(u32::MAX).is_none());
    }

    #[test]
    fn run_dirs_are_short_and_differ_per_state_dir() {
        let a = Layout::at("/tmp/a".into(), "/bin".into());
        let b = Layout::at("/tmp/b".into(), "/bin".into());
        assert_ne!(a.run_dir, b.run_dir);
        assert!(a.run_dir.join("s").as_os_str().len() <= 42);
        // the eighth node, the most `cluster up --nodes` makes
        let last = a.node(7);
        assert!(last.shims.as_os_str().len() <= 42);
        assert_ne!(a.node(1).containerd_socket(), a.containerd_socket());
    }
}
