//! OCI bundles (runtime-spec `config.json`) as a CRI runtime writes them for kubelet's pods: a
//! sandbox holding the pod's network, IPC and UTS namespaces, and containers that join those and
//! have their own mount and PID namespaces, a read-only root file system, the pod's volumes
//! bound in and `linux.cgroupsPath` in kubelet's cgroupfs shape.

use super::RuntimeError;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// A volume bound into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// Where the container sees it.
    pub destination: String,
    /// The host directory (kubelet's volume directory), bound recursively: a flex volume's
    /// `connect/` is itself a bind mount of the agent's socket directory.
    pub source: PathBuf,
    /// Mounted read-only (`readOnly: true` in the pod spec).
    pub read_only: bool,
}

/// Whose namespaces a container has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespaces {
    /// The sandbox: new network, IPC, UTS, PID and mount namespaces.
    Sandbox,
    /// The sandbox of a `hostNetwork: true` pod: the host's network namespace, new IPC, UTS,
    /// PID and mount namespaces.
    HostNetworkSandbox,
    /// An application or init container: the network, IPC and UTS namespaces of the sandbox
    /// whose process is this pid, new PID and mount namespaces of its own.
    JoinSandbox(i32),
}

/// What one container's `config.json` says.
#[derive(Debug, Clone)]
pub struct BundleSpec<'a> {
    /// The process: program and arguments.
    pub args: &'a [String],
    /// Its environment.
    pub env: &'a [(String, String)],
    /// Its working directory, in the container.
    pub cwd: &'a str,
    /// The root file system (mounted read-only).
    pub rootfs: &'a Path,
    /// Volumes, besides `/proc`, `/dev` and a small `/tmp`.
    pub volumes: &'a [VolumeMount],
    /// `linux.cgroupsPath`: `/<cgroup root>/kubepods[/<qos>]/pod<uid>/<container id>`.
    pub cgroups_path: &'a str,
    /// Its namespaces.
    pub namespaces: Namespaces,
}

/// The runtime-spec configuration for `spec`.
pub fn config(spec: &BundleSpec<'_>) -> Value {
    let env: Vec<String> =
        std::iter::once("PATH=/opt/athenz/bin:/usr/local/bin:/usr/bin:/bin".to_owned())
            .chain(spec.env.iter().map(|(k, v)| format!("{k}={v}")))
            .collect();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "noexec", "size=1m"]}),
    ];
    mounts.extend(spec.volumes.iter().map(|v| {
        let mut options = vec!["rbind", "nosuid", "nodev"];
        if v.read_only {
            options.push("ro");
        }
        json!({"destination": v.destination, "type": "bind",
               "source": v.source.display().to_string(), "options": options})
    }));
    let (namespaces, hostname) = match spec.namespaces {
        Namespaces::Sandbox => (
            json!([{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
                   {"type": "mount"}]),
            Some("pod"),
        ),
        Namespaces::HostNetworkSandbox => (
            json!([{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]),
            Some("pod"),
        ),
        Namespaces::JoinSandbox(pid) => (
            json!([{"type": "pid"}, {"type": "mount"},
                   {"type": "network", "path": format!("/proc/{pid}/ns/net")},
                   {"type": "ipc", "path": format!("/proc/{pid}/ns/ipc")},
                   {"type": "uts", "path": format!("/proc/{pid}/ns/uts")}]),
            None,
        ),
    };
    let mut config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": spec.args,
            "env": env,
            "cwd": spec.cwd,
            "noNewPrivileges": true,
            // no capabilities at all: the SIA needs none (it talks to a socket and writes files)
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        },
        "root": {"path": spec.rootfs.display().to_string(), "readonly": true},
        "mounts": mounts,
        "linux": {
            "cgroupsPath": spec.cgroups_path,
            "namespaces": namespaces,
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"],
        },
    });
    if let (Some(hostname), Some(object)) = (hostname, config.as_object_mut()) {
        object.insert("hostname".into(), json!(hostname));
    }
    config
}

/// Writes `dir/config.json` for `spec` (creating `dir`).
pub fn write(dir: &Path, spec: &BundleSpec<'_>) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io(dir, e))?;
    let path = dir.join("config.json");
    let text = serde_json::to_vec_pretty(&config(spec)).map_err(|e| RuntimeError::Failed {
        what: format!("writing {}", path.display()),
        output: e.to_string(),
    })?;
    std::fs::write(&path, text).map_err(|e| RuntimeError::io(&path, e))
}

/// A read-only root file system for the pod's containers, as an image would hold it: the
/// host's `/usr` (the C library the dynamically linked development binaries need; the shipped
/// SIA is static and would need none), `lib*`/`bin` as the host has them, the given binaries at
/// their paths, and the mount points of `/proc`, `/dev`, `/tmp` and the volumes.
#[derive(Debug, Clone)]
pub struct Rootfs {
    dir: PathBuf,
    binds: Vec<VolumeMount>,
}

