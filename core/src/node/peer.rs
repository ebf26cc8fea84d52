//! Which pod a process on the agent's Unix socket belongs to (docs/design.md §4.2, peer binding).
//!
//! The kernel tells the agent the caller's pid (`SO_PEERCRED`, fixed at `connect()`); the kubelet
//! put every container of a pod in a cgroup whose path carries the pod UID. So the agent reads
//! `/proc/<pid>/cgroup` and finds that UID. Two things make this sound:
//!
//! - **The process is pinned at accept.** A pid can be reused once its process exits, so a reader
//!   of `/proc/<pid>` could see another process. Where the kernel has `SO_PEERPIDFD` (6.5+) the
//!   agent keeps a pidfd of the exact process that connected and, after reading its cgroup,
//!   checks through `/proc/self/fdinfo/<pidfd>` that this process is still alive under that pid:
//!   a live process's pid cannot have been reused, so what was read was its own. Elsewhere it
//!   keeps a directory fd on `/proc/<pid>` and the process's start time (field 22 of `stat`),
//!   reads the cgroup through that fd and re-reads the start time after (a dead process's
//!   directory answers ESRCH; a new one has another start time), as SPIRE's peer tracker does.
//! - **Every line is read.** On hybrid hosts the `0::` line may carry no pod while the v1 lines
//!   do; all lines that name a pod must name the same one.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

/// Longest `/proc/<pid>/cgroup` read (a v1 host with every controller is well under 4 KiB).
const MAX_CGROUP_TEXT: u64 = 64 * 1024;
/// Length of a UUID in text form.
const UUID_LEN: usize = 36;

/// How the agent treats a caller whose cgroup is not the volume's pod (`--peer-check`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PeerCheck {
    /// Refuse (403) a caller that is not in the volume's pod.
    #[default]
    Enforce,
    /// Allow it, and log what enforcement would have refused.
    Log,
    /// Do not look (for hosts without pod cgroups; not for production).
    Off,
}

impl std::fmt::Display for PeerCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Enforce => "enforce",
            Self::Log => "log",
            Self::Off => "off",
        })
    }
}

/// Why the caller's pod could not be established.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The kernel reported no pid: the caller is in a pid namespace the agent cannot see.
    #[error(
        "the caller's pid is not visible to the agent (pid 0: another pid namespace); the agent must run with hostPID"
    )]
    NoPid,
    /// `/proc/<pid>` could not be read.
    #[error("reading /proc/{pid}/{file}: {source}")]
    Proc {
        /// The pid.
        pid: i32,
        /// `cgroup` or `stat`.
        file: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The process that connected is gone (its pid may now be another process's).
    #[error("the calling process {pid} exited before it could be identified")]
    Exited {
        /// The pid.
        pid: i32,
    },
    /// The cgroup file names no pod.
    #[error(
        "process {pid} is in no pod's cgroup (is kubelet running with cgroupsPerQOS=false, or is this a process outside any pod?)"
    )]
    NoPod {
        /// The pid.
        pid: i32,
    },
    /// The cgroup file's lines name different pods.
    #[error("process {pid}'s cgroups name two pods: {first} and {second}")]
    Ambiguous {
        /// The pid.
        pid: i32,
        /// One pod UID.
        first: String,
        /// Another.
        second: String,
    },
}

/// How the connecting process is held so its pid cannot be confused with a later process's.
#[derive(Debug)]
enum Pin {
    /// A pidfd from `SO_PEERPIDFD`.
    Pidfd(OwnedFd),
    /// A directory fd on `/proc/<pid>` and the start time read when it was opened.
    ProcDir { dir: OwnedFd, start_time: u64 },
}

/// The process on the other end of a Unix socket, pinned at accept.
#[derive(Debug)]
pub struct PeerProcess {
    pid: i32,
    pin: Pin,
}

impl PartialEq for PeerProcess {
    fn eq(&self, other: &Self) -> bool {
        self.pid == other.pid
    }
}
impl Eq for PeerProcess {}

impl PeerProcess {
    /// Pins the peer of a connected Unix socket whose `SO_PEERCRED` pid is `pid`: by pidfd where
    /// the kernel has one, else by `/proc/<pid>` and its start time.
    pub fn of_socket(socket: &impl AsFd, pid: i32) -> Result<Self, PeerError> {
        use nix::sys::socket::{getsockopt, sockopt::PeerPidfd};
        if pid <= 0 {
            return Err(PeerError::NoPid);
        }
        match getsockopt(socket, PeerPidfd) {
            Ok(fd) => Ok(Self {
                pid,
                pin: Pin::Pidfd(fd),
            }),
            Err(_) => Self::by_proc_dir(pid),
        }
    }

