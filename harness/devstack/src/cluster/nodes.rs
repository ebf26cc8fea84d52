//! The cluster's nodes. The first (the primary) is this host as it is: its network, its
//! `/var/lib/kubelet`, its `cni0` and iptables. Each further node (`cluster up --nodes N`) is a
//! node of its own on the same kernel, as kind's node containers are, without an image:
//!
//! - a network namespace (`athenz-devstack-<n>`, n = 2 for the second node) joined to the host
//!   by a veth on the bridge [`NODES_BRIDGE`] (the host is `10.250.0.1`, node n is
//!   `10.250.0.<n>`), its default route
//!   through the host, its own `cni0`, iptables and conntrack; the host routes each node's pod
//!   range to it, so pods reach each other across nodes and the API server is the host's address;
//! - a mount namespace, kept by a bind of its `/proc/<pid>/ns/mnt` as `ip netns` keeps network
//!   namespaces, a slave of the host's (the host's mounts reach it, its own never reach the host),
//!   where the node's own directories are bound over the paths Kubernetes and `deploy/` fix,
//!   each made `rshared` as Bidirectional mount propagation needs: its own `/var` (so
//!   `/var/lib/kubelet`, `/var/athenz` — the agent's hostPath —, CNI's cache and logs are the
//!   node's, and plain directories there, which docs/operating.md's uninstall removes as on a
//!   host) and the flex volume plugin directory; and its own `/etc/machine-id`;
//! - a cgroup root of its own (`/athenz-devstack-<n>` in every hierarchy), the kubelet's
//!   `cgroupRoot`, so its `kubepods` never meet the primary's.
//!
//! Its containerd, kubelet and kube-proxy run inside both namespaces through `nsenter`, which
//! execs them (the recorded pid is the component's own).

use super::images::run;
use anyhow::{Context, bail};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The host's bridge the further nodes' veths hang on.
pub const NODES_BRIDGE: &str = "athnodes0";
/// The host's address on [`NODES_BRIDGE`] (the further nodes' default gateway).
pub const HOST_ON_NODES: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// The nodes' network's prefix length.
const NODES_PREFIX: u8 = 24;
/// The most nodes a cluster may have: one host's cores and memory, and one octet of addresses.
pub const MAX_NODES: usize = 8;
/// The prefix of the further nodes' network namespaces, cgroup roots and veths.
pub const NODE_PREFIX: &str = "athenz-devstack-";
/// Where `ip netns` keeps named network namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The cgroup hierarchies.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The kubelet's root directory, which CSI's and plugin registration's paths depend on.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// The agent's host directory (deploy/base's hostPath).
pub const AGENT_HOST_DIR: &str = "/var/athenz";
/// The kubelet's flex volume plugin directory (its default `--volume-plugin-dir`).
pub const FLEX_DIR: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";

/// One node of the cluster: its place (0 is the primary), name and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// 0 for the primary (this host's namespaces), 1.. for the further nodes.
    pub index: usize,
    pub name: String,
    pub ip: Ipv4Addr,
}

impl NodeSpec {
    /// The nodes of a cluster of `count`: the primary as given, the others named
    /// `<primary>-<n>` (n from 2) at `10.250.0.<n>`.
    pub fn all(
        primary_name: &str,
        primary_ip: Ipv4Addr,
        count: usize,
    ) -> anyhow::Result<Vec<Self>> {
        if count == 0 || count > MAX_NODES {
            bail!("--nodes {count}: a cluster here has 1 to {MAX_NODES} nodes");
        }
        let mut nodes = vec![Self {
            index: 0,
            name: primary_name.to_owned(),
            ip: primary_ip,
        }];
        let [a, b, c, _] = HOST_ON_NODES.octets();
        for index in 1..count {
            let n = index as u8 + 1;
            nodes.push(Self {
                index,
                name: format!("{primary_name}-{n}"),
                ip: Ipv4Addr::new(a, b, c, n),
            });
        }
        Ok(nodes)
    }

    /// Whether this is the host's own node.
    pub fn is_primary(&self) -> bool {
        self.index == 0
    }

