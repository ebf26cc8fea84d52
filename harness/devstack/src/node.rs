//! Playing kubelet on the stack's node: exec the real volume driver with kubelet's exact
//! arguments, run the real `athenz-sia init` in the pod's place, and unmount when the pod goes.

use crate::kube::NewPod;
pub use crate::pod_dirs::{NodeDirs, PodVolume};
use crate::pods::{PodCommand, PodContainer, PodPaths, PodProgram, PodRuntime};
use crate::stack_json::StackInfo;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The flex volume's name in the pod spec (the initializer's choice).
pub const VOLUME_NAME: &str = "athenz-identity";
/// How long one driver call or one `athenz-sia init` may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

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
    run_capturing(argv, args, env, cwd, what)
        .await
        .map(|(stdout, _)| stdout)
}

/// [`run`], also giving back what the program wrote to stderr (its log).
async fn run_capturing(
    argv: &[String],
    args: &[String],
    env: &[(&str, String)],
    cwd: Option<&Path>,
    what: &str,
) -> anyhow::Result<(String, String)> {
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
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        bail!(
            "{what}: {} ({}) {}",
            output.status,
            stdout.trim(),
            stderr.trim()
        );
    }
    Ok((stdout, stderr))
}

/// The driver's environment: the node's host directories.
fn driver_env(node: &NodeDirs) -> Vec<(&'static str, String)> {
    vec![
        (
            athenz_core::volume::VOLUMES_DIR_ENV,
            node.volumes_dir.display().to_string(),
        ),
        (
            athenz_core::volume::AGENT_DIR_ENV,
            node.agent_dir.display().to_string(),
        ),
    ]
}

/// `<driver> mount <dir> <json>` on the first node, as kubelet runs it.
pub async fn mount(
    stack: &StackInfo,
    kubelet_root: &Path,
    pod: &NewPod,
    uid: &str,
) -> anyhow::Result<PodVolume> {
    mount_on(stack, &NodeDirs::first(stack), kubelet_root, pod, uid).await
}

/// `<driver> mount <dir> <json>` on `node`, as kubelet runs it (kubelet creates the dir first).
pub async fn mount_on(
    stack: &StackInfo,
    node: &NodeDirs,
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
        &driver_env(node),
        None,
        &format!("mounting the volume of {}/{}", pod.namespace, pod.name),
    )
    .await?;
    if !reply.contains(r#""status":"Success""#) {
        bail!("the driver did not mount: {reply}");
    }
    let credentials_dir = credentials_volume(kubelet_root, uid)?;
    Ok(PodVolume {
        pod: pod.clone(),
        uid: uid.to_owned(),
        node: node.clone(),
        credentials_dir,
        mount_dir: dir,
    })
}

