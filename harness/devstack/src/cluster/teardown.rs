//! Taking a cluster down, from what its state dir records, as many times as asked: the
//! processes it started (by recorded pid and start time, never by name), the containers
//! (through containerd, then whatever is left in the pods' cgroups), the mounts under the state
//! dir, the kubelet's pod mounts and the agent's (`/var/athenz`), the `kubepods` cgroups, the
//! `KUBE-*` and `CNI-*` iptables chains, the bridge and its veths, and the IPAM state.
//!
//! Each step goes on when an earlier one failed; the error at the end names every step that did.

use super::layout::{ProcessId, Processes};
// the agent's files-mode tmpfs mounts propagate there (`Bidirectional`) and outlive its pod
use super::nodes::AGENT_HOST_DIR;
use super::{Layout, components, iptables, nodes};
use anyhow::bail;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long `cluster up` may take to take its own cluster down when asked by `cluster down`.
pub const SUPERVISOR_GRACE: Duration = Duration::from_secs(90);
/// How long a component may take to exit after SIGTERM.
const COMPONENT_GRACE: Duration = Duration::from_secs(10);
/// How long one `ctr` call may take.
const CTR_TIMEOUT: Duration = Duration::from_secs(20);
/// The kubelet's pods (its root dir is the default: CSI and plugin paths depend on it).
pub const KUBELET_PODS: &str = "/var/lib/kubelet/pods";
/// Where libcni caches results by network name.
const CNI_RESULTS: &str = "/var/lib/cni/results";

/// The order components stop in: nothing may recreate a pod or a rule while the rest goes.
const STOP_ORDER: &[&str] = &[
    components::KUBELET,
    components::KUBE_PROXY,
    components::SCHEDULER,
    components::CONTROLLER_MANAGER,
];

/// Sends SIGTERM and waits up to `grace` for the process to go, then SIGKILL.
pub async fn terminate(pid: u32, grace: Duration) {
    if let Some(id) = ProcessId::of(pid) {
        terminate_id(id, grace).await;
    }
}

/// [`terminate`] for a recorded process: nothing is sent if the pid now names another process.
async fn terminate_id(id: ProcessId, grace: Duration) -> bool {
    if !id.is_running() {
        return false;
    }
    let pid = Pid::from_raw(id.pid as i32);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while id.is_running() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if id.is_running() {
        let _ = kill(pid, Signal::SIGKILL);
        while id.is_running() && deadline.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    true
}

/// Runs `ctr` against the containerd at `socket`; its stdout, `None` if it fails or hangs.
async fn ctr(layout: &Layout, socket: &Path, args: &[&str]) -> Option<String> {
    let mut command = tokio::process::Command::new(layout.bin("ctr"));
    command
        .arg("--address")
        .arg(socket)
        .args(["--namespace", super::CONTAINERD_NAMESPACE])
        .args(args)
        .kill_on_drop(true);
    let output = tokio::time::timeout(CTR_TIMEOUT, command.output())
        .await
        .ok()?
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Deletes every task and container in the `k8s.io` namespace of the containerd at `socket`
/// (with their rootfs mounts), if it answers; returns how many containers went.
pub async fn remove_containers(layout: &Layout, socket: &Path) -> usize {
    if !socket.exists() {
        return 0;
    }
    let Some(tasks) = ctr(layout, socket, &["tasks", "ls", "--quiet"]).await else {
        return 0;
    };
    for task in tasks.lines().filter(|t| !t.is_empty()) {
        let _ = ctr(layout, socket, &["tasks", "delete", "--force", task]).await;
    }
    let containers = ctr(layout, socket, &["containers", "ls", "--quiet"])
        .await
        .unwrap_or_default();
    let mut removed = 0;
    for container in containers.lines().filter(|c| !c.is_empty()) {
        if ctr(layout, socket, &["containers", "delete", container])
            .await
            .is_some()
        {
            removed += 1;
        }
    }
    removed
}

/// The `kubepods*` cgroups at the top of each hierarchy.
fn kubepods_cgroups() -> Vec<PathBuf> {
    nodes::cgroup_hierarchies()
        .into_iter()
        .flat_map(|h| std::fs::read_dir(h).into_iter().flatten())
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("kubepods"))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// Every pid in a cgroup and its descendants.
fn pids_under(cgroup: &Path, pids: &mut BTreeSet<i32>) {
    if let Ok(text) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for child in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            pids_under(&child.path(), pids);
        }
    }
}