    /// Its network namespace's name, cgroup root and host-side veth prefix.
    pub fn namespace(&self) -> String {
        format!("{NODE_PREFIX}{}", self.number())
    }

    /// Its number as its name and processes carry it: 1 for the primary, 2 for the next.
    pub fn number(&self) -> usize {
        self.index + 1
    }

    /// Its kubelet's `cgroupRoot`.
    pub fn cgroup_root(&self) -> String {
        if self.is_primary() {
            "/".to_owned()
        } else {
            format!("/{}", self.namespace())
        }
    }

    /// The name its components' processes and logs carry: `kubelet` on the primary,
    /// `kubelet-2` on the second node.
    pub fn process_name(&self, component: &str) -> String {
        if self.is_primary() {
            component.to_owned()
        } else {
            format!("{component}-{}", self.number())
        }
    }
}

/// The namespaces of a further node, as files `nsenter` enters.
#[derive(Debug, Clone)]
pub struct NodeNamespaces {
    /// `/run/netns/<name>`.
    pub net: PathBuf,
    /// The bind of its mount namespace.
    pub mount: PathBuf,
}

impl NodeNamespaces {
    /// Where the namespaces of node `node` of the cluster whose run dir is `run_dir` are.
    pub fn of(run_dir: &Path, node: &NodeSpec) -> Self {
        Self {
            net: Path::new(NETNS_DIR).join(node.namespace()),
            mount: mount_ns_dir(run_dir).join(format!("mnt-{}", node.number())),
        }
    }

    /// `nsenter` running `program args` inside both namespaces: the program and arguments to
    /// start instead.
    pub fn wrap(&self, program: &Path, args: Vec<String>) -> (PathBuf, Vec<String>) {
        let mut wrapped = vec![
            format!("--net={}", self.net.display()),
            format!("--mount={}", self.mount.display()),
            "--".to_owned(),
            program.display().to_string(),
        ];
        wrapped.extend(args);
        (PathBuf::from("nsenter"), wrapped)
    }

    /// A `std::process::Command` running `program` inside both namespaces.
    pub fn command(&self, program: &Path) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.net.display()))
            .arg(format!("--mount={}", self.mount.display()))
            .arg("--")
            .arg(program);
        command
    }
}

/// The directory the mount namespaces' binds live in: a private mount of its own (a namespace
/// file cannot be bound onto a shared mount).
fn mount_ns_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("ns")
}

/// The node's `/var`, under the node's own directory.
const NODE_VAR: &str = "var";
/// Where `/var`'s links point on a host (systemd's layout): the node keeps the host's `/run`.
const VAR_LINKS: [(&str, &str); 2] = [("run", "/run"), ("lock", "/run/lock")];

/// The per-node directories bound over the host's paths, under `node_dir`.
fn bound_dirs(node_dir: &Path) -> [(PathBuf, &'static str); 2] {
    [
        (node_dir.join(NODE_VAR), "/var"),
        (node_dir.join("volume-plugins"), FLEX_DIR),
    ]
}

/// Where a path of a further node's own (under its `/var` or the flex plugin dir) is, as the
/// host sees it: `None` for a path the node shares with the host.
pub fn host_path(node_dir: &Path, path_on_node: &Path) -> Option<PathBuf> {
    bound_dirs(node_dir)
        .into_iter()
        .find_map(|(source, target)| {
            let rest = path_on_node.strip_prefix(target).ok()?;
            Some(source.join(rest))
        })
}

/// A further node's `/var` as a fresh host's: its links into `/run` and a sticky `tmp`.
fn prepare_node_var(var: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(var.join("lib"))
        .with_context(|| format!("creating {}", var.display()))?;
    for (link, target) in VAR_LINKS {
        let link = var.join(link);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(target, &link)
                .with_context(|| format!("linking {} to {target}", link.display()))?;
        }
    }
    let tmp = var.join("tmp");
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
        .with_context(|| format!("making {} sticky", tmp.display()))?;
    Ok(())
}

