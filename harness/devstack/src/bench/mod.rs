//! `athenz-devstack bench`: the full path for N pods — kubelet's mount (the flex driver's exec or
//! its CSI calls), `athenz-sia init` where the pod runs one, the agent, jwt-service, ZTS,
//! callback and API — at a given concurrency and key type, for each volume kind asked for (each
//! on a fresh stack, one after the other, so their figures are of the same machine at the same
//! time). Reports mount→files-written latency, throughput, CPU and peak memory per process, and
//! the cost of the cryptography no implementation can avoid, measured in the same run, as a ratio.

use crate::kube::{KubeClient, NewPod, PodSize};
use crate::pod_volume::{MountedVolume, NodeKubelet, PodTimes};
use crate::procs::Usage;
use crate::stack::{Stack, StackInfo, StackOptions};
use anyhow::{Context, bail};
use athenz_core::agent_api::KeySource;
use athenz_core::crypto::KeyAlgorithm;
use athenz_core::volume_mode::VolumeMode;
use nix::sys::resource::{UsageWho, getrusage};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod floor;
mod latency;
mod print;
pub use floor::{CryptoFloor, FloorStep, crypto_floor};
use latency::ms;
pub use latency::{Latency, LatencyParts};
pub use print::{print_comparison, print_human};

/// What to run: `bench`'s options, as its command line gives them.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Pods to give identities.
    #[arg(long, default_value_t = 110)]
    pub pods: usize,
    /// Pods in flight at once (when all exist first, i.e. `--arrival 0`).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Pods arrive one by one this far apart (e.g. 20ms), each created and mounted at once,
    /// as during a rollout; 0: every pod exists before the first mount.
    // what a node sees during a rollout; with zero, `concurrency` pods are mounted at a time
    #[arg(long, default_value = "0", value_parser = parse_arrival)]
    pub arrival: Duration,
    /// Pods as the kubelet lists them: real (8–15 KB each: containers, probes, status,
    /// managed fields) or minimal (a few fields).
    #[arg(long, value_enum, default_value_t = PodSize::Real)]
    pub pod_size: PodSize,
    /// Pod key type: p256 or rsa2048.
    #[arg(long, default_value = "p256")]
    pub key: String,
    /// Run each component from its own binary in DIR (e.g. the static driver and SIA a
    /// cluster ships) instead of this one.
    #[arg(long, value_name = "DIR")]
    pub components: Option<std::path::PathBuf>,
    /// The agents' peer check; default enforce where pod cgroups can be made, else off.
    #[arg(long, value_enum)]
    pub peer_check: Option<athenz_core::peer::PeerCheck>,
    /// The pods' volume; several (comma-separated) are measured one after the other, each
    /// on a fresh stack, and compared.
    #[arg(
        long = "volume",
        value_name = "VOLUME",
        value_enum,
        value_delimiter = ',',
        default_values_t = [VolumeMode::Flex]
    )]
    pub volumes: Vec<VolumeMode>,
    /// Where socket-mode pods' keys are made; several (e.g. pod,agent) are measured one
    /// after the other, each on a fresh stack, and compared.
    // files mode always makes its keys on the node: it is measured once
    #[arg(
        long = "key-source",
        value_name = "KEY_SOURCE",
        value_enum,
        value_delimiter = ',',
        default_value = "pod"
    )]
    pub key_sources: Vec<KeySource>,
    /// How pods' processes start: runc or crun (a sandbox and containers, as kubelet has a
    /// CRI runtime make them) or process (a plain process in a kubelet-shaped cgroup);
    /// default: runc when it is installed and this runs as root, else process.
    #[arg(long)]
    pub runtime: Option<athenz_testbed::runtime::RuntimeKind>,
    /// Which ZTS: the development ZTS (dev) or Athenz's own, built from its source by
    /// harness/peers/athenz/zts/build (athenz; docs/real-zts.md): its CPU per identity is
    /// then Athenz's.
    #[arg(long, value_enum, default_value_t = crate::stack::ZtsServer::Dev)]
    pub zts: crate::stack::ZtsServer,
}

/// A duration like `20ms`, or `0` (what `--arrival` and `cluster bench`'s intervals take).
pub fn parse_arrival(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    athenz_core::refresh::parse_duration(text)
}