/// SIGKILLs every process in the pods' cgroups (containers containerd did not delete); returns
/// how many.
async fn kill_pod_processes() -> usize {
    let mut pids = BTreeSet::new();
    for cgroup in kubepods_cgroups() {
        pids_under(&cgroup, &mut pids);
    }
    for pid in &pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline
        && pids
            .iter()
            .any(|p| ProcessId::of(*p as u32).is_some_and(|id| id.is_running()))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pids.len()
}

/// The runc shims serving this cluster's containerds (`-address <one of our sockets>`).
fn our_shims(layout: &Layout) -> Vec<u32> {
    let sockets: Vec<String> = layout
        .containerd_sockets()
        .iter()
        .map(|s| s.display().to_string())
        .collect();
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc_dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_shim = args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            is_shim
                && args
                    .windows(2)
                    .any(|w| w[0] == b"-address" && sockets.iter().any(|s| w[1] == s.as_bytes()))
        })
        .collect()
}

/// Mount points at or under any of `prefixes`, deepest first (athenz-core's mountinfo reader).
pub fn mounts_under(prefixes: &[&Path]) -> Vec<PathBuf> {
    let table = athenz_core::volume_mount::mountinfo::MountTable::read().unwrap_or_default();
    let mut mounts: Vec<PathBuf> = prefixes
        .iter()
        .flat_map(|prefix| table.under(prefix).map(Path::to_path_buf))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    mounts
}

/// Unmounts everything at or under `prefixes` (a busy mount lazily); returns how many and the
/// ones that would not go.
fn unmount_all(prefixes: &[&Path]) -> (usize, Vec<String>) {
    use nix::mount::{MntFlags, umount2};
    let mut count = 0;
    let mut last_error = std::collections::HashMap::new();
    // a mount may be stacked on another at the same point: go round until none is left. With
    // shared propagation, unmounting one mount also removes its peers (a pod's view of a flex
    // volume's `connect` bind and the agent's): those then answer EINVAL, which is not a
    // failure. Only what is still mounted after the last round is one.
    for _ in 0..4 {
        let mounts = mounts_under(prefixes);
        if mounts.is_empty() {
            break;
        }
        for mount in mounts {
            match umount2(&mount, MntFlags::empty())
                .or_else(|_| umount2(&mount, MntFlags::MNT_DETACH))
            {
                Ok(()) => count += 1,
                Err(e) => {
                    last_error.insert(mount, e);
                }
            }
        }
    }
    let failed = mounts_under(prefixes)
        .into_iter()
        .map(|mount| match last_error.get(&mount) {
            Some(e) => format!("{} (still mounted: {e})", mount.display()),
            None => format!("{} (still mounted)", mount.display()),
        })
        .collect();
    (count, failed)
}

/// Removes a cgroup and its children, deepest first; returns how many went.
fn remove_cgroup(cgroup: &Path) -> usize {
    let mut removed = 0;
    for child in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            removed += remove_cgroup(&child.path());
        }
    }
    if std::fs::remove_dir(cgroup).is_ok() {
        removed += 1;
    }
    removed
}