/// `ip <args>`, failing with what it said.
fn ip(args: &[&str]) -> anyhow::Result<String> {
    run(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
}

/// Makes the host's bridge for the further nodes (once per cluster).
pub fn create_bridge() -> anyhow::Result<()> {
    if ip(&["link", "show", NODES_BRIDGE]).is_err() {
        ip(&["link", "add", NODES_BRIDGE, "type", "bridge"])?;
    }
    let address = format!("{HOST_ON_NODES}/{NODES_PREFIX}");
    ip(&["addr", "replace", &address, "dev", NODES_BRIDGE])?;
    ip(&["link", "set", NODES_BRIDGE, "up"])?;
    Ok(())
}

/// Makes node `node`'s namespaces, its network and its cgroup root (see the module docs);
/// `node_dir` holds its own directories.
pub fn create(run_dir: &Path, node_dir: &Path, node: &NodeSpec) -> anyhow::Result<NodeNamespaces> {
    let namespaces = NodeNamespaces::of(run_dir, node);
    create_network(node)?;
    create_mount_namespace(&namespaces, node_dir)?;
    create_cgroup_root(node)?;
    Ok(namespaces)
}

/// The network namespace, its veth on [`NODES_BRIDGE`], its address and default route, and the
/// forwarding a node's pods need (set inside it: these sysctls are per namespace).
fn create_network(node: &NodeSpec) -> anyhow::Result<()> {
    let netns = node.namespace();
    let host_side = format!("athn{}", node.number());
    let _ = ip(&["netns", "delete", &netns]);
    let _ = ip(&["link", "delete", &host_side]);
    ip(&["netns", "add", &netns])?;
    ip(&[
        "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns", &netns,
    ])?;
    ip(&["link", "set", &host_side, "master", NODES_BRIDGE, "up"])?;
    let address = format!("{}/{NODES_PREFIX}", node.ip);
    let gateway = HOST_ON_NODES.to_string();
    for args in [
        vec!["link", "set", "lo", "up"],
        vec!["addr", "add", &address, "dev", "eth0"],
        vec!["link", "set", "eth0", "up"],
        vec!["route", "add", "default", "via", &gateway],
    ] {
        let mut all = vec!["-n", &netns];
        all.extend(args);
        ip(&all)?;
    }
    let sysctls = "echo 1 > /proc/sys/net/ipv4/ip_forward \
                   && echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables \
                   && echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables";
    run(
        Command::new("ip")
            .args(["netns", "exec", &netns, "sh", "-c"])
            .arg(sysctls),
        &format!("forwarding in {netns}"),
    )?;
    Ok(())
}

/// The mount namespace (see the module docs), kept by a bind under the run dir.
fn create_mount_namespace(namespaces: &NodeNamespaces, node_dir: &Path) -> anyhow::Result<()> {
    let dir = namespaces
        .mount
        .parent()
        .context("a mount namespace's file has a directory")?;
    make_private_dir(dir)?;
    let _ = nix::mount::umount2(&namespaces.mount, nix::mount::MntFlags::MNT_DETACH);
    std::fs::write(&namespaces.mount, b"")
        .with_context(|| format!("creating {}", namespaces.mount.display()))?;
    if node_dir.starts_with("/var") {
        bail!(
            "{}: a further node's files cannot live under /var, which the node has its own of \
             (choose a --state-dir elsewhere)",
            node_dir.display()
        );
    }
    prepare_node_var(&node_dir.join(NODE_VAR))?;
    let mut script = String::from("set -e\n");
    for (source, target) in bound_dirs(node_dir) {
        std::fs::create_dir_all(&source)
            .with_context(|| format!("creating {}", source.display()))?;
        std::fs::create_dir_all(target).with_context(|| format!("creating {target}"))?;
        // shared, as on a host whose / is rshared: Bidirectional mounts of them need it
        script.push_str(&format!(
            "mount --bind '{}' {target}\nmount --make-rshared {target}\n",
            source.display()
        ));
    }
    let machine_id = node_dir.join("machine-id");
    std::fs::write(&machine_id, format!("{}\n", super::host::new_machine_id()))
        .with_context(|| format!("writing {}", machine_id.display()))?;
    script.push_str(&format!(
        "mount --bind '{}' /etc/machine-id\n",
        machine_id.display()
    ));
    run(
        Command::new("unshare")
            .arg(format!("--mount={}", namespaces.mount.display()))
            .arg("--propagation=slave")
            .args(["sh", "-c"])
            .arg(script),
        "making a node's mount namespace (unshare --mount)",
    )?;
    Ok(())
}

/// Makes `dir` a private bind mount of itself, as `ip netns` does for `/run/netns`.
fn make_private_dir(dir: &Path) -> anyhow::Result<()> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let table = athenz_core::volume_mount::mountinfo::MountTable::read().unwrap_or_default();
    if !table.under(dir).any(|m| m == dir) {
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .with_context(|| format!("binding {} onto itself", dir.display()))?;
    }
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .with_context(|| format!("making {} private", dir.display()))?;
    Ok(())
}