/// Pod `uid`'s credentials volume (where its SIA writes), as kubelet makes an `emptyDir` with
/// `medium: Memory`: a tmpfs (where the SIA's fsyncs cost nothing, as in a cluster).
pub fn credentials_volume(kubelet_root: &Path, uid: &str) -> anyhow::Result<PathBuf> {
    let dir = kubelet_root.join("pods").join(uid).join("credentials");
    mount_memory_volume(&dir)?;
    Ok(dir)
}

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
    remove_pod_side(stack, volume).await?;
    let reply = run(
        &stack.volume_driver,
        &["unmount".into(), volume.mount_dir.display().to_string()],
        &driver_env(&volume.node),
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

/// What the pod had besides the identity volume, gone with the pod as kubelet removes it: its
/// containers and sandbox (or processes) and cgroups, then its credentials volume.
pub async fn remove_pod_side(stack: &StackInfo, volume: &PodVolume) -> anyhow::Result<()> {
    PodRuntime::of(stack)?.remove_pod(&volume.uid).await?;
    if let Err(e) = nix::mount::umount(&volume.credentials_dir) {
        bail!("unmounting {}: {e}", volume.credentials_dir.display());
    }
    let _ = std::fs::remove_dir(&volume.credentials_dir);
    Ok(())
}

/// The SIA's settings as the initializer injects them, with the pod's paths mapped to where
/// kubelet put them on this node. The SIA runs in the volume's mount dir and names the id file
/// and socket relative to it: in a pod the socket path is short
/// (`/var/athenz/identity/connect/agent.sock`), but under kubelet's pod directory it would exceed
/// the 108 bytes a Unix socket address holds. With them, where the SIA's key is made and what
/// kind, as the stack's agents expect.
pub fn sia_env(stack: &StackInfo, volume: &PodVolume) -> Vec<(&'static str, String)> {
    sia_env_in(stack, &PodPaths::host(volume))
}

/// The SIA's settings with the volumes at `paths` (where the pod's process sees them,
/// [`PodRuntime::paths`]).
pub fn sia_env_in(stack: &StackInfo, paths: &PodPaths) -> Vec<(&'static str, String)> {
    let mut env = paths.sia_env();
    env.push(("KEY_SOURCE", stack.key_source.to_string()));
    env.push(("KEY_ALGORITHM", stack.key_algorithm.clone()));
    // as the stack's agents' --upstream-timeout: a pod's own ZTS calls give up as theirs do
    env.push(("ZTS_TIMEOUT", "5s".to_owned()));
    env
}

/// The SIA's paths for `volume` as a host process in its mount dir sees them (see
/// [`sia_env`]).
pub fn sia_paths_env(volume: &PodVolume) -> Vec<(&'static str, String)> {
    PodPaths::host(volume).sia_env()
}

/// `argv` (a program and its arguments, host paths) as a process of the pod that is none of
/// its containers: inside a new cgroup of the pod when the stack makes pod cgroups (so the
/// agent's peer check sees the pod), else as is ([`PodRuntime::in_pod`]).
pub fn in_pod(stack: &StackInfo, uid: &str, argv: &[String]) -> anyhow::Result<Vec<String>> {
    PodRuntime::of(stack)?.in_pod(uid, argv)
}

/// How long an `athenz-sia init` took.
#[derive(Debug, Clone, Copy)]
pub struct SiaInit {
    /// From starting the process (into its pod's cgroup, when the stack makes them) to its exit.
    pub process: Duration,
    /// What the SIA itself reports (`took_ms` of its "identity written" line): from its `main`
    /// to the files written, i.e. the agent's answer and the writes, without the process start
    /// and the pod placement around it.
    pub own: Duration,
    /// The runtime's part, up to the SIA's first instruction: the sandbox's start when this
    /// init made it, then from asking for the container (or starting the process) to the SIA's
    /// `main` (the time of its "identity written" line less its `took_ms`; the host and the
    /// container share one clock).
    pub runtime: Option<Duration>,
}

/// `athenz-sia init` for the pod, as its init container (or a process of the pod); returns how
/// long it took.
pub async fn sia_init(stack: &StackInfo, volume: &PodVolume) -> anyhow::Result<SiaInit> {
    let started = Instant::now();
    let runtime = PodRuntime::of(stack)?;
    let mut env = sia_env_in(stack, &runtime.paths(volume));
    env.push(("LOG_FORMAT", "json".into()));
    let what = format!("athenz-sia init for {}", volume.pod.name);
    let ran = runtime
        .run(
            stack,
            volume,
            &PodCommand {
                name: "sia-init",
                program: PodProgram::Sia,
                args: vec!["init".into()],
                env,
            },
            STEP_TIMEOUT,
        )
        .await?;
    if !ran.success {
        bail!("{what}: {} {}", ran.status, ran.output());
    }
    let process = started.elapsed();
    let own = sia_reported_time(&ran.stderr)
        .with_context(|| format!("{what}: its log {:?}", ran.stderr))?;
    let to_main =
        sia_main_started(&ran.stderr).and_then(|main| main.duration_since(ran.asked_at).ok());
    Ok(SiaInit {
        process,
        own,
        runtime: to_main.map(|d| d + ran.sandbox.unwrap_or_default()),
    })
}

/// When the SIA's `main` started: its "identity written" line's time less its `took_ms`.
pub fn sia_main_started(log: &str) -> Option<std::time::SystemTime> {
    let line = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| entry["message"] == "identity written")?;
    let at = time::OffsetDateTime::parse(
        line["timestamp"].as_str()?,
        &time::format_description::well_known::Rfc3339,
    )
    .ok()?;
    let took = Duration::from_secs_f64(line["took_ms"].as_f64()?.max(0.0) / 1e3);
    std::time::SystemTime::from(at).checked_sub(took)
}