    /// Pins `pid` by a directory fd on `/proc/<pid>` and its start time (the fallback for kernels
    /// without `SO_PEERPIDFD`; public so it is tested on kernels that have it).
    pub fn by_proc_dir(pid: i32) -> Result<Self, PeerError> {
        if pid <= 0 {
            return Err(PeerError::NoPid);
        }
        let dir = nix::fcntl::open(
            &PathBuf::from(format!("/proc/{pid}")),
            nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| exited_or(pid, "stat", e))?;
        let start_time = read_start_time(&dir, pid)?;
        Ok(Self {
            pid,
            pin: Pin::ProcDir { dir, start_time },
        })
    }

    /// The pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the pin is a pidfd (else the `/proc` directory fallback).
    pub fn pinned_by_pidfd(&self) -> bool {
        matches!(self.pin, Pin::Pidfd(_))
    }

    /// The text of the process's `/proc/<pid>/cgroup`, proven to be the pinned process's.
    pub fn cgroup_text(&self) -> Result<String, PeerError> {
        match &self.pin {
            Pin::Pidfd(fd) => {
                let text = read_limited(
                    File::open(format!("/proc/{}/cgroup", self.pid))
                        .map_err(|e| self.proc_error("cgroup", e))?,
                )
                .map_err(|e| self.proc_error("cgroup", e))?;
                // Alive under the same pid after the read: the pid was never reused meanwhile.
                if pidfd_pid(fd)? != Some(self.pid) {
                    return Err(PeerError::Exited { pid: self.pid });
                }
                Ok(text)
            }
            Pin::ProcDir { dir, start_time } => {
                let file = nix::fcntl::openat(
                    dir,
                    "cgroup",
                    nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(|e| exited_or(self.pid, "cgroup", e))?;
                let text =
                    read_limited(File::from(file)).map_err(|e| self.proc_error("cgroup", e))?;
                if read_start_time(dir, self.pid)? != *start_time {
                    return Err(PeerError::Exited { pid: self.pid });
                }
                Ok(text)
            }
        }
    }

    /// The UID of the pod the process runs in.
    pub fn pod_uid(&self) -> Result<String, PeerError> {
        let text = self.cgroup_text()?;
        pod_uid_from_cgroup(&text)
            .map_err(|(first, second)| PeerError::Ambiguous {
                pid: self.pid,
                first,
                second,
            })?
            .ok_or(PeerError::NoPod { pid: self.pid })
    }

    fn proc_error(&self, file: &'static str, source: std::io::Error) -> PeerError {
        if source.raw_os_error() == Some(nix::libc::ESRCH)
            || source.kind() == std::io::ErrorKind::NotFound
        {
            PeerError::Exited { pid: self.pid }
        } else {
            PeerError::Proc {
                pid: self.pid,
                file,
                source,
            }
        }
    }
}

fn exited_or(pid: i32, file: &'static str, e: nix::errno::Errno) -> PeerError {
    match e {
        nix::errno::Errno::ENOENT | nix::errno::Errno::ESRCH => PeerError::Exited { pid },
        other => PeerError::Proc {
            pid,
            file,
            source: other.into(),
        },
    }
}

fn read_limited(file: File) -> std::io::Result<String> {
    let mut text = String::new();
    file.take(MAX_CGROUP_TEXT).read_to_string(&mut text)?;
    Ok(text)
}

/// The pid a pidfd refers to now, from `/proc/self/fdinfo` (`Pid: -1` once it exited).
fn pidfd_pid(fd: &OwnedFd) -> Result<Option<i32>, PeerError> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let text = std::fs::read_to_string(&path).map_err(|source| PeerError::Proc {
        pid: 0,
        file: "fdinfo",
        source,
    })?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|p| *p > 0))
}

/// Field 22 (`starttime`) of `stat`, read through a `/proc/<pid>` directory fd.
fn read_start_time(dir: &OwnedFd, pid: i32) -> Result<u64, PeerError> {
    let file = nix::fcntl::openat(
        dir,
        "stat",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| exited_or(pid, "stat", e))?;
    let text = read_limited(File::from(file)).map_err(|e| {
        if e.raw_os_error() == Some(nix::libc::ESRCH) {
            PeerError::Exited { pid }
        } else {
            PeerError::Proc {
                pid,
                file: "stat",
                source: e,
            }
        }
    })?;
    start_time_from_stat(&text).ok_or_else(|| PeerError::Proc {
        pid,
        file: "stat",
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no start time field"),
    })
}

