//! The running `athenz-devstack up` the end-to-end tests drive (shared by `e2e.rs` and
//! `csi.rs`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use athenz_devstack::kube::{KubeClient, NewPod};
use athenz_devstack::node::{self, PodVolume};
use athenz_devstack::stack::StackInfo;
use athenz_testbed::csi_kubelet::CsiPod;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The devstack binary next to this test's directory (`target/<profile>/athenz-devstack`).
pub fn devstack_binary() -> PathBuf {
    athenz_testbed::bins::built("athenz-devstack")
}

/// A running `athenz-devstack up`, stopped with SIGTERM on drop.
pub struct Devstack {
    pub up: std::process::Child,
    pub dir: tempfile::TempDir,
    pub info: StackInfo,
    pub kube: KubeClient,
}

impl Devstack {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// `athenz-devstack up` with `args` added.
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// `athenz-devstack up` with `args` added and `env` set (the components inherit it: their
    /// settings' environment fallbacks).
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the end-to-end tests need root (they bind-mount volumes as kubelet's driver does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("up.log")).unwrap();
        let mut up = std::process::Command::new(devstack_binary())
            .args(["up", "--state-dir"])
            .arg(dir.path().join("state"))
            .args(args)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let stack_json = dir.path().join("state/stack.json");
        let deadline = Instant::now() + Duration::from_secs(90);
        while !stack_json.exists() {
            let log = || std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default();
            if let Some(status) = up.try_wait().unwrap() {
                panic!("athenz-devstack up exited ({status}): {}", log());
            }
            assert!(
                Instant::now() < deadline,
                "the stack did not come up: {}",
                log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let info: StackInfo = serde_json::from_slice(&std::fs::read(&stack_json).unwrap()).unwrap();
        let kube = KubeClient::new(&info.kube_api.url).unwrap();
        Self {
            up,
            dir,
            info,
            kube,
        }
    }

    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.path().join("kubelet")
    }

    /// stack.json as it is now (process ids change on restarts).
    pub fn current_info(&self) -> StackInfo {
        serde_json::from_slice(&std::fs::read(self.dir.path().join("state/stack.json")).unwrap())
            .unwrap()
    }

    /// `athenz-identity-agent status --json` over the first node's volumes dir (the devstack
    /// binary under the agent's name, as the stack runs it): exit code and report.
    #[allow(dead_code)] // not every test file uses it
    pub fn agent_status(&self) -> (i32, serde_json::Value) {
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new(devstack_binary())
            .arg0("athenz-identity-agent")
            .args(["status", "--json", "--volumes-dir"])
            .arg(&self.info.volumes_dir)
            .output()
            .unwrap();
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }

    pub fn pid(&self, component: &str) -> Pid {
        Pid::from_raw(self.current_info().processes[component] as i32)
    }

    /// Creates pod `name` running on the node and mounts its volume through the real driver.
    pub async fn pod(&self, namespace: &str, name: &str, ip: &str) -> PodVolume {
        let pod = NewPod {
            namespace: namespace.into(),
            name: name.into(),
            service_account: "web".into(),
            ip: ip.into(),
        };
        let uid = self
            .kube
            .create_running_pod(&pod, &self.info.node_name)
            .await
            .unwrap();
        node::mount(&self.info, &self.kubelet_root(), &pod, &uid)
            .await
            .unwrap()
    }
}

impl Drop for Devstack {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.up.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.up.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.up.kill();
    }
}

/// Creates pod `name` on node-1 as the API holds it while kubelet sets up its volumes: no IP.
pub async fn pending_pod(stack: &Devstack, name: &str) -> (Pod, CsiPod) {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("media-sports".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some("web".into()),
            node_name: Some(stack.info.node_name.clone()),
            ..Default::default()
        }),
        status: None,
    };
    let created = stack.kube.create_pod(&pod).await.unwrap();
    let csi = CsiPod {
        namespace: "media-sports".into(),
        name: name.into(),
        uid: created.metadata.uid.clone().unwrap(),
        service_account: "web".into(),
        fs_group: None,
    };
    (created, csi)
}

/// openssl verifies the pod's chain to the ZTS root (intermediates untrusted) and the files are
/// one consistent set.
pub fn openssl_verifies(stack: &StackInfo, volume: &PodVolume) -> athenz_core::crypto::CertInfo {
    let dir = &volume.credentials_dir;
    let chain = std::fs::read_to_string(dir.join("service.cert.pem")).unwrap();
    let certs = athenz_core::crypto::pem_certificates(&chain).unwrap();
    let intermediates: String = certs[1..]
        .iter()
        .map(|c| athenz_core::crypto::der_to_pem(c))
        .collect();
    let leaf = athenz_core::crypto::der_to_pem(&certs[0]);
    let root = std::fs::read_to_string(&stack.zts.ca).unwrap();
    athenz_testbed::openssl::verify(&root, &intermediates, &leaf).unwrap();
    // the key, certificate, CA and ntoken belong together (checked by the devstack's checker)
    athenz_devstack::identity::check(dir).unwrap();
    athenz_core::crypto::CertInfo::from_pem(&leaf).unwrap()
}
