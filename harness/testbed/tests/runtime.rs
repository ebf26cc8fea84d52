//! Pods made by the real runc and crun (docs/design.md §5): a sandbox and containers from OCI
//! bundles in kubelet's cgroupfs layout. The agent's peer parser reads the cgroup paths the runtime
//! wrote, on every hierarchy line of `/proc/<pid>/cgroup`; `SO_PEERCRED` on a socket bound into the
//! container gives a host pid the peer check maps to the pod; init containers are retried with
//! back-off until they succeed; deletion leaves nothing in any hierarchy.
//!
//! Needs root and runc and crun (`apt-get install runc crun`; CI installs them): without them
//! these tests fail saying so, never skip.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::peer::{PeerProcess, pod_uid_from_cgroup};
use athenz_testbed::runtime::{
    Backoff, ContainerSpec, OciRuntime, Pod, Qos, Rootfs, RuntimeKind, VolumeMount,
};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const UID: &str = "6b1c2f0e-3d4a-4b5c-8d9e-0f1a2b3c4d5e";

struct Bed {
    dir: tempfile::TempDir,
    runtime: Arc<OciRuntime>,
    cgroup_root: String,
    rootfs: Rootfs,
}

impl Bed {
    fn new(kind: RuntimeKind) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "these tests need root (a container runtime makes namespaces and cgroups)"
        );
        let dir = tempfile::tempdir().unwrap();
        let runtime = OciRuntime::find(kind, &dir.path().join("state"))
            .unwrap_or_else(|e| panic!("{e}: CI installs runc and crun"));
        let rootfs = Rootfs::prepare(&dir.path().join("rootfs"), &[], &["/work"]).unwrap();
        Self {
            cgroup_root: format!("athenz-test-{}", athenz_core::random::hex_name::<4>()),
            dir,
            runtime: Arc::new(runtime),
            rootfs,
        }
    }

    async fn pod(&self, uid: &str) -> Pod {
        Pod::start(
            self.runtime.clone(),
            uid,
            Qos::BestEffort,
            &self.cgroup_root,
            self.rootfs.clone(),
            &self.dir.path().join(uid),
            false,
        )
        .await
        .unwrap()
    }

    fn work_volume(&self) -> VolumeMount {
        let source = self.dir.path().join("work");
        std::fs::create_dir_all(&source).unwrap();
        VolumeMount {
            destination: "/work".into(),
            source,
            read_only: false,
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        athenz_testbed::cgroups::remove_everywhere(&self.cgroup_root);
    }
}

fn sh(script: &str, volumes: Vec<VolumeMount>) -> ContainerSpec {
    ContainerSpec {
        args: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![],
        cwd: "/".into(),
        volumes,
    }
}

/// Every hierarchy's directory for the pod, that exists.
fn pod_cgroup_dirs(pod_cgroup: &str) -> Vec<std::path::PathBuf> {
    athenz_testbed::cgroups::all_mount_points()
        .into_iter()
        .map(|m| m.join(pod_cgroup.trim_start_matches('/')))
        .filter(|d| d.exists())
        .collect()
}