/// One process's share of the run.
#[derive(Debug, Serialize)]
pub struct ProcessReport {
    /// Component.
    pub name: String,
    /// CPU seconds during the run.
    pub cpu_seconds: f64,
    /// Peak resident set since it started, MiB (none for the short-lived processes: the kernel's
    /// accounting of reaped children counts, in each forked child's high-water mark, the pages it
    /// shared with this process before exec; `cargo bench -p athenz-sia --bench node` measures
    /// the SIA's own).
    pub peak_rss_mib: Option<f64>,
    /// Resident set at the end of the run, MiB.
    pub rss_mib: Option<f64>,
}

/// CPU per identity of one of this system's daemons (or all of them), against the cryptography
/// that part cannot avoid.
#[derive(Debug, Serialize)]
pub struct DaemonCpu {
    /// `agent`, `jwt-service`, `callback` or their sum.
    pub name: String,
    /// CPU per identity, ms.
    pub cpu_per_identity_ms: f64,
    /// Its unavoidable cryptography per identity, ms.
    pub floor_ms: f64,
    /// The one over the other.
    pub ratio: f64,
}

/// CPU on the node to unmount one pod's volume as kubelet does when the pod goes: the flex
/// driver's `unmount` process, or the agent's `NodeUnpublishVolume`.
#[derive(Debug, Serialize)]
pub struct UnmountCpu {
    /// The agent, ms per pod.
    pub agent_ms: f64,
    /// Processes exec'd for it (the flex driver), ms per pod.
    pub per_pod_process_ms: f64,
}

impl UnmountCpu {
    /// Both, ms per pod.
    pub fn node_ms(&self) -> f64 {
        self.agent_ms + self.per_pod_process_ms
    }
}

/// The results of one volume kind.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// The pods' volume.
    pub volume: VolumeMode,
    /// Where the pods' keys were made.
    pub key_source: KeySource,
    /// How the pods' processes started: runc, crun or process.
    pub runtime: athenz_testbed::runtime::RuntimeKind,
    /// The agent's calls to what it depends on during the run (its
    /// `upstream_duration_seconds` histogram), by upstream: where the SIA's init waits.
    pub agent_upstreams: BTreeMap<String, crate::agent_upstreams::Step>,
    pub pods: usize,
    /// Pods in flight at once (with `arrival_ms` 0).
    pub concurrency: usize,
    /// Milliseconds between two pods' arrival (0: all existed first).
    pub arrival_ms: f64,
    /// Pod size as listed.
    pub pod_size: PodSize,
    /// Key type.
    pub key: String,
    /// The agents' peer check.
    pub peer_check: athenz_core::peer::PeerCheck,
    /// Mount → files written, ms.
    pub latency_ms: Latency,
    /// Its parts, ms.
    pub latency_parts_ms: LatencyParts,
    /// From the first mount to the last files written, seconds.
    pub wall_seconds: f64,
    /// Identities per second.
    pub throughput_per_second: f64,
    /// Long-running processes.
    pub processes: Vec<ProcessReport>,
    /// Driver and SIA processes, all of them together (CPU) and the largest (peak RSS).
    pub short_lived: ProcessReport,
    /// This system's daemons (agent, jwt-service, callback), each and together, against their
    /// own unavoidable cryptography; the stand-ins (ZTS, Kubernetes) are not counted.
    pub daemons: Vec<DaemonCpu>,
    /// The per-pod processes (driver and SIA), CPU ms per pod: with pod-made keys the SIA makes
    /// the key and signs the CSR (the floor's `sia` steps), else they do no cryptography.
    pub per_pod_process_ms: f64,
    /// Every process of this system for one identity (agent, jwt-service, callback and the
    /// per-pod processes; not the stand-ins) against the cryptography they cannot avoid.
    pub system: DaemonCpu,
    /// What runs on the node for one identity — the agent and the per-pod processes; the
    /// jwt-service and callback run in the control plane — against the identity's unavoidable
    /// cryptography, all of it (`crypto_floor`, ZTS's steps included). In files mode that is the
    /// agent alone.
    pub node: DaemonCpu,
    /// What unmounting a pod's volume costs the node when the pod goes (not in `node`).
    pub unmount: UnmountCpu,
    /// All CPU of the run per identity, ms.
    pub cpu_per_identity_ms: f64,
    /// The unavoidable part.
    pub crypto_floor: CryptoFloor,
    /// cpu_per_identity / crypto floor.
    pub cpu_to_floor_ratio: f64,
}

/// The agent's upstream calls over its life (this run's agent started with it); empty, with a
/// warning, when its metrics cannot be read: the report says so by being empty, the run is not
/// failed for it.
async fn upstream_calls(metrics_url: &str) -> BTreeMap<String, crate::agent_upstreams::Step> {
    match crate::agent_upstreams::scrape(metrics_url).await {
        Ok(counts) => counts.since(&Default::default()),
        Err(error) => {
            eprintln!("warning: no agent upstream times: {error:#}");
            BTreeMap::new()
        }
    }
}