/// The hierarchies under /sys/fs/cgroup (v1 controllers, the named ones, and v2's).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir(CGROUP_ROOT)
        .map(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// The node's cgroup root in every hierarchy (the kubelet refuses a `cgroupRoot` missing from
/// one); cpuset's gets its parent's CPUs and memory nodes, which a new v1 cpuset lacks.
fn create_cgroup_root(node: &NodeSpec) -> anyhow::Result<()> {
    for hierarchy in cgroup_hierarchies() {
        let cgroup = hierarchy.join(node.namespace());
        std::fs::create_dir_all(&cgroup)
            .with_context(|| format!("creating the cgroup {}", cgroup.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let parent = hierarchy.join(file);
            if let Ok(value) = std::fs::read_to_string(&parent) {
                let value = value.trim();
                if !value.is_empty() {
                    std::fs::write(cgroup.join(file), value)
                        .with_context(|| format!("writing {}", cgroup.join(file).display()))?;
                }
            }
        }
    }
    Ok(())
}

/// Routes `pod_cidr` to `node` through [`NODES_BRIDGE`].
pub fn route_pods(node: &NodeSpec, pod_cidr: &str) -> anyhow::Result<()> {
    let via = node.ip.to_string();
    ip(&[
        "route",
        "replace",
        pod_cidr,
        "via",
        &via,
        "dev",
        NODES_BRIDGE,
    ])?;
    Ok(())
}

/// The further nodes that exist now (their network namespaces), by index (1..).
pub fn existing() -> Vec<usize> {
    let mut found: Vec<usize> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(NODE_PREFIX)?
                .parse::<usize>()
                .ok()?
                .checked_sub(1)
        })
        .collect();
    found.sort_unstable();
    found
}

/// The inode of a namespace file (what `/proc/<pid>/ns/*` of a process inside it links to).
fn ns_inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Every process inside the namespace `file` names (`kind` is `net` or `mnt`).
pub fn processes_in(file: &Path, kind: &str) -> Vec<i32> {
    let Some(inode) = ns_inode(file) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            ns_inode(
                &Path::new("/proc")
                    .join(pid.to_string())
                    .join("ns")
                    .join(kind),
            ) == Some(inode)
        })
        .collect()
}