/// The `took_ms` of the SIA's "identity written" line in its JSON log.
pub fn sia_reported_time(log: &str) -> anyhow::Result<Duration> {
    let took_ms = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| entry["message"] == "identity written")
        .context("no \"identity written\" line")?["took_ms"]
        .as_f64()
        .context("the \"identity written\" line has no took_ms")?;
    Ok(Duration::from_secs_f64(took_ms.max(0.0) / 1e3))
}

/// Starts `athenz-sia refresh` for the pod, its refresh sidecar, with `interval` as the latest
/// refresh; a process's log goes under `log`.
pub async fn sia_refresh(
    stack: &StackInfo,
    volume: &PodVolume,
    interval: &str,
    log: &Path,
    extra_env: &[(&'static str, String)],
) -> anyhow::Result<PodContainer> {
    let runtime = PodRuntime::of(stack)?;
    let env: Vec<(&'static str, String)> = sia_env_in(stack, &runtime.paths(volume))
        .into_iter()
        .chain(extra_env.iter().cloned())
        .collect();
    runtime
        .start(
            stack,
            volume,
            &PodCommand {
                name: "sia-refresh",
                program: PodProgram::Sia,
                args: vec!["refresh".into(), format!("--refresh-interval={interval}")],
                env,
            },
            log,
        )
        .await
}

/// The pod's application stand-in, a container of the pod started after its init container
/// as kubelet orders them: it reads the credential set where the pod's containers see it (the
/// key its certificate's, the chain to the CA bundle) and gives back what it found.
pub async fn app_reads(
    stack: &StackInfo,
    volume: &PodVolume,
) -> anyhow::Result<crate::identity::IdentityReport> {
    let paths = PodRuntime::of(stack)?.paths(volume);
    let args = vec![
        "pod-app".into(),
        format!("--credentials-dir={}", paths.credentials_dir),
    ];
    let what = format!("the application container of {}", volume.pod.name);
    devstack_in_pod(stack, volume, "app", args, &what).await
}

/// Asks the agent to refresh the pod's identity with the pair its SIA wrote, as the refresh
/// sidecar does (one request, no retries), from a process of the pod (the devstack's hidden
/// `pod-refresh-once` command); `Ok` carries the new certificate chain, `Err` the agent's refusal
/// as text.
pub async fn refresh_once(
    stack: &StackInfo,
    volume: &PodVolume,
) -> anyhow::Result<Result<String, String>> {
    let paths = PodRuntime::of(stack)?.paths(volume);
    let args = vec![
        "pod-refresh-once".into(),
        format!("--socket={}", paths.socket),
        format!("--volume-dir={}", paths.identity_dir),
        format!("--credentials-dir={}", paths.credentials_dir),
        format!("--key-source={}", stack.key_source),
    ];
    let what = format!("refreshing {} once", volume.pod.name);
    let answer: RefreshOnceAnswer =
        devstack_in_pod(stack, volume, "refresh-once", args, &what).await?;
    Ok(match answer {
        RefreshOnceAnswer::Refreshed(chain) => Ok(chain),
        RefreshOnceAnswer::Refused(why) => Err(why),
    })
}

/// Runs one of the devstack's hidden pod-side commands as container `name` of `volume`'s pod
/// and reads its JSON answer: its output's last line (with a runtime, its stdout and stderr
/// are one log).
async fn devstack_in_pod<T: serde::de::DeserializeOwned>(
    stack: &StackInfo,
    volume: &PodVolume,
    name: &str,
    args: Vec<String>,
    what: &str,
) -> anyhow::Result<T> {
    let command = PodCommand {
        name,
        program: PodProgram::Devstack,
        args,
        env: Vec::new(),
    };
    let ran = PodRuntime::of(stack)?
        .run(stack, volume, &command, STEP_TIMEOUT)
        .await?;
    if !ran.success {
        bail!("{what}: {} {}", ran.status, ran.output());
    }
    let line = ran.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line.trim())
        .with_context(|| format!("{what}: its answer {:?}", ran.stdout))
}

/// What `pod-refresh-once` prints.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RefreshOnceAnswer {
    /// The new certificate chain.
    Refreshed(String),
    /// The agent's refusal.
    Refused(String),
}

/// The body of `pod-refresh-once`: one refresh through `socket` with the pair in
/// `credentials_dir`, for the volume whose id is in `volume_dir/id`, as the SIA makes it with
/// `key_source` (with a pod-made key: the agent's attestation, ZTS through the agent's tunnel,
/// the new certificate reported).
pub async fn pod_refresh_once(
    socket: &Path,
    volume_dir: &Path,
    credentials_dir: &Path,
    key_source: athenz_core::agent_api::KeySource,
) -> anyhow::Result<RefreshOnceAnswer> {
    use athenz_core::agent_api::RefreshRequest;
    use athenz_core::secret::Secret;
    let id_text = std::fs::read_to_string(volume_dir.join("id")).context("reading the id")?;
    let id = athenz_core::volume::VolumeId::parse(id_text.trim()).context("the volume id")?;
    let client =
        athenz_sia::client::AgentClient::new(socket.to_owned(), id, Duration::from_secs(30));
    let read = |name: &str| std::fs::read_to_string(credentials_dir.join(name));
    let request = RefreshRequest {
        key_pem: Secret::new(read("service.key.pem").context("reading the key")?),
        cert_pem: read("service.cert.pem").context("reading the certificate")?,
    };
    if key_source == athenz_core::agent_api::KeySource::Pod {
        let refreshed = athenz_sia::pod_refresh::refresh(
            &client,
            &athenz_sia::pod_refresh::ZtsRoute::Tunnel { ca: None },
            athenz_core::crypto::KeyAlgorithm::P256,
            &request.key_pem,
            &request.cert_pem,
            Duration::from_secs(30),
        )
        .await;
        return Ok(match refreshed {
            Ok(answer) => {
                client
                    .report_certificate(&answer.cert_pem)
                    .await
                    .context("reporting the new certificate")?;
                RefreshOnceAnswer::Refreshed(answer.cert_pem)
            }
            Err(e) => RefreshOnceAnswer::Refused(e.to_string()),
        });
    }
    Ok(match client.refresh(&request).await {
        Ok(answer) => RefreshOnceAnswer::Refreshed(answer.cert_pem),
        Err(e) => RefreshOnceAnswer::Refused(e.to_string()),
    })
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

    /// The SIA's `main` is its "identity written" time less what it took.
    #[test]
    fn the_sias_start_is_read_from_its_log() {
        let log = concat!(
            "{\"timestamp\":\"2026-11-25T18:00:08.900000Z\",\"message\":\"asking\"}\n",
            "not json\n",
            "{\"timestamp\":\"2026-11-25T18:00:09.063857Z\",\"level\":\"INFO\",",
            "\"message\":\"identity written\",\"took_ms\":15.4}\n"
        );
        let main = sia_main_started(log).unwrap();
        let written = std::time::SystemTime::from(
            time::OffsetDateTime::parse(
                "2026-11-25T18:00:09.063857Z",
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap(),
        );
        let took = written.duration_since(main).unwrap();
        assert!((took.as_secs_f64() - 0.0154).abs() < 1e-6, "{took:?}");
        assert!(sia_main_started("{\"message\":\"identity written\"}").is_none());
        assert!(sia_main_started("").is_none());
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
            uid: "u".into(),
            node: NodeDirs {
                volumes_dir: PathBuf::from("/v"),
                agent_dir: PathBuf::from("/a"),
                socket: PathBuf::from("/a/agent.sock"),
            },
            mount_dir: PathBuf::from("/k/pods/u/volumes/athenz~volume-driver/athenz-identity"),
            credentials_dir: PathBuf::from("/k/pods/u/credentials"),
        };
        let env = sia_paths_env(&volume);
        assert_eq!(env[0], ("ID_FILE", "id".to_owned()));
        assert_eq!(env[1], ("ENDPOINT", "connect/agent.sock".to_owned()));
        assert_eq!(env[2], ("OUT_DIR", "/k/pods/u/credentials".to_owned()));
    }
}