/// CPU seconds of the children reaped so far.
fn children_usage() -> f64 {
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            secs(u.user_time()) + secs(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// Runs the benchmark in `state_dir` once per volume kind asked for.
pub async fn run(state_dir: &Path, options: &BenchOptions) -> anyhow::Result<Vec<BenchReport>> {
    if options.pods == 0 || options.concurrency == 0 {
        bail!("--pods and --concurrency must be at least 1");
    }
    if options.volumes.is_empty() {
        bail!("--volume: name at least one of flex, csi-socket, csi-files");
    }
    let algorithm = match options.key.as_str() {
        "p256" => KeyAlgorithm::P256,
        "rsa2048" => KeyAlgorithm::Rsa2048,
        other => bail!("--key {other:?}: must be p256 or rsa2048"),
    };
    if options.key_sources.is_empty() {
        bail!("--key-source: name at least one of pod, agent");
    }
    let mut reports = Vec::new();
    for &volume in &options.volumes {
        for &key_source in &options.key_sources {
            // files mode has no SIA: the agent makes its keys whatever the setting
            if volume == VolumeMode::CsiFiles && key_source != options.key_sources[0] {
                continue;
            }
            let report = run_one(state_dir, options, algorithm, volume, key_source)
                .await
                .with_context(|| format!("the {} run with {key_source} keys", volume.name()))?;
            reports.push(report);
        }
    }
    Ok(reports)
}

/// One volume kind on a stack of its own.
async fn run_one(
    state_dir: &Path,
    options: &BenchOptions,
    algorithm: KeyAlgorithm,
    volume: VolumeMode,
    key_source: KeySource,
) -> anyhow::Result<BenchReport> {
    // The stack's state on a tmpfs: the figures are then the system's, not those of the host
    // disk's inode allocator (on a much-churned ext4, creating the volumes' directories cost
    // several ms each in `recently_deleted` scans; perf showed it).
    mount_tmpfs(state_dir)?;
    let stack = Stack::start(&StackOptions {
        components: options.components.clone(),
        peer_check: options.peer_check,
        volume,
        key_source,
        runtime: options.runtime,
        zts: options.zts,
        ..StackOptions::new(state_dir.to_owned(), &options.key)
    })
    .await;
    let result = match stack {
        Ok(stack) => {
            let result = measure(&stack, options, algorithm, volume).await;
            stack.stop().await;
            result
        }
        Err(e) => Err(e),
    };
    if let Err(e) = nix::mount::umount2(state_dir, nix::mount::MntFlags::MNT_DETACH) {
        eprintln!(
            "could not unmount the bench's tmpfs at {}: {e}",
            state_dir.display()
        );
    }
    result
}

fn mount_tmpfs(dir: &Path) -> anyhow::Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=256m,mode=0755"),
    )
    .with_context(|| format!("mounting a tmpfs on {}", dir.display()))
}

/// Pod `n` of the run: alternating between two namespaces (two Athenz domains).
pub(crate) fn bench_pod(n: usize) -> NewPod {
    NewPod {
        namespace: if n.is_multiple_of(2) {
            "media-sports"
        } else {
            "finance-ledger"
        }
        .into(),
        name: format!("bench-{n}"),
        service_account: "web".into(),
        ip: format!("10.2.{}.{}", n / 250, n % 250 + 1),
    }
}

/// The pods' tasks, each giving back its mount → files time and its volume.
type Tasks = tokio::task::JoinSet<anyhow::Result<(PodTimes, MountedVolume)>>;