impl Rootfs {
    /// Makes the tree in `dir`; `binaries` are (host file, path in the container) pairs, and
    /// `mount_points` the volumes' destinations.
    pub fn prepare(
        dir: &Path,
        binaries: &[(PathBuf, &str)],
        mount_points: &[&str],
    ) -> Result<Self, RuntimeError> {
        let mkdir = |p: &Path| std::fs::create_dir_all(p).map_err(|e| RuntimeError::io(p, e));
        mkdir(dir)?;
        let mut binds = vec![VolumeMount {
            destination: "/usr".into(),
            source: "/usr".into(),
            read_only: true,
        }];
        for d in ["usr", "proc", "dev", "tmp", "etc"] {
            mkdir(&dir.join(d))?;
        }
        for top in ["lib", "lib64", "lib32", "bin", "sbin"] {
            let host = Path::new("/").join(top);
            let here = dir.join(top);
            match std::fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target =
                        std::fs::read_link(&host).map_err(|e| RuntimeError::io(&host, e))?;
                    if std::fs::symlink_metadata(&here).is_err() {
                        std::os::unix::fs::symlink(&target, &here)
                            .map_err(|e| RuntimeError::io(&here, e))?;
                    }
                }
                Ok(m) if m.is_dir() => {
                    mkdir(&here)?;
                    binds.push(VolumeMount {
                        destination: format!("/{top}"),
                        source: host,
                        read_only: true,
                    });
                }
                _ => {}
            }
        }
        for (host, inside) in binaries {
            let point = dir.join(inside.trim_start_matches('/'));
            if let Some(parent) = point.parent() {
                mkdir(parent)?;
            }
            if !point.exists() {
                std::fs::write(&point, b"").map_err(|e| RuntimeError::io(&point, e))?;
            }
            binds.push(VolumeMount {
                destination: (*inside).to_owned(),
                source: host.clone(),
                read_only: true,
            });
        }
        for point in mount_points {
            mkdir(&dir.join(point.trim_start_matches('/')))?;
        }
        Ok(Self {
            dir: dir.to_owned(),
            binds,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binds every container of this root file system needs (`/usr`, the binaries).
    pub fn binds(&self) -> &[VolumeMount] {
        &self.binds
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_container_joins_the_sandbox_and_keeps_its_own_pid_and_mounts() {
        let args = vec!["/usr/local/bin/athenz-sia".to_owned(), "init".to_owned()];
        let env = vec![("OUT_DIR".to_owned(), "/var/run/athenz".to_owned())];
        let volumes = vec![VolumeMount {
            destination: "/var/athenz/identity".into(),
            source: "/k/pods/u/volumes/athenz~volume-driver/athenz-identity".into(),
            read_only: true,
        }];
        let c = config(&BundleSpec {
            args: &args,
            env: &env,
            cwd: "/",
            rootfs: Path::new("/r"),
            volumes: &volumes,
            cgroups_path: "/athenz-x/kubepods/besteffort/podu/c1",
            namespaces: Namespaces::JoinSandbox(42),
        });
        assert_eq!(c["root"]["readonly"], true);
        assert_eq!(
            c["linux"]["cgroupsPath"],
            "/athenz-x/kubepods/besteffort/podu/c1"
        );
        let ns = c["linux"]["namespaces"].as_array().unwrap();
        let path_of = |t: &str| {
            ns.iter()
                .find(|n| n["type"] == t)
                .map(|n| n["path"].clone())
        };
        assert_eq!(path_of("network"), Some(json!("/proc/42/ns/net")));
        assert_eq!(path_of("ipc"), Some(json!("/proc/42/ns/ipc")));
        assert_eq!(path_of("uts"), Some(json!("/proc/42/ns/uts")));
        assert_eq!(
            path_of("pid"),
            Some(Value::Null),
            "a PID namespace of its own"
        );
        assert_eq!(
            path_of("mount"),
            Some(Value::Null),
            "a mount namespace of its own"
        );
        assert!(
            c.get("hostname").is_none(),
            "the sandbox's UTS namespace names it"
        );
        let identity = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/var/athenz/identity")
            .unwrap();
        assert_eq!(
            identity["options"],
            json!(["rbind", "nosuid", "nodev", "ro"])
        );
        assert_eq!(c["process"]["env"][1], "OUT_DIR=/var/run/athenz");
        assert_eq!(c["process"]["capabilities"]["effective"], json!([]));
    }

    #[test]
    fn the_sandbox_has_every_namespace_new_and_a_hostname() {
        let c = config(&BundleSpec {
            args: &["/pause".to_owned()],
            env: &[],
            cwd: "/",
            rootfs: Path::new("/r"),
            volumes: &[],
            cgroups_path: "/kubepods/podu/s",
            namespaces: Namespaces::Sandbox,
        });
        let ns = c["linux"]["namespaces"].as_array().unwrap();
        assert_eq!(ns.len(), 5);
        assert!(ns.iter().all(|n| n.get("path").is_none()));
        assert_eq!(c["hostname"], "pod");
    }
}
