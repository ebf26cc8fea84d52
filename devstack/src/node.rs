//! Playing kubelet on the stack's node: exec the real volume driver with kubelet's exact
//! arguments, run the real `athenz-sia init` in the pod's place, and unmount when the pod goes.

use crate::kube::NewPod;
use crate::stack::StackInfo;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The flex volume's name in the pod spec (the initializer's choice).
pub const VOLUME_NAME: &str = "athenz-identity";
/// How long one driver call or one `athenz-sia init` may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// A pod's volume on this node.
#[derive(Debug, Clone)]
pub struct PodVolume {
    /// The pod.
    pub pod: NewPod,
    /// Kubelet's mount dir for the volume.
    pub mount_dir: PathBuf,
    /// Where its SIA writes the credentials (the pod's memory-backed volume).
    pub credentials_dir: PathBuf,
}

/// Kubelet's directory for a flex volume of pod `uid`, under `root` (kubelet's root dir).
pub fn mount_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods")
        .join(uid)
        .join("volumes/athenz~volume-driver")
        .join(VOLUME_NAME)
}

/// The JSON options kubelet passes to a flex driver's mount, key for key.
pub fn kubelet_options(pod: &NewPod, uid: &str) -> String {
    serde_json::json!({
        "kubernetes.io/fsType": "",
        "kubernetes.io/readwrite": "ro",
        "kubernetes.io/pvOrVolumeName": VOLUME_NAME,
        "kubernetes.io/pod.name": pod.name,
        "kubernetes.io/pod.namespace": pod.namespace,
        "kubernetes.io/pod.uid": uid,
        "kubernetes.io/serviceAccount.name": pod.service_account,
    })
    .to_string()
}

/// Runs `argv` (plus `args`) to completion within [`STEP_TIMEOUT`]; returns stdout.
async fn run(
    argv: &[String],
    args: &[String],
    env: &[(&str, String)],
    cwd: Option<&Path>,
    what: &str,
) -> anyhow::Result<String> {
    let (program, prefix) = argv.split_first().context("an empty argv prefix")?;
    let mut command = tokio::process::Command::new(program);
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    command
        .args(prefix)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .kill_on_drop(true);
    let output = tokio::time::timeout(STEP_TIMEOUT, command.output())
        .await
        .with_context(|| format!("{what}: no answer within {STEP_TIMEOUT:?}"))?
        .with_context(|| format!("{what}: cannot run {program}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "{what}: {} ({}) {}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(stdout)
}

/// The driver's environment: the stack's host directories.
fn driver_env(stack: &StackInfo) -> Vec<(&'static str, String)> {
    vec![
        (
            athenz_core::volume::VOLUMES_DIR_ENV,
            stack.volumes_dir.display().to_string(),
        ),
        (
            athenz_core::volume::AGENT_DIR_ENV,
            stack.agent_dir.display().to_string(),
        ),
    ]
}

/// `<driver> mount <dir> <json>` as kubelet runs it (kubelet creates the dir first).
pub async fn mount(
    stack: &StackInfo,
    kubelet_root: &Path,
    pod: &NewPod,
    uid: &str,
) -> anyhow::Result<PodVolume> {
    let dir = mount_dir(kubelet_root, uid);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let reply = run(
        &stack.volume_driver,
        &[
            "mount".into(),
            dir.display().to_string(),
            kubelet_options(pod, uid),
        ],
        &driver_env(stack),
        None,
        &format!("mounting the volume of {}/{}", pod.namespace, pod.name),
    )
    .await?;
    if !reply.contains(r#""status":"Success""#) {
        bail!("the driver did not mount: {reply}");
    }
    let credentials_dir = kubelet_root.join("pods").join(uid).join("credentials");
    mount_memory_volume(&credentials_dir)?;
    Ok(PodVolume {
        pod: pod.clone(),
        credentials_dir,
        mount_dir: dir,
    })
}

/// The pod's credentials volume as kubelet makes an `emptyDir` with `medium: Memory`: a tmpfs
/// (where the SIA's fsyncs cost nothing, as in a cluster).
fn mount_memory_volume(dir: &Path) -> anyhow::Result<()> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=1m,mode=0755"),
    )
    .with_context(|| format!("mounting a tmpfs on {}", dir.display()))
}

/// `<driver> unmount <dir>`, then removes the dir as kubelet does, and the pod's credentials
/// volume with it.
pub async fn unmount(stack: &StackInfo, volume: &PodVolume) -> anyhow::Result<()> {
    if let Err(e) = nix::mount::umount(&volume.credentials_dir) {
        bail!("unmounting {}: {e}", volume.credentials_dir.display());
    }
    let _ = std::fs::remove_dir(&volume.credentials_dir);
    let reply = run(
        &stack.volume_driver,
        &["unmount".into(), volume.mount_dir.display().to_string()],
        &driver_env(stack),
        None,
        &format!("unmounting the volume of {}", volume.pod.name),
    )
    .await?;
    if !reply.contains(r#""status":"Success""#) {
        bail!("the driver did not unmount: {reply}");
    }
    std::fs::remove_dir(&volume.mount_dir)
        .with_context(|| format!("removing {}", volume.mount_dir.display()))
}

