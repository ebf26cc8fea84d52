//! `athenz-devstack chaos`: one fault at a time against a running stack whose pods renew
//! one-minute certificates, and what each did to the pods.
//!
//! The pods: `--pods` with the flex volume and their SIA refresh sidecars, and `--files-pods`
//! with the CSI driver's files mode (the agent rotates their files, nothing runs in the pod).
//! For every fault: wait until every pod holds a healthy set; inject the fault and hold it;
//! clear it; wait until every pod is healthy again. Meanwhile the stack is supervised as kubelet
//! would supervise it (a daemon that exits is restarted; a sidecar that exits is restarted after
//! kubelet's crash-loop backoff) and every pod's set is read four times a second, as an
//! application reads it. Per fault it reports the pods affected (a refresh overdue or a
//! certificate expired), the pods whose files expired, torn sets seen, and the recovery time
//! against the bound: the longest renewal backoff (60 s) plus one refresh round.
//!
//! Bounds (docs/design.md §5, "chaos"): no torn set ever; no pod's files expire while ZTS can issue
//! (the error faults last a quarter of the lifetime: renewal starts at 60–70 % of it, so that
//! is inside the margin every certificate has); after any fault every pod is healthy within the
//! bound. Under `zts-stopped` (SIGSTOP for three lifetimes) and `agent-node-cert-expired` ZTS is
//! unreachable for longer than certificates live, so files may expire; they must still recover
//! within the bound once ZTS is back. A fault that never met a renewal did not test anything
//! and fails.
//!
//! Faults in the stand-ins (ZTS errors, API and kubelet trouble) go through the faults file
//! they follow ([`athenz_testbed::faults`]); processes are signalled; the disk is really filled.

use crate::fleet::Fleet;
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, bail};
use athenz_core::volume_mode::VolumeMode;
use athenz_testbed::faults::Faults;
use serde::Serialize;
use stand_ins::Injection;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use watch::{Pods, settle};

mod daemons;
mod node;
mod set_reader;
mod stand_ins;
mod volume;
mod watch;

/// A fault `chaos` can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The jwt-service killed with SIGKILL five times over half a lifetime (restarted each time).
    JwtServiceKilled,
    /// The agent killed with SIGKILL five times over half a lifetime (restarted each time).
    AgentKilled,
    /// The agent replaced by another build (SIGTERM, drain, the new binary on the same state and
    /// sockets) while pods renew and three start.
    AgentUpgraded,
    /// The jwt-service's and the callback's Deployments (two replicas each, behind a Service)
    /// rolled one replica at a time while pods renew and two start.
    ControlPlaneRolled,
    /// The node rebooted: every node-side process and mount gone, the disk kept; the agent and
    /// every pod started again as kubelet does, each pod with a new IP reported a moment later.
    NodeRebooted,
    /// ZTS answering 500 to every instance register and refresh for a quarter lifetime.
    #[value(name = "zts-500")]
    #[serde(rename = "zts-500")]
    Zts500,
    /// ZTS answering 503 to every instance register and refresh for a quarter lifetime.
    #[value(name = "zts-503")]
    #[serde(rename = "zts-503")]
    Zts503,
    /// The callback denying every launch and refresh for a quarter lifetime (the API server
    /// answers 404 for every pod, so its `pod_exists` check fails).
    CallbackDenying,
    /// The Kubernetes API refusing connections (its port closed) for a quarter lifetime while
    /// a pod starts: the callback answers 504, renewals retry, the pod gets its identity once
    /// the API is back.
    ApiServerUnreachable,
    /// The kubelet answering its pod list after 2 s, for half a lifetime.
    KubeletSlow,
    /// The kubelet answering 500, for a quarter lifetime.
    KubeletFailing,
    /// The kubelet listing no pods (not synced), for a quarter lifetime.
    KubeletOmittingPods,
    /// A files-mode pod's tmpfs filled up until one of its rotations failed.
    DiskFull,
    /// `athenz-sia init` killed with SIGKILL at a random point of its run, `--sia-kills` times,
    /// while a reader checks every set it can read.
    SiaKilledMidWrite,
    /// ZTS stopped until the agent's own node certificate has expired.
    AgentNodeCertExpired,
    /// ZTS frozen with SIGSTOP for three certificate lifetimes, then SIGCONT.
    ZtsStopped,
    /// The SIA's init container killed by the runtime (`kill KILL` by id) at a random point of
    /// its run, `--sia-kills` times over a tenth, then run again as kubelet restarts it.
    /// Needs a container runtime.
    InitContainerKilled,
    /// Every flex pod's refresh sidecar killed by the runtime and restarted by kubelet's
    /// crash-loop back-off as a new container in the same pod: still served. Needs a container
    /// runtime.
    SidecarRestarted,
    /// A container of pod A given pod B's identity volume: its SIA refused. Needs a container
    /// runtime.
    ForeignVolume,
    /// A process in no pod given a pod's identity volume: its SIA refused. Needs a container
    /// runtime.
    HostProcess,
}

