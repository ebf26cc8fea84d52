//! The host as a node needs it, done as kind's entrypoint does without systemd: `/` shared
//! recursively (CSI's Bidirectional mount propagation needs it), a machine id, `/dev/kmsg`, IP
//! forwarding and bridged traffic through iptables (Service replies between pods on one bridge
//! must be un-NATed) — and the tools a node runs, each checked with the package that has it.

use anyhow::{Context, bail};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};

/// Where Debian's `containernetworking-plugins` puts the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A tool a node needs, where to find it and the package that has it.
struct Tool {
    name: &'static str,
    package: &'static str,
}

const TOOLS: &[Tool] = &[
    Tool {
        name: "runc",
        package: "runc",
    },
    Tool {
        name: "iptables",
        package: "iptables",
    },
    Tool {
        name: "iptables-save",
        package: "iptables",
    },
    Tool {
        name: "iptables-restore",
        package: "iptables",
    },
    Tool {
        name: "ip6tables",
        package: "iptables",
    },
    Tool {
        name: "conntrack",
        package: "conntrack",
    },
    Tool {
        name: "ip",
        package: "iproute2",
    },
    Tool {
        name: "mount",
        package: "mount",
    },
    Tool {
        name: "buildah",
        package: "buildah",
    },
    Tool {
        name: "gcc",
        package: "gcc (and libc6-dev, for a static pause binary)",
    },
];

/// The CNI plugins the bridge network uses.
const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback", "portmap"];

/// Finds `name` on PATH (and in the sbin directories, which a non-login root PATH may lack).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Fails naming every missing tool and the package to install, when something is missing.
pub fn check_tools(layout: &super::Layout) -> anyhow::Result<()> {
    let mut missing: Vec<String> = TOOLS
        .iter()
        .filter(|t| find_tool(t.name).is_none())
        .map(|t| format!("{} (apt-get install {})", t.name, t.package))
        .collect();
    missing.extend(
        CNI_PLUGINS
            .iter()
            .filter(|p| !Path::new(CNI_BIN_DIR).join(p).is_file())
            .map(|p| format!("{CNI_BIN_DIR}/{p} (apt-get install containernetworking-plugins)")),
    );
    missing.extend(
        [
            "kube",
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "kubelet",
            "kubectl",
            "etcd",
        ]
        .iter()
        .filter(|b| !layout.bin(b).exists())
        .map(|b| {
            format!(
                "{} (run harness/real-node/kube/build.sh)",
                layout.bin(b).display()
            )
        }),
    );
    if !missing.is_empty() {
        bail!(
            "a node needs tools that are missing here: {}",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Makes the host ready to be a node (see the module docs). Needs root.
pub fn prepare() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("cluster up runs a kubelet, containerd and iptables: it needs root");
    }
    use nix::mount::{MsFlags, mount};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .context("mount --make-rshared /")?;
    let machine_id = Path::new("/etc/machine-id");
    let has_id = std::fs::read_to_string(machine_id).is_ok_and(|id| id.trim().len() == 32);
    if !has_id {
        std::fs::write(machine_id, format!("{}\n", new_machine_id()))
            .context("writing /etc/machine-id")?;
    }
    let kmsg = Path::new("/dev/kmsg");
    if !kmsg.exists() {
        // kind's entrypoint does the same: the kubelet's OOM watcher reads it
        std::os::unix::fs::symlink("/dev/console", kmsg).context("linking /dev/kmsg")?;
    }
    if !Path::new("/proc/sys/net/bridge").exists() {
        // a kernel with bridge netfilter as a module (this one has it built in)
        let _ = std::process::Command::new("modprobe")
            .arg("br_netfilter")
            .status();
        if !Path::new("/proc/sys/net/bridge").exists() {
            bail!(
                "no /proc/sys/net/bridge: the kernel lacks bridge netfilter (modprobe \
                 br_netfilter failed), which Service traffic between pods on one bridge needs"
            );
        }
    }
    for (key, value) in [
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
        ("net/bridge/bridge-nf-call-ip6tables", "1"),
    ] {
        let path = Path::new("/proc/sys").join(key);
        std::fs::write(&path, value).with_context(|| format!("setting {}", path.display()))?;
    }
    Ok(())
}

/// A new machine id: 32 random lowercase hex digits, as `/etc/machine-id` holds (the host's
/// when it has none, each further node's own).
pub fn new_machine_id() -> String {
    (0..32)
        .map(|_| {
            char::from_digit((athenz_core::random::unit() * 16.0) as u32 % 16, 16).unwrap_or('0')
        })
        .collect()
}

/// Whether this process may lower an `oom_score_adj` (it holds CAP_SYS_RESOURCE). Some
/// sandboxes and VMs drop it from every process's bounding set; then runc cannot give a pod's
/// pause container kubelet's -998 ("nsexec: failed to update /proc/self/oom_score_adj:
/// Permission denied") and containerd must clamp the scores instead.
pub fn can_lower_oom_score_adj() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The node's address: the source address of the default route (no packet is sent).
pub fn default_ipv4() -> anyhow::Result<Ipv4Addr> {
    let socket = UdpSocket::bind("0.0.0.0:0").context("binding a UDP socket")?;
    socket.connect("198.51.100.1:9").context(
        "finding the default route's source address (no default route?); pass --node-ip",
    )?;
    match socket
        .local_addr()
        .context("reading the socket's address")?
        .ip()
    {
        std::net::IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Ok(ip),
        other => bail!(
            "the default route's source address is {other}; the API server refuses loopback: \
             pass --node-ip"
        ),
    }
}

/// The node's name: this host's name, lowercased, if it is a valid node name; else
/// `devstack-node`.
pub fn default_node_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if is_dns_subdomain(&name) {
        name
    } else {
        "devstack-node".to_owned()
    }
}

/// RFC 1123 subdomain, as Kubernetes requires of node names.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert!(is_dns_subdomain("node-1.example"));
        assert!(!is_dns_subdomain("Node_1"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain(""));
        assert!(is_dns_subdomain(&default_node_name()));
    }
}
