//! What the real-node tests share: the prerequisites, and `cluster up` run for a test and
//! taken down when the test ends, however it ends.

use super::DEVSTACK;
use athenz_devstack::cluster::{ClusterInfo, default_kube_bin};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Debian's static busybox: the tests' app image.
pub const BUSYBOX: &str = "/bin/busybox";

/// Fails (never skips) when this machine cannot run the test, saying what to do.
pub fn require_prerequisites() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the cluster test runs a kubelet, containerd and iptables: run it as root"
    );
    for binary in ["kube", "helm"] {
        let path = default_kube_bin().join(binary);
        assert!(
            path.is_file(),
            "{} is missing: run harness/real-node/kube/build.sh",
            path.display()
        );
    }
    let busybox = std::fs::read(BUSYBOX).unwrap_or_else(|_| {
        panic!("{BUSYBOX} is missing: apt-get install busybox-static (the test's image)")
    });
    // a dynamically linked busybox needs a loader; a scratch image has none
    assert!(
        !has_interpreter(&busybox),
        "{BUSYBOX} is dynamically linked: apt-get install busybox-static (the test's image)"
    );
}

/// Whether an ELF64 file has a PT_INTERP program header (is dynamically linked).
fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let at = phoff + i * size;
        elf[at..at + 4] == 3u32.to_le_bytes()
    })
}

/// Takes the cluster down if the test ends early, so a failure leaves the machine clean.
pub struct Down<'a> {
    state_dir: &'a Path,
    /// `cluster up`, while it runs.
    pub up: Option<Child>,
    /// Seconds from its start to cluster.json.
    pub up_seconds: f64,
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        if let Some(mut up) = self.up.take() {
            let _ = Command::new(&*DEVSTACK)
                .args(["cluster", "down", "--state-dir"])
                .arg(self.state_dir)
                .status();
            let _ = up.kill();
            let _ = up.wait();
        }
    }
}

/// The environment variable that chooses the cluster's ZTS for these tests: `athenz` runs
/// Athenz's own (`cluster up --zts athenz`, built by harness/peers/athenz/zts/build; a documented
/// run, docs/real-zts.md); unset or `dev`, the dev ZTS, as CI runs them.
pub const ZTS_VARIABLE: &str = "ATHENZ_E2E_ZTS";

/// `--zts <server>` as [`ZTS_VARIABLE`] says; any other value fails the test, named.
fn zts_args() -> Vec<String> {
    match std::env::var(ZTS_VARIABLE).as_deref() {
        Err(_) | Ok("" | "dev") => Vec::new(),
        Ok("athenz") => vec!["--zts".into(), "athenz".into()],
        Ok(other) => panic!("{ZTS_VARIABLE}={other:?}: expected dev or athenz"),
    }
}

/// Runs `cluster up --state-dir <state_dir> <args>` (its output in `<state_dir>.log`) until
/// cluster.json appears, within `limit`; fails with its output if it exits first. The ZTS is
/// the one [`ZTS_VARIABLE`] names.
pub fn start_cluster<'a>(
    state_dir: &'a Path,
    args: &[&str],
    limit: Duration,
) -> (Down<'a>, ClusterInfo) {
    let up_log = state_dir.with_extension("log");
    let log = std::fs::File::create(&up_log).unwrap();
    let started = Instant::now();
    let up = Command::new(&*DEVSTACK)
        .args(["cluster", "up", "--state-dir"])
        .arg(state_dir)
        .arg("--kube-bin")
        .arg(default_kube_bin())
        .args(args)
        .args(zts_args())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut guard = Down {
        state_dir,
        up: Some(up),
        up_seconds: 0.0,
    };
    let cluster_json = state_dir.join("cluster.json");
    while !cluster_json.exists() {
        let up = guard.up.as_mut().unwrap();
        if let Some(status) = up.try_wait().unwrap() {
            panic!(
                "cluster up exited ({status}) before it was ready:\n{}",
                std::fs::read_to_string(&up_log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < limit,
            "no cluster.json after {limit:?}:\n{}",
            std::fs::read_to_string(&up_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    guard.up_seconds = started.elapsed().as_secs_f64();
    let info = ClusterInfo::read(&cluster_json).unwrap();
    (guard, info)
}