impl Fault {
    /// Whether it needs pods made by a container runtime (runc or crun).
    pub fn needs_runtime(self) -> bool {
        matches!(
            self,
            Self::InitContainerKilled
                | Self::SidecarRestarted
                | Self::ForeignVolume
                | Self::HostProcess
        )
    }
}

/// The faults a run with `runtime` (as `--runtime` says; `None`: the default here) makes when
/// none are named: all of them, those needing a container runtime only with one.
pub fn default_faults(runtime: Option<athenz_testbed::runtime::RuntimeKind>) -> Vec<Fault> {
    let kind = runtime.unwrap_or_else(|| athenz_testbed::runtime::RuntimeKind::default_here().0);
    ALL_FAULTS
        .into_iter()
        .filter(|f| kind != athenz_testbed::runtime::RuntimeKind::Process || !f.needs_runtime())
        .collect()
}

/// Every fault, in the order they run.
pub const ALL_FAULTS: [Fault; 20] = [
    Fault::JwtServiceKilled,
    Fault::AgentKilled,
    Fault::AgentUpgraded,
    Fault::ControlPlaneRolled,
    Fault::NodeRebooted,
    Fault::Zts500,
    Fault::Zts503,
    Fault::CallbackDenying,
    Fault::ApiServerUnreachable,
    Fault::KubeletSlow,
    Fault::KubeletFailing,
    Fault::KubeletOmittingPods,
    Fault::DiskFull,
    Fault::SiaKilledMidWrite,
    Fault::AgentNodeCertExpired,
    Fault::ZtsStopped,
    Fault::InitContainerKilled,
    Fault::SidecarRestarted,
    Fault::ForeignVolume,
    Fault::HostProcess,
];

/// What to run: `chaos`'s options, as its command line gives them.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosOptions {
    /// Pods with the flex volume (each with its refresh sidecar).
    #[arg(long, default_value_t = 20)]
    pub pods: usize,
    /// Pods with the CSI files-mode volume (the agent rotates their files); at least 1
    /// for `disk-full`.
    #[arg(long, default_value_t = 4)]
    pub files_pods: usize,
    /// Certificate lifetime in minutes.
    #[arg(long, default_value_t = 1)]
    pub lifetime_minutes: u32,
    /// The faults to inject, in order (comma-separated); all by default.
    // none named: every fault a run with `runtime` can make (`faults_to_run`)
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Fault>,
    /// How many times `sia-killed-mid-write` kills the SIA.
    #[arg(long, default_value_t = 1000)]
    pub sia_kills: usize,
    /// Where the flex pods' keys are made (the agents' and SIAs' --key-source).
    #[arg(long, value_enum, default_value_t = athenz_core::agent_api::KeySource::Pod)]
    pub key_source: athenz_core::agent_api::KeySource,
    /// How pods' processes start: runc or crun (a sandbox and containers, as kubelet has a
    /// CRI runtime make them) or process (a plain process in a kubelet-shaped cgroup);
    /// default: runc when it is installed and this runs as root, else process.
    #[arg(long)]
    pub runtime: Option<athenz_testbed::runtime::RuntimeKind>,
    /// Run each component from its own binary in DIR instead of this one.
    #[arg(long, value_name = "DIR")]
    pub components: Option<PathBuf>,
    /// `agent-upgraded`'s new build: a directory holding `athenz-identity-agent` (e.g. the
    /// image's `target/image/bin`); default: a copy of the running agent's binary.
    #[arg(long, value_name = "DIR")]
    pub upgrade_to: Option<PathBuf>,
}

impl ChaosOptions {
    /// The faults named, or when none are, every fault a run with this `runtime` can make
    /// ([`default_faults`]).
    fn faults_to_run(&self) -> Vec<Fault> {
        if self.faults.is_empty() {
            default_faults(self.runtime)
        } else {
            self.faults.clone()
        }
    }
}