/// The SIA's settings as the initializer injects them, with the pod's paths mapped to where
/// kubelet put them on this node. The SIA runs in the volume's mount dir and names the id file
/// and socket relative to it: in a pod the socket path is short
/// (`/var/athenz/identity/connect/agent.sock`), but under kubelet's pod directory it would exceed
/// the 108 bytes a Unix socket address holds.
pub fn sia_env(volume: &PodVolume) -> Vec<(&'static str, String)> {
    vec![
        ("ID_FILE", "id".into()),
        (
            "ENDPOINT",
            format!("connect/{}", athenz_core::volume::AGENT_SOCKET_NAME),
        ),
        ("OUT_DIR", volume.credentials_dir.display().to_string()),
    ]
}

/// `athenz-sia init` for the pod; returns how long it took.
pub async fn sia_init(stack: &StackInfo, volume: &PodVolume) -> anyhow::Result<Duration> {
    let started = Instant::now();
    run(
        &stack.sia,
        &["init".into()],
        &sia_env(volume),
        Some(&volume.mount_dir),
        &format!("athenz-sia init for {}", volume.pod.name),
    )
    .await?;
    Ok(started.elapsed())
}

/// Starts `athenz-sia refresh` for the pod with `interval` as the latest refresh.
pub fn sia_refresh(
    stack: &StackInfo,
    volume: &PodVolume,
    interval: &str,
    log: &Path,
) -> anyhow::Result<crate::procs::Process> {
    let (program, prefix) = stack.sia.split_first().context("an empty SIA argv")?;
    let mut args: Vec<String> = prefix.to_vec();
    args.extend(["refresh".into(), format!("--refresh-interval={interval}")]);
    let mut command = crate::procs::Command::new(
        &format!("sia-refresh-{}", volume.pod.name),
        Path::new(program),
        args,
    );
    command.cwd = Some(volume.mount_dir.clone());
    command.env = sia_env(volume)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    crate::procs::Process::start(command, log)
}

/// Asks the agent to refresh the pod's identity with the pair its SIA wrote, as the refresh
/// sidecar does (one request, no retries); `Ok` carries the new certificate chain, `Err` the
/// agent's refusal as text.
pub async fn refresh_once(
    stack: &StackInfo,
    volume: &PodVolume,
) -> anyhow::Result<Result<String, String>> {
    use athenz_core::agent_api::RefreshRequest;
    use athenz_core::secret::Secret;
    let id_text = std::fs::read_to_string(volume.mount_dir.join("id")).context("reading the id")?;
    let id = athenz_core::volume::VolumeId::parse(id_text.trim()).context("the volume id")?;
    let client = athenz_sia::client::AgentClient::new(
        stack.agent.socket.clone(),
        id,
        Duration::from_secs(30),
    );
    let read = |name: &str| std::fs::read_to_string(volume.credentials_dir.join(name));
    let request = RefreshRequest {
        key_pem: Secret::new(read("service.key.pem").context("reading the key")?),
        cert_pem: read("service.cert.pem").context("reading the certificate")?,
    };
    Ok(client
        .refresh(&request)
        .await
        .map(|answer| answer.cert_pem)
        .map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> NewPod {
        NewPod {
            namespace: "media-sports".into(),
            name: "web-1".into(),
            service_account: "web".into(),
            ip: "10.1.0.11".into(),
        }
    }

    /// What the devstack passes as kubelet is what the real driver accepts.
    #[test]
    fn kubelet_options_are_what_the_driver_reads() {
        let uid = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";
        let options =
            athenz_volume_driver::options::MountOptions::parse(&kubelet_options(&pod(), uid))
                .unwrap();
        let text = format!("{options:?}");
        for needle in ["media-sports", "web-1", uid, "web"] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
    }

    /// Kubelet's layout: `<root>/pods/<uid>/volumes/<vendor~driver>/<volume>`.
    #[test]
    fn mount_dir_is_kubelets() {
        assert_eq!(
            mount_dir(Path::new("/var/lib/kubelet"), "u-1"),
            Path::new("/var/lib/kubelet/pods/u-1/volumes/athenz~volume-driver/athenz-identity")
        );
    }

    /// The SIA's id file and socket are relative to the mount dir it runs in.
    #[test]
    fn sia_paths_are_relative_to_the_volume() {
        let volume = PodVolume {
            pod: pod(),
            mount_dir: PathBuf::from("/k/pods/u/volumes/athenz~volume-driver/athenz-identity"),
            credentials_dir: PathBuf::from("/k/pods/u/credentials"),
        };
        let env = sia_env(&volume);
        assert_eq!(env[0], ("ID_FILE", "id".to_owned()));
        assert_eq!(env[1], ("ENDPOINT", "connect/agent.sock".to_owned()));
        assert_eq!(env[2], ("OUT_DIR", "/k/pods/u/credentials".to_owned()));
    }
}