/// Field 22 of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may
/// itself hold spaces and parentheses, so fields are counted from the last `)`.
pub fn start_time_from_stat(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // after ")" come fields 3.. ; starttime is field 22, the 20th of those
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// The pod UID named by a `/proc/<pid>/cgroup` text: `Ok(None)` when no line names a pod,
/// `Err((a, b))` when two lines name different pods.
///
/// A pod is a `pod<uuid>` token inside a path segment, its UUID separated by `-` (cgroupfs
/// driver: `/kubepods/burstable/pod<uid>/<container>`) or `_` (systemd driver:
/// `kubepods-burstable-pod<uid_>.slice`), at the start of the segment or after a `-`. It is not
/// anchored to `/kubepods` or to a position in the path: `--cgroup-root` prefixes, crun's
/// `container` leaf, `..` paths under a private cgroup namespace and `slice:runtime:id` forms
/// all occur.
pub fn pod_uid_from_cgroup(text: &str) -> Result<Option<String>, (String, String)> {
    let mut found: Option<String> = None;
    for line in text.lines() {
        // hierarchy-id:controllers:path — the path itself may contain ':'
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for segment in path.split('/') {
            if let Some(uid) = pod_uid_in_segment(segment) {
                match &found {
                    Some(first) if *first != uid => return Err((first.clone(), uid)),
                    Some(_) => {}
                    None => found = Some(uid),
                }
            }
        }
    }
    Ok(found)
}

fn pod_uid_in_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut from = 0;
    while let Some(at) = segment[from..].find("pod").map(|i| i + from) {
        from = at + 3;
        let starts_token = at == 0 || bytes[at - 1] == b'-';
        let Some(candidate) = segment.get(at + 3..at + 3 + UUID_LEN) else {
            continue;
        };
        let ends_token = bytes
            .get(at + 3 + UUID_LEN)
            .is_none_or(|b| !b.is_ascii_alphanumeric() && *b != b'-' && *b != b'_');
        if starts_token
            && ends_token
            && let Some(uid) = normalise_uuid(candidate)
        {
            return Some(uid);
        }
    }
    None
}