async fn the_runtime_names_the_pod_on_every_line(kind: RuntimeKind) {
    let bed = Bed::new(kind);
    let pod = bed.pod(UID).await;
    let app = pod
        .start_container("app", &sh("exec sleep infinity", vec![]))
        .await
        .unwrap();
    let text = std::fs::read_to_string(format!("/proc/{}/cgroup", app.pid)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // this host mounts v1 hierarchies beside v2: one line each, all written by the runtime
    assert!(
        lines.len() >= 2,
        "{kind}: expected several hierarchies: {text}"
    );
    for line in &lines {
        let path = line.splitn(3, ':').nth(2).unwrap();
        assert_eq!(
            path,
            format!("{}/{}", pod.cgroup_parent(), app.id),
            "{kind}: {line}"
        );
        assert_eq!(
            pod_uid_from_cgroup(&format!("{line}\n"))
                .unwrap()
                .as_deref(),
            Some(UID),
            "{kind}: the agent's parser on {line:?}"
        );
    }
    // and the peer check's own reading of the process
    let peer = PeerProcess::by_proc_dir(app.pid).unwrap();
    assert_eq!(peer.pod_uid().unwrap(), UID);
    // the sandbox is in the pod too, and the app is not in the sandbox's PID namespace
    let sandbox = std::fs::read_to_string(format!("/proc/{}/cgroup", pod.sandbox_pid())).unwrap();
    assert_eq!(pod_uid_from_cgroup(&sandbox).unwrap().as_deref(), Some(UID));
    let ns = |pid: i32, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    assert_eq!(ns(app.pid, "net"), ns(pod.sandbox_pid(), "net"));
    assert_eq!(ns(app.pid, "ipc"), ns(pod.sandbox_pid(), "ipc"));
    assert_eq!(ns(app.pid, "uts"), ns(pod.sandbox_pid(), "uts"));
    assert_ne!(ns(app.pid, "pid"), ns(pod.sandbox_pid(), "pid"));
    assert_ne!(ns(app.pid, "mnt"), ns(pod.sandbox_pid(), "mnt"));
    assert_ne!(ns(app.pid, "net"), ns(std::process::id() as i32, "net"));

    let pod_cgroup = pod.cgroup_parent().to_owned();
    assert!(!pod_cgroup_dirs(&pod_cgroup).is_empty());
    // `sleep` as PID 1 ignores SIGTERM: the grace runs out and SIGKILL ends it
    pod.remove(Duration::from_millis(300)).await.unwrap();
    assert!(
        pod_cgroup_dirs(&pod_cgroup).is_empty(),
        "{kind}: left behind: {:?}",
        pod_cgroup_dirs(&pod_cgroup)
    );
    assert!(!Path::new(&format!("/proc/{}", app.pid)).exists());
    assert!(bed.runtime.state(&app.id).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runc_containers_name_their_pod_on_every_hierarchy_line() {
    the_runtime_names_the_pod_on_every_line(RuntimeKind::Runc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crun_containers_name_their_pod_on_every_hierarchy_line() {
    the_runtime_names_the_pod_on_every_line(RuntimeKind::Crun).await;
}

/// A host socket bound into the container: `SO_PEERCRED` gives the container process's host
/// pid, which the peer check maps to the pod — what the agent does with every caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_socket_peer_is_its_pod() {
    let bed = Bed::new(RuntimeKind::Runc);
    let socket_dir = bed.dir.path().join("sock");
    std::fs::create_dir_all(&socket_dir).unwrap();
    let listener = tokio::net::UnixListener::bind(socket_dir.join("s.sock")).unwrap();
    let pod = bed.pod(UID).await;
    let client = pod
        .start_container(
            "client",
            &ContainerSpec {
                args: vec![
                    "/usr/bin/python3".into(),
                    "-c".into(),
                    "import socket,time; s=socket.socket(socket.AF_UNIX); \
                     s.connect('/sock/s.sock'); time.sleep(30)"
                        .into(),
                ],
                env: vec![],
                cwd: "/".into(),
                volumes: vec![VolumeMount {
                    destination: "/sock".into(),
                    source: socket_dir.clone(),
                    read_only: true,
                }],
            },
        )
        .await
        .unwrap();
    let (stream, _) = tokio::time::timeout(Duration::from_secs(20), listener.accept())
        .await
        .expect("the container connects")
        .unwrap();
    let cred = stream.peer_cred().unwrap();
    let pid = cred.pid().unwrap();
    assert_eq!(pid, client.pid, "SO_PEERCRED gives the host pid");
    let peer = PeerProcess::of_socket(&stream, pid).unwrap();
    assert_eq!(peer.pod_uid().unwrap(), UID);
    pod.remove(Duration::from_millis(300)).await.unwrap();
}

/// A failing init container is run again after the back-off, as kubelet does, until it
/// succeeds; its exit statuses are the runtime's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_init_container_is_restarted_with_back_off() {
    let bed = Bed::new(RuntimeKind::Runc);
    let pod = bed.pod(UID).await;
    let script = "if [ -e /work/tried ]; then echo second; exit 0; fi; \
                  echo first; : > /work/tried; exit 3";
    let started = Instant::now();
    let runs = pod
        .run_init(
            "init",
            &sh(script, vec![bed.work_volume()]),
            Backoff {
                initial: Duration::from_millis(200),
                max: Duration::from_secs(1),
            },
            Instant::now() + Duration::from_secs(30),
        )
        .await
        .unwrap();
    let codes: Vec<i32> = runs.iter().map(|r| r.exit_code).collect();
    assert_eq!(codes, [3, 0]);
    assert_eq!(runs[0].log_text().trim(), "first");
    assert_eq!(runs[1].log_text().trim(), "second");
    assert_ne!(
        runs[0].started.id, runs[1].started.id,
        "a new container each run"
    );
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited");

    // one that never succeeds is given up at the deadline, with its log
    let err = pod
        .run_init(
            "never",
            &sh("echo broken >&2; exit 1", vec![]),
            Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(200),
            },
            Instant::now() + Duration::from_secs(1),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("init container never") && err.contains("broken"),
        "{err}"
    );

    // a container that handles SIGTERM ends within the grace with its own status
    pod.start_container(
        "polite",
        &sh("trap 'exit 7' TERM; while :; do sleep 0.05; done", vec![]),
    )
    .await
    .unwrap();
    let code = pod
        .stop_container("polite", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(code, Some(7));
    pod.remove(Duration::from_millis(300)).await.unwrap();
}