/// Every pod created first, then `concurrency` of them mounted at a time.
async fn run_all_existing(
    info: &Arc<StackInfo>,
    kube: &KubeClient,
    kubelet: &NodeKubelet,
    options: &BenchOptions,
) -> anyhow::Result<(Instant, Tasks)> {
    let mut pods = Vec::new();
    for n in 0..options.pods {
        let pod = bench_pod(n);
        let uid = kube
            .create_running_pod_sized(&pod, &info.node_name, options.pod_size)
            .await?;
        pods.push((pod, uid));
    }
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(options.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for (pod, uid) in pods {
        let permit = semaphore.clone().acquire_owned().await?;
        let (info, kubelet) = (info.clone(), kubelet.clone());
        tasks.spawn(async move {
            let _permit = permit;
            kubelet.give_identity(&info, &pod, &uid).await
        });
    }
    Ok((started, tasks))
}

/// One pod every `options.arrival`: created in the API and mounted at once, as a node sees a
/// rollout. Pods overlap when one takes longer than the interval.
fn run_arriving(
    info: &Arc<StackInfo>,
    kube: &KubeClient,
    kubelet: &NodeKubelet,
    options: &BenchOptions,
) -> (Instant, Tasks) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..options.pods {
        let at = started
            + options
                .arrival
                .saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        let (info, kube, kubelet, size) = (
            info.clone(),
            kube.clone(),
            kubelet.clone(),
            options.pod_size,
        );
        tasks.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let pod = bench_pod(n);
            let uid = kube
                .create_running_pod_sized(&pod, &info.node_name, size)
                .await?;
            kubelet.give_identity(&info, &pod, &uid).await
        });
    }
    (started, tasks)
}

async fn measure(
    stack: &Stack,
    options: &BenchOptions,
    algorithm: KeyAlgorithm,
    volume: VolumeMode,
) -> anyhow::Result<BenchReport> {
    let info = Arc::new(stack.info.clone());
    let kube = KubeClient::new(&info.kube_api.url)?;
    let kubelet = NodeKubelet::new(&info, volume, &stack.state_dir.join("kubelet")).await?;

    let before: Vec<(String, Usage)> = stack.usage();
    let children_cpu_before = children_usage();
    let (started, mut tasks) = if options.arrival.is_zero() {
        run_all_existing(&info, &kube, &kubelet, options).await?
    } else {
        run_arriving(&info, &kube, &kubelet, options)
    };
    let mut times = Vec::new();
    let mut volumes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (pod_times, volume) = joined.context("a pod's task")??;
        times.push(pod_times);
        volumes.push(volume);
    }
    let wall = started.elapsed();
    let children_cpu_after = children_usage();
    let after = stack.usage();
    let agent_upstreams = upstream_calls(&info.agent.metrics_url).await;

    // Unmount as kubelet does when the pods go: outside the identities' latency and CPU, but
    // measured apart, because a pod's volume costs the node this too.
    let agent_cpu = |usage: &[(String, Usage)]| {
        usage
            .iter()
            .filter(|(name, _)| name == AGENT)
            .map(|(_, u)| u.cpu_seconds)
            .sum::<f64>()
    };
    let teardown_before = (agent_cpu(&stack.usage()), children_usage());
    for mounted in &volumes {
        kubelet.take_down(&info, mounted).await?;
    }
    let teardown_after = (agent_cpu(&stack.usage()), children_usage());
    let per_identity_ms = |cpu: f64| cpu * 1e3 / options.pods as f64;
    let unmount = UnmountCpu {
        agent_ms: per_identity_ms((teardown_after.0 - teardown_before.0).max(0.0)),
        per_pod_process_ms: per_identity_ms((teardown_after.1 - teardown_before.1).max(0.0)),
    };

    let mut latencies: Vec<Duration> = times.iter().map(|t| t.total).collect();
    let mut processes = Vec::new();
    let mut total_cpu = 0.0;
    for ((name, a), (_, b)) in after.iter().zip(before.iter()) {
        let cpu = (a.cpu_seconds - b.cpu_seconds).max(0.0);
        total_cpu += cpu;
        processes.push(ProcessReport {
            name: name.clone(),
            cpu_seconds: cpu,
            peak_rss_mib: Some(a.peak_rss_kib as f64 / 1024.0),
            rss_mib: Some(a.rss_kib as f64 / 1024.0),
        });
    }
    let children_cpu = (children_cpu_after - children_cpu_before).max(0.0);
    total_cpu += children_cpu;
    let key_source = if volume == VolumeMode::CsiFiles {
        KeySource::Agent
    } else {
        info.key_source
    };
    let floor = crypto_floor(algorithm, key_source)?;
    let per_pod_process_ms = per_identity_ms(children_cpu);
    let daemons = daemon_cpu(&processes, &floor, options.pods);
    let system = {
        let daemons_total = daemons.last().context("the daemons' sum")?;
        let cpu = daemons_total.cpu_per_identity_ms + per_pod_process_ms;
        let floor_ms = daemons_total.floor_ms + floor.of(SIA);
        DaemonCpu {
            name: format!("{} + per-pod processes", daemons_total.name),
            cpu_per_identity_ms: cpu,
            floor_ms,
            ratio: cpu / floor_ms,
        }
    };
    let node = {
        let agent = daemons
            .iter()
            .find(|d| d.name == AGENT)
            .context("the agent's CPU")?;
        let cpu = agent.cpu_per_identity_ms + per_pod_process_ms;
        // against the identity's whole floor: the node's own share of it (key and CSR) is a
        // tenth, and the control plane's share is no more the node's than ZTS's is
        DaemonCpu {
            name: "on the node: agent + per-pod processes".to_owned(),
            cpu_per_identity_ms: cpu,
            floor_ms: floor.total_ms,
            ratio: cpu / floor.total_ms,
        }
    };
    let per_pod_processes = match volume {
        VolumeMode::Flex => format!("driver + sia ({} processes", options.pods * 2),
        VolumeMode::CsiSocket => format!("sia ({} processes", options.pods),
        VolumeMode::CsiFiles => "none (0 processes".to_owned(),
    };
    let cpu_per_identity_ms = per_identity_ms(total_cpu);
    Ok(BenchReport {
        volume,
        key_source,
        runtime: info.runtime.kind,
        agent_upstreams,
        pods: options.pods,
        concurrency: options.concurrency,
        arrival_ms: ms(options.arrival),
        pod_size: options.pod_size,
        key: options.key.clone(),
        peer_check: info.peer_check,
        latency_ms: Latency::of(&mut latencies),
        latency_parts_ms: LatencyParts::of(&times),
        wall_seconds: wall.as_secs_f64(),
        throughput_per_second: options.pods as f64 / wall.as_secs_f64(),
        processes,
        short_lived: ProcessReport {
            // as processes with pod cgroups each SIA starts as `sh -c 'echo $$ > cgroup.procs;
            // exec sia'`; with a runtime, the runtime's own processes (a `run` per container,
            // the sandbox's loopback) are the SIA's parents and are counted with it: the
            // kernel's accounting of reaped children cannot tell them apart
            name: format!(
                "{per_pod_processes}{})",
                match (info.runtime.kind, volume) {
                    (_, VolumeMode::CsiFiles) => String::new(),
                    (athenz_testbed::runtime::RuntimeKind::Process, _)
                        if info.pod_cgroup_root.is_some() =>
                    {
                        ", sia joins its pod cgroup via sh".to_owned()
                    }
                    (athenz_testbed::runtime::RuntimeKind::Process, _) => String::new(),
                    (kind, _) =>
                        format!(", with {kind}'s own processes for sandbox and containers"),
                }
            ),
            cpu_seconds: children_cpu,
            peak_rss_mib: None,
            rss_mib: None,
        },
        daemons,
        system,
        node,
        unmount,
        per_pod_process_ms,
        cpu_per_identity_ms,
        cpu_to_floor_ratio: cpu_per_identity_ms / floor.total_ms,
        crypto_floor: floor,
    })
}