/// A lowercase UUID with `-` or `_` separators (one kind throughout), as `-` form.
fn normalise_uuid(candidate: &str) -> Option<String> {
    let bytes = candidate.as_bytes();
    let separator = *bytes.get(8)?;
    if separator != b'-' && separator != b'_' {
        return None;
    }
    for (i, b) in bytes.iter().enumerate() {
        let ok = if matches!(i, 8 | 13 | 18 | 23) {
            *b == separator
        } else {
            b.is_ascii_digit() || (b'a'..=b'f').contains(b)
        };
        if !ok {
            return None;
        }
    }
    Some(candidate.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "2c48913c-b29f-11e7-9350-020968147796";
    const UID_: &str = "2c48913c_b29f_11e7_9350_020968147796";
    const CID: &str = "7d4b8f1c2e3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c";

    fn uid_of(text: &str) -> Option<String> {
        pod_uid_from_cgroup(text).unwrap()
    }

    /// Real shapes of `/proc/<pid>/cgroup` for a container, by runtime, cgroup driver and
    /// cgroup version (as seen on kubelet nodes).
    fn fixtures() -> Vec<(&'static str, String)> {
        vec![
            (
                "containerd, systemd driver, v2",
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
                ),
            ),
            (
                "containerd, cgroupfs driver, v2",
                format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
            ),
            (
                "containerd, guaranteed QoS, systemd driver, v2",
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
            ),
            (
                "containerd, systemd driver, v1 (kubelet's slice:runtime:id cgroupsPath)",
                format!(
                    "12:pids:/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n11:memory:/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n1:name=systemd:/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n0::/\n"
                ),
            ),
            (
                "CRI-O, systemd driver, v2, crun's container leaf",
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope/container\n"
                ),
            ),
            (
                "CRI-O, cgroupfs driver, v1",
                format!(
                    "11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/crio-{CID}\n4:memory:/kubepods/besteffort/pod{UID}/crio-{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/crio-{CID}\n"
                ),
            ),
            (
                "Docker (cri-dockerd), cgroupfs driver, v1",
                format!(
                    "12:hugetlb:/kubepods/burstable/pod{UID}/{CID}\n11:pids:/kubepods/burstable/pod{UID}/{CID}\n5:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
                ),
            ),
            (
                "Docker (cri-dockerd), systemd driver, v1",
                format!(
                    "10:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n"
                ),
            ),
            (
                "containerd, cgroupfs driver, v1",
                format!(
                    "12:pids:/kubepods/besteffort/pod{UID}/{CID}\n3:cpuset:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
                ),
            ),
            (
                "CRI-O, cgroupfs driver, v2",
                format!("0::/kubepods/besteffort/pod{UID}/crio-{CID}\n"),
            ),
            (
                "Docker (cri-dockerd), systemd driver, v2",
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n"
                ),
            ),
            (
                "Docker (cri-dockerd), cgroupfs driver, v2",
                format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
            ),
            (
                "hybrid host: the 0:: line carries no pod, the v1 lines do",
                format!(
                    "4:memory:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n"
                ),
            ),
            (
                "--cgroup-root prefix",
                format!("0::/customroot/kubepods/burstable/pod{UID}/{CID}\n"),
            ),
            (
                "read from a private cgroup namespace (relative path)",
                format!(
                    "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
                ),
            ),
        ]
    }

    #[test]
    fn every_runtime_driver_and_version_names_the_pod() {
        for (what, text) in fixtures() {
            assert_eq!(uid_of(&text).as_deref(), Some(UID), "{what}");
        }
    }

    #[test]
    fn processes_outside_pods_name_none() {
        for text in [
            "0::/system.slice/containerd.service\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "12:pids:/\n1:name=systemd:/init.scope\n0::/init.scope\n",
            // the kubepods slice itself, and a QoS slice, are not a pod
            "0::/kubepods.slice/kubepods-burstable.slice\n",
            "",
        ] {
            assert_eq!(uid_of(text), None, "{text:?}");
        }
    }

    #[test]
    fn lookalikes_are_not_pods() {
        for text in [
            // upper-case hex, mixed separators, short, long, no boundary before or after
            format!("0::/kubepods/pod{}/x\n", UID.to_uppercase()),
            "0::/kubepods/pod2c48913c-b29f_11e7-9350-020968147796/x\n".to_owned(),
            "0::/kubepods/pod2c48913c-b29f-11e7-9350-02096814779/x\n".to_owned(),
            format!("0::/kubepods/pod{UID}0/x\n"),
            format!("0::/kubepods/xpod{UID}/x\n"),
            format!("0::/kubepods/pod{UID}-extra/x\n"),
            // the UID in the container part, not as a pod token
            format!("0::/system.slice/{UID}.scope\n"),
        ] {
            assert_eq!(uid_of(&text), None, "{text:?}");
        }
    }

    #[test]
    fn lines_naming_two_pods_are_refused() {
        let other = "0b6e4c1e-8f57-4d5e-9a51-000000000001";
        let text = format!(
            "4:memory:/kubepods/besteffort/pod{UID}/{CID}\n0::/kubepods/besteffort/pod{other}/{CID}\n"
        );
        assert_eq!(
            pod_uid_from_cgroup(&text),
            Err((UID.to_owned(), other.to_owned()))
        );
    }

    #[test]
    fn hostile_texts_do_not_panic() {
        for text in [
            "pod".to_owned(),
            "::pod".to_owned(),
            ":::::::".to_owned(),
            "0::/pod\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\n".to_owned(),
            format!("0::/{}\n", "pod".repeat(10_000)),
            format!("0::/-pod{}", &UID[..35]),
        ] {
            let _ = pod_uid_from_cgroup(&text);
        }
    }

    #[test]
    fn start_time_is_field_22_even_with_odd_command_names() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(start_time_from_stat(stat), Some(987_654));
        assert_eq!(start_time_from_stat("garbage"), None);
        assert_eq!(start_time_from_stat("1 (x) S 1"), None);
    }

    #[test]
    fn this_process_is_pinned_and_read_both_ways() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let pid = i32::try_from(std::process::id()).unwrap();
        let by_socket = PeerProcess::of_socket(&a, pid).unwrap();
        let by_dir = PeerProcess::by_proc_dir(pid).unwrap();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(by_socket.cgroup_text().unwrap(), own);
        assert_eq!(by_dir.cgroup_text().unwrap(), own);
        assert!(!by_dir.pinned_by_pidfd());
    }

    #[test]
    fn an_exited_peer_is_refused_by_either_pin() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let by_dir = PeerProcess::by_proc_dir(pid).unwrap();
        assert!(by_dir.cgroup_text().is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(
            by_dir.cgroup_text(),
            Err(PeerError::Exited { .. })
        ));
        assert!(matches!(PeerProcess::by_proc_dir(0), Err(PeerError::NoPid)));
        assert!(matches!(
            PeerProcess::of_socket(&std::os::unix::net::UnixStream::pair().unwrap().0, 0),
            Err(PeerError::NoPid)
        ));
    }

    #[test]
    fn a_peer_that_exits_after_connecting_is_refused() {
        // The child connects, then exits: the pidfd the server took at accept then reports it gone.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import socket,time; s=socket.socket(socket.AF_UNIX); s.connect({:?}); time.sleep(30)",
                path.display().to_string()
            ))
            .spawn()
            .unwrap();
        let (conn, _) = listener.accept().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let peer = PeerProcess::of_socket(&conn, pid).unwrap();
        assert!(peer.cgroup_text().is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(peer.cgroup_text(), Err(PeerError::Exited { .. })));
    }
}