/// SIGKILLs every process inside the node's namespaces (as a power loss ends them) until none
/// is left or 5 s have passed; returns how many were killed.
pub fn kill_inside(namespaces: &NodeNamespaces) -> usize {
    use nix::sys::signal::{Signal, kill};
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let mut inside = processes_in(&namespaces.net, "net");
        inside.extend(processes_in(&namespaces.mount, "mnt"));
        if inside.is_empty() {
            break;
        }
        for pid in inside {
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            killed.insert(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    killed.len()
}

/// Removes node `index`'s namespaces, veth and cgroup root: every process left inside is
/// SIGKILLed first (its containerd and containers were asked to go before). Returns what
/// would not go, in words.
pub fn remove(run_dir: &Path, index: usize) -> Vec<String> {
    let node = NodeSpec {
        index,
        name: String::new(),
        ip: Ipv4Addr::UNSPECIFIED,
    };
    let namespaces = NodeNamespaces::of(run_dir, &node);
    let mut failures = Vec::new();
    kill_inside(&namespaces);
    if namespaces.mount.exists() {
        let _ = nix::mount::umount2(&namespaces.mount, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&namespaces.mount);
    }
    let netns = node.namespace();
    if namespaces.net.exists()
        && let Err(e) = ip(&["netns", "delete", &netns])
    {
        failures.push(format!("{e:#}"));
    }
    let _ = ip(&["link", "delete", &format!("athn{}", node.number())]);
    for hierarchy in cgroup_hierarchies() {
        let root = hierarchy.join(&netns);
        if root.exists() {
            remove_cgroup_tree(&root);
            if root.exists() {
                failures.push(format!("cgroup {} (still there)", root.display()));
            }
        }
    }
    failures
}

/// Removes the host's bridge for the further nodes (with it go their routes).
pub fn remove_bridge() -> bool {
    ip(&["link", "show", NODES_BRIDGE]).is_ok() && ip(&["link", "delete", NODES_BRIDGE]).is_ok()
}

/// Whether the host's bridge for the further nodes is there.
pub fn bridge_exists() -> bool {
    ip(&["link", "show", NODES_BRIDGE]).is_ok()
}

/// The further nodes' cgroup roots left in any hierarchy.
pub fn cgroup_roots() -> Vec<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .flat_map(|h| std::fs::read_dir(h).into_iter().flatten())
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(NODE_PREFIX))
        .map(|e| e.path())
        .collect()
}

/// Kills what is left in a cgroup tree, then removes it deepest first.
fn remove_cgroup_tree(cgroup: &Path) {
    use nix::sys::signal::{Signal, kill};
    for child in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            remove_cgroup_tree(&child.path());
        }
    }
    if let Ok(text) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    for _ in 0..20 {
        if std::fs::remove_dir(cgroup).is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_and_addressed_from_the_primary() {
        let nodes = NodeSpec::all("host", Ipv4Addr::new(192, 0, 2, 2), 3).unwrap();
        assert_eq!(nodes[0].name, "host");
        assert_eq!(nodes[0].cgroup_root(), "/");
        assert_eq!(nodes[0].process_name("kubelet"), "kubelet");
        assert_eq!(nodes[2].name, "host-3");
        assert_eq!(nodes[2].ip, Ipv4Addr::new(10, 250, 0, 3));
        assert_eq!(nodes[2].cgroup_root(), "/athenz-devstack-3");
        assert_eq!(nodes[2].process_name("kubelet"), "kubelet-3");
        assert!(NodeSpec::all("host", Ipv4Addr::LOCALHOST, 0).is_err());
        assert!(NodeSpec::all("host", Ipv4Addr::LOCALHOST, MAX_NODES + 1).is_err());
    }

    #[test]
    fn a_nodes_own_paths_map_to_its_directory_and_shared_ones_do_not() {
        let dir = Path::new("/s/nodes/2");
        assert_eq!(
            host_path(dir, Path::new(KUBELET_ROOT)),
            Some(PathBuf::from("/s/nodes/2/var/lib/kubelet"))
        );
        assert_eq!(
            host_path(dir, Path::new(AGENT_HOST_DIR)),
            Some(PathBuf::from("/s/nodes/2/var/athenz"))
        );
        assert_eq!(
            host_path(dir, &Path::new(FLEX_DIR).join("athenz~volume-driver")),
            Some(PathBuf::from(
                "/s/nodes/2/volume-plugins/athenz~volume-driver"
            ))
        );
        assert_eq!(host_path(dir, Path::new("/etc/hosts")), None);
        assert_eq!(host_path(dir, Path::new("/variable")), None);
    }

    #[test]
    fn nsenter_enters_both_namespaces_and_execs_the_program() {
        let node = &NodeSpec::all("h", Ipv4Addr::LOCALHOST, 2).unwrap()[1];
        let ns = NodeNamespaces::of(Path::new("/run/x"), node);
        let (program, args) = ns.wrap(Path::new("/bin/kubelet"), vec!["--v=2".to_owned()]);
        assert_eq!(program, PathBuf::from("nsenter"));
        assert_eq!(
            args,
            [
                "--net=/run/netns/athenz-devstack-2",
                "--mount=/run/x/ns/mnt-2",
                "--",
                "/bin/kubelet",
                "--v=2"
            ]
        );
    }
}