/// Runs `ip` with `args`; its stdout, or `None` if it fails.
fn ip(args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("ip").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Deletes the bridge's veths and the bridge; returns how many devices went.
fn remove_devices() -> usize {
    let mut removed = 0;
    let attached = ip(&["-o", "link", "show", "master", super::BRIDGE]).unwrap_or_default();
    for line in attached.lines() {
        // "12: vethabc@if2: <...>"
        let Some(name) = line.split(':').nth(1).map(str::trim) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if ip(&["link", "delete", name]).is_some() {
            removed += 1;
        }
    }
    if ip(&["link", "show", super::BRIDGE]).is_some()
        && ip(&["link", "delete", super::BRIDGE]).is_some()
    {
        removed += 1;
    }
    removed
}

/// What is left of a cluster: processes, mounts, and (`host_wide`) the node's cgroups, chains
/// and devices, each in words. Empty after a complete [`clean`].
pub fn leftovers(layout: &Layout, host_wide: bool) -> Vec<String> {
    let mut left = Vec::new();
    if let Some(processes) = Processes::read(&layout.processes_json) {
        left.extend(
            processes
                .components
                .iter()
                .filter(|(_, id)| id.is_running())
                .map(|(name, id)| format!("process {name} (pid {})", id.pid)),
        );
    }
    left.extend(
        our_shims(layout)
            .into_iter()
            .map(|pid| format!("shim pid {pid}")),
    );
    let mut prefixes = vec![layout.dir.as_path(), layout.run_dir.as_path()];
    if host_wide {
        prefixes.push(Path::new(KUBELET_PODS));
        prefixes.push(Path::new(AGENT_HOST_DIR));
    }
    left.extend(
        mounts_under(&prefixes)
            .into_iter()
            .map(|m| format!("mount {}", m.display())),
    );
    if !host_wide {
        return left;
    }
    left.extend(
        kubepods_cgroups()
            .into_iter()
            .map(|c| format!("cgroup {}", c.display())),
    );
    left.extend(
        iptables::remaining()
            .into_iter()
            .map(|c| format!("chain {c}")),
    );
    if ip(&["link", "show", super::BRIDGE]).is_some() {
        left.push(format!("device {}", super::BRIDGE));
    }
    if nodes::bridge_exists() {
        left.push(format!("device {}", nodes::NODES_BRIDGE));
    }
    left.extend(
        nodes::existing()
            .into_iter()
            .map(|i| format!("network namespace {}{}", nodes::NODE_PREFIX, i + 1)),
    );
    left.extend(
        nodes::cgroup_roots()
            .into_iter()
            .map(|c| format!("cgroup {}", c.display())),
    );
    left
}

/// Takes everything down (see the module docs); idempotent. Without `host_wide` (another
/// cluster runs this host's node) only this cluster's processes and containers and the mounts
/// under its state and run dirs go.
pub async fn clean(
    layout: &Layout,
    host_wide: bool,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    let recorded = Processes::read(&layout.processes_json).unwrap_or_default();
    let mut stopped = 0;
    for component in STOP_ORDER {
        for (name, id) in &recorded.components {
            if components::is_component(name, component) {
                stopped += usize::from(terminate_id(*id, COMPONENT_GRACE).await);
            }
        }
    }
    // the sandboxes' ids name libcni's loopback cache entries; read them before they go
    let sandboxes = sandbox_ids(layout);
    let mut containers = 0;
    for socket in layout.containerd_sockets() {
        containers += remove_containers(layout, &socket).await;
    }
    let killed = if host_wide {
        kill_pod_processes().await
    } else {
        0
    };
    for shim in our_shims(layout) {
        let _ = kill(Pid::from_raw(shim as i32), Signal::SIGKILL);
    }
    // containerd, then the control plane, etcd last, then anything else recorded
    for name in [
        components::CONTAINERD,
        components::APISERVER,
        components::ETCD,
    ] {
        if let Some(id) = recorded.components.get(name) {
            stopped += usize::from(terminate_id(*id, COMPONENT_GRACE).await);
        }
    }
    for id in recorded.components.values() {
        stopped += usize::from(terminate_id(*id, COMPONENT_GRACE).await);
    }
    // the further nodes: what is left in their namespaces, the namespaces, veths and cgroups
    let mut further_nodes = 0;
    if host_wide {
        for index in nodes::existing() {
            failures.extend(nodes::remove(&layout.run_dir, index));
            further_nodes += 1;
        }
        nodes::remove_bridge();
    }
    let pods = Path::new(KUBELET_PODS);
    let mut prefixes = vec![layout.dir.as_path(), layout.run_dir.as_path()];
    if host_wide {
        prefixes.push(pods);
        prefixes.push(Path::new(AGENT_HOST_DIR));
    }
    let (mounts, busy) = unmount_all(&prefixes);
    failures.extend(busy.into_iter().map(|m| format!("unmounting {m}")));
    let (mut chains, mut cgroups, mut devices) = (0, 0, 0);
    if host_wide {
        chains = match tokio::task::spawn_blocking(iptables::remove_all).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                failures.push(format!("iptables: {e:#}"));
                0
            }
            Err(e) => {
                failures.push(format!("iptables: {e}"));
                0
            }
        };
        remove_pod_dirs(&mut failures);
        cgroups = kubepods_cgroups().iter().map(|c| remove_cgroup(c)).sum();
        devices = remove_devices();
        remove_cni_state(layout, &sandboxes, &mut failures);
    }
    let _ = std::fs::remove_dir_all(&layout.run_dir);
    let _ = std::fs::remove_file(&layout.cluster_json);
    if let Some(mut processes) = Processes::read(&layout.processes_json) {
        processes.components.clear();
        if let Err(e) = processes.write(&layout.processes_json) {
            failures.push(format!("{e:#}"));
        }
    }
    report(format!(
        "removed {stopped} processes, {containers} containers ({killed} processes left in pod \
         cgroups killed), {mounts} mounts, {cgroups} cgroups, {chains} iptables chains, \
         {devices} network devices, {further_nodes} further nodes' namespaces"
    ));
    let left = leftovers(layout, host_wide);
    if !left.is_empty() {
        failures.push(format!("still there: {}", left.join(", ")));
    }
    if !failures.is_empty() {
        bail!("the cluster is not entirely down: {}", failures.join("; "));
    }
    Ok(())
}