/// One fault's row.
#[derive(Debug, Clone, Serialize)]
pub struct FaultResult {
    pub fault: Fault,
    /// What was done, in numbers.
    pub detail: String,
    /// Pods with a refresh overdue or a certificate expired, during the fault or after it.
    pub pods_affected: usize,
    /// Pods whose files expired.
    pub pods_expired: usize,
    /// Sets read torn (a key not its certificate's).
    pub torn_sets: u64,
    /// From the fault's end to every pod healthy again, seconds (`None`: not within twice the
    /// bound).
    pub recovery_seconds: Option<f64>,
    /// The bound on recovery, seconds.
    pub bound_seconds: f64,
    /// Whether every bound held.
    pub passed: bool,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct ChaosReport {
    /// Pods with the flex volume.
    pub pods: usize,
    /// Pods with the CSI files-mode volume.
    pub files_pods: usize,
    /// Certificate lifetime, seconds.
    pub lifetime_seconds: u64,
    /// One row per fault.
    pub faults: Vec<FaultResult>,
    /// Seconds the run took.
    pub seconds: u64,
    /// Every fault passed.
    pub passed: bool,
}

/// Runs the faults on a fresh stack in `state_dir`.
pub async fn run(state_dir: &Path, options: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let options = &ChaosOptions {
        faults: options.faults_to_run(),
        ..options.clone()
    };
    if options.pods == 0 || options.lifetime_minutes == 0 || options.faults.is_empty() {
        bail!("--pods, --lifetime-minutes and --faults must not be empty or zero");
    }
    let started = Instant::now();
    let mut stack = Stack::start(&StackOptions {
        components: options.components.clone(),
        // the agent serves CSI too, for the files-mode pods; the others use the flex volume
        volume: VolumeMode::CsiFiles,
        cert_expiry_minutes: Some(options.lifetime_minutes),
        fault_injection: true,
        key_source: options.key_source,
        runtime: options.runtime,
        // the Deployments run two replicas each when they are to be rolled
        control_plane_replicas: if options.faults.contains(&Fault::ControlPlaneRolled) {
            2
        } else {
            1
        },
        ..StackOptions::new(state_dir.to_owned(), "p256")
    })
    .await?;
    let needing: Vec<Fault> = options
        .faults
        .iter()
        .copied()
        .filter(|f| f.needs_runtime())
        .collect();
    if stack.info.runtime.kind == athenz_testbed::runtime::RuntimeKind::Process
        && !needing.is_empty()
    {
        let reason = stack.info.runtime.reason.clone();
        stack.stop().await;
        bail!(
            "--faults {needing:?} need pods made by a container runtime, and this stack runs them \
             as processes ({reason}): use --runtime runc or crun"
        );
    }
    let result = faults(&mut stack, options).await;
    stack.stop().await;
    let faults = result?;
    Ok(ChaosReport {
        pods: options.pods,
        files_pods: options.files_pods,
        lifetime_seconds: u64::from(options.lifetime_minutes) * 60,
        passed: faults.iter().all(|f| f.passed),
        faults,
        seconds: started.elapsed().as_secs(),
    })
}

async fn faults(stack: &mut Stack, options: &ChaosOptions) -> anyhow::Result<Vec<FaultResult>> {
    let lifetime = Duration::from_secs(u64::from(options.lifetime_minutes) * 60);
    let mut pods = Pods {
        flex: Fleet::start(stack, 0..options.pods, VolumeMode::Flex).await?,
        files: Fleet::start(
            stack,
            options.pods..options.pods + options.files_pods,
            VolumeMode::CsiFiles,
        )
        .await?,
    };
    let quarter = lifetime / 4;
    let mut results = Vec::new();
    for &fault in &options.faults {
        settle(stack, &mut pods, lifetime * 3)
            .await
            .with_context(|| format!("before {fault:?}"))?;
        let injected = |faults: Faults, hold: Duration, what: &str| Injection {
            fault,
            faults,
            hold,
            what: what.to_owned(),
        };
        let result = match fault {
            Fault::ZtsStopped => stand_ins::zts_stopped(stack, &mut pods, lifetime).await?,
            Fault::AgentNodeCertExpired => {
                daemons::agent_node_cert_expired(stack, &mut pods, lifetime).await?
            }
            Fault::JwtServiceKilled => {
                daemons::killed(stack, &mut pods, "jwt-service", fault, lifetime / 2).await?
            }
            Fault::AgentKilled => {
                daemons::killed(stack, &mut pods, "agent", fault, lifetime / 2).await?
            }
            Fault::AgentUpgraded => {
                daemons::agent_upgraded(
                    stack,
                    &mut pods,
                    lifetime,
                    options.upgrade_to.as_deref(),
                    // pod numbers no fleet of the run uses
                    options.pods + options.files_pods + 100 * (results.len() + 1),
                )
                .await?
            }
            Fault::ControlPlaneRolled => {
                daemons::control_plane_rolled(
                    stack,
                    &mut pods,
                    lifetime,
                    options.pods + options.files_pods + 100 * (results.len() + 1),
                )
                .await?
            }
            Fault::NodeRebooted => node::node_rebooted(stack, &mut pods).await?,
            Fault::Zts500 | Fault::Zts503 => {
                let status = if fault == Fault::Zts500 { 500 } else { 503 };
                let faults = Faults {
                    zts_instance_status: Some(status),
                    ..Faults::default()
                };
                let what = format!("ZTS answering {status}");
                stand_ins::inject(stack, &mut pods, injected(faults, quarter, &what)).await?
            }
            Fault::CallbackDenying => {
                let faults = Faults {
                    api_pods_missing: true,
                    ..Faults::default()
                };
                let what = "the API server answering 404 for every pod, so the callback denies";
                stand_ins::inject(stack, &mut pods, injected(faults, quarter, what)).await?
            }
            Fault::ApiServerUnreachable => {
                // a pod number no fleet of the run uses
                let starting = options.pods + options.files_pods + 100 * (results.len() + 1);
                stand_ins::api_server_unreachable(stack, &mut pods, quarter, starting).await?
            }
            Fault::KubeletSlow => {
                let faults = Faults {
                    kubelet_delay_ms: 2000,
                    ..Faults::default()
                };
                let what = "the kubelet answering after 2 s";
                stand_ins::inject(stack, &mut pods, injected(faults, lifetime / 2, what)).await?
            }
            Fault::KubeletFailing => {
                let faults = Faults {
                    kubelet_failing: true,
                    ..Faults::default()
                };
                let what = "the kubelet answering 500";
                stand_ins::inject(stack, &mut pods, injected(faults, quarter, what)).await?
            }
            Fault::KubeletOmittingPods => {
                let faults = Faults {
                    kubelet_omit_pods: true,
                    ..Faults::default()
                };
                let what = "the kubelet listing no pods";
                stand_ins::inject(stack, &mut pods, injected(faults, quarter, what)).await?
            }
            Fault::DiskFull => volume::disk_full(stack, &mut pods, lifetime).await?,
            Fault::SiaKilledMidWrite => {
                volume::sia_killed_mid_write(stack, &pods, options.sia_kills).await?
            }
            Fault::InitContainerKilled => {
                node::init_container_killed(stack, &mut pods, options.sia_kills / 10).await?
            }
            Fault::SidecarRestarted => node::sidecars_restarted(stack, &mut pods).await?,
            Fault::ForeignVolume => node::foreign_volume(stack, &mut pods).await?,
            Fault::HostProcess => node::host_process(stack, &mut pods).await?,
        };
        results.push(result);
    }
    pods.flex.stop(stack).await?;
    pods.files.stop(stack).await?;
    Ok(results)
}

/// The table of the closing note: one line per fault.
pub fn print_human(report: &ChaosReport) {
    println!(
        "chaos: {} flex pods and {} files-mode pods, certificates of {} s, {} s",
        report.pods, report.files_pods, report.lifetime_seconds, report.seconds
    );
    println!(
        "{:<22} {:>8} {:>8} {:>5} {:>10} {:>6}  {:<6} detail",
        "fault", "affected", "expired", "torn", "recovery s", "bound", "result"
    );
    for f in &report.faults {
        println!(
            "{:<22} {:>8} {:>8} {:>5} {:>10} {:>6}  {:<6} {}",
            serde_json::to_value(f.fault)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            f.pods_affected,
            f.pods_expired,
            f.torn_sets,
            f.recovery_seconds
                .map(|r| format!("{r:.1}"))
                .unwrap_or_else(|| "never".into()),
            f.bound_seconds,
            if f.passed { "pass" } else { "FAIL" },
            f.detail
        );
    }
    println!("{}", if report.passed { "PASSED" } else { "FAILED" });
}