/// The daemons' CPU per identity, each against its own part of the floor, and together.
fn daemon_cpu(processes: &[ProcessReport], floor: &CryptoFloor, pods: usize) -> Vec<DaemonCpu> {
    let per_identity = |cpu: f64| cpu * 1e3 / pods as f64;
    let mut rows = Vec::new();
    let (mut cpu_sum, mut floor_sum) = (0.0, 0.0);
    for part in [AGENT, JWT_SERVICE, CALLBACK] {
        let cpu = processes
            .iter()
            .filter(|p| p.name == part)
            .map(|p| p.cpu_seconds)
            .sum::<f64>();
        let floor_ms = floor.of(part);
        cpu_sum += cpu;
        floor_sum += floor_ms;
        rows.push(DaemonCpu {
            name: part.to_owned(),
            cpu_per_identity_ms: per_identity(cpu),
            floor_ms,
            ratio: per_identity(cpu) / floor_ms,
        });
    }
    rows.push(DaemonCpu {
        name: format!("{AGENT} + {JWT_SERVICE} + {CALLBACK}"),
        cpu_per_identity_ms: per_identity(cpu_sum),
        floor_ms: floor_sum,
        ratio: per_identity(cpu_sum) / floor_sum,
    });
    rows
}

/// The agent's name in the stack's process list (and in the floor's parts).
pub(crate) const AGENT: &str = "agent";
/// The pod's SIA in the floor's parts (it makes the pod's key with pod-made keys).
pub(crate) const SIA: &str = "sia";
/// The jwt-service's.
pub(crate) const JWT_SERVICE: &str = "jwt-service";
/// The callback's.
pub(crate) const CALLBACK: &str = "callback";
/// The development ZTS's (a stand-in: its CPU is reported, not judged).
pub(crate) const ZTS: &str = "zts";