/// Removes the kubelet's pod directories, only once nothing is mounted there: removing through
/// a mount would delete the mounted files.
fn remove_pod_dirs(failures: &mut Vec<String>) {
    let pods = Path::new(KUBELET_PODS);
    if !mounts_under(&[pods]).is_empty() {
        return;
    }
    for pod in std::fs::read_dir(pods).into_iter().flatten().flatten() {
        if let Err(e) = std::fs::remove_dir_all(pod.path()) {
            failures.push(format!("removing {}: {e}", pod.path().display()));
        }
    }
}

/// The ids of the pod sandboxes containerd's CRI plugin knows (its directories under the state
/// dir, so they are found when containerd no longer runs).
fn sandbox_ids(layout: &Layout) -> Vec<String> {
    ["root", "state"]
        .iter()
        .map(|d| {
            layout
                .containerd
                .join(d)
                .join("io.containerd.grpc.v1.cri/sandboxes")
        })
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// host-local's leases (under the state dir) and libcni's cached results: our network's, and
/// the loopback network's entries of our sandboxes (containerd names that network
/// `cni-loopback`; the pods were never torn down through CNI, only their namespaces removed).
fn remove_cni_state(layout: &Layout, sandboxes: &[String], failures: &mut Vec<String>) {
    if layout.cni_ipam_dir.exists()
        && let Err(e) = std::fs::remove_dir_all(&layout.cni_ipam_dir)
    {
        failures.push(format!("removing {}: {e}", layout.cni_ipam_dir.display()));
    }
    let ours = format!("{}-", super::CNI_NETWORK);
    for entry in std::fs::read_dir(CNI_RESULTS)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let loopback_of_ours = name
            .strip_prefix("cni-loopback-")
            .is_some_and(|rest| sandboxes.iter().any(|id| rest.starts_with(id.as_str())));
        if name.starts_with(&ours) || loopback_of_ours {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_under_a_prefix_deepest_first() {
        let all = mounts_under(&[Path::new("/")]);
        assert!(all.iter().any(|m| m == Path::new("/")));
        assert_eq!(all.last().map(PathBuf::as_path), Some(Path::new("/")));
        assert!(mounts_under(&[Path::new("/nonexistent-athenz")]).is_empty());
    }

    /// A mount that went with its peer (shared propagation, as a flex volume's `connect` bind in
    /// the kubelet's pod dir and under /var/athenz are) is not a failure: only what is still
    /// mounted after the last round is. Needs root, as the cluster does.
    #[test]
    fn a_mount_gone_with_its_peer_is_not_a_failure() {
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts: run it as root (the cluster's tests all do)"
        );
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let none: Option<&str> = None;
        // root a shared mount of its own, so the binds under it are peers
        mount(Some(root), root, none, MsFlags::MS_BIND, none).unwrap();
        mount(none, root, none, MsFlags::MS_SHARED, none).unwrap();
        for d in ["a", "c"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        mount(
            Some("tmpfs"),
            &root.join("a"),
            Some("tmpfs"),
            MsFlags::empty(),
            none,
        )
        .unwrap();
        mount(none, &root.join("a"), none, MsFlags::MS_SHARED, none).unwrap();
        mount(
            Some(&root.join("a")),
            &root.join("c"),
            none,
            MsFlags::MS_BIND,
            none,
        )
        .unwrap();
        std::fs::create_dir(root.join("a/x")).unwrap();
        mount(
            Some("tmpfs"),
            &root.join("a/x"),
            Some("tmpfs"),
            MsFlags::empty(),
            none,
        )
        .unwrap();
        let under = |p: &str| root.join(p);
        assert!(
            mounts_under(&[root]).contains(&under("c/x")),
            "propagated to the peer"
        );

        let (count, failed) = unmount_all(&[&under("a"), &under("c")]);
        assert!(failed.is_empty(), "{failed:?}");
        assert!(count >= 3, "{count}");
        assert!(mounts_under(&[&under("a"), &under("c")]).is_empty());

        umount2(root, MntFlags::MNT_DETACH).unwrap();
    }
}
