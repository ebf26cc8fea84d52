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
//! Bounds (issue 18, DESIGN.md 6): no torn set ever; no pod's files expire while ZTS can issue
//! (the error faults last a quarter of the lifetime: renewal starts at 60–70 % of it, so that
//! is inside the margin every certificate has); after any fault every pod is healthy within the
//! bound. Under `zts-stopped` (SIGSTOP for three lifetimes) and `agent-node-cert-expired` ZTS is
//! unreachable for longer than certificates live, so files may expire; they must still recover
//! within the bound once ZTS is back. A fault that never met a renewal did not test anything
//! and fails.
//!
//! Faults in the stand-ins (ZTS errors, API and kubelet trouble) go through the faults file
//! they follow ([`athenz_testbed::faults`]); processes are signalled; the disk is really filled.

use crate::fleet::{Census, Fleet};
use crate::procs::Process;
use crate::stack::FAULTS_FILE;
use crate::stack::{Stack, StackOptions, VolumeKind};
use anyhow::{Context, bail};
use athenz_testbed::faults::Faults;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod runtime_faults;
mod set_reader;
use set_reader::{SetReader, leftovers};

/// How often the pods' sets are read and the stack supervised.
const TICK: Duration = Duration::from_millis(250);
/// The SIA's longest backoff between attempts (`athenz_core::refresh::Backoff::default().max`).
const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// One refresh round after the backoff: the bound on recovery.
const RECOVERY_BOUND: Duration = Duration::from_secs(BACKOFF_CAP.as_secs() + 15);

/// A fault `chaos` can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The jwt-service killed with SIGKILL five times over half a lifetime (restarted each time).
    JwtServiceKilled,
    /// The agent killed with SIGKILL five times over half a lifetime (restarted each time).
    AgentKilled,
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
pub const ALL_FAULTS: [Fault; 16] = [
    Fault::JwtServiceKilled,
    Fault::AgentKilled,
    Fault::Zts500,
    Fault::Zts503,
    Fault::CallbackDenying,
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

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Pods with the flex volume and a refresh sidecar.
    pub pods: usize,
    /// Pods with the CSI files-mode volume (the agent rotates their files).
    pub files_pods: usize,
    /// Certificate lifetime, minutes.
    pub lifetime_minutes: u32,
    /// The faults, in this order.
    pub faults: Vec<Fault>,
    /// Kills of the SIA mid-write.
    pub sia_kills: usize,
    /// Separately built component binaries to run instead of this one.
    pub components: Option<PathBuf>,
    /// Where the flex pods' keys are made.
    pub key_source: athenz_core::agent_api::KeySource,
    /// How pods' processes start (default: runc where installed and root).
    pub runtime: Option<athenz_testbed::runtime::RuntimeKind>,
}

/// One fault's row.
#[derive(Debug, Clone, Serialize)]
pub struct FaultResult {
    /// The fault.
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
    if options.pods == 0 || options.lifetime_minutes == 0 || options.faults.is_empty() {
        bail!("--pods, --lifetime-minutes and --faults must not be empty or zero");
    }
    let started = Instant::now();
    let mut stack = Stack::start(&StackOptions {
        components: options.components.clone(),
        // the agent serves CSI too, for the files-mode pods; the others use the flex volume
        volume: VolumeKind::CsiFiles,
        cert_expiry_minutes: Some(options.lifetime_minutes),
        fault_injection: true,
        key_source: options.key_source,
        runtime: options.runtime,
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
        flex: Fleet::start(stack, 0..options.pods, VolumeKind::Flex).await?,
        files: Fleet::start(
            stack,
            options.pods..options.pods + options.files_pods,
            VolumeKind::CsiFiles,
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
            Fault::ZtsStopped => zts_stopped(stack, &mut pods, lifetime).await?,
            Fault::AgentNodeCertExpired => {
                agent_node_cert_expired(stack, &mut pods, lifetime).await?
            }
            Fault::JwtServiceKilled => {
                killed(stack, &mut pods, "jwt-service", fault, lifetime / 2).await?
            }
            Fault::AgentKilled => killed(stack, &mut pods, "agent", fault, lifetime / 2).await?,
            Fault::Zts500 | Fault::Zts503 => {
                let status = if fault == Fault::Zts500 { 500 } else { 503 };
                let faults = Faults {
                    zts_instance_status: Some(status),
                    ..Faults::default()
                };
                let what = format!("ZTS answering {status}");
                inject(stack, &mut pods, injected(faults, quarter, &what)).await?
            }
            Fault::CallbackDenying => {
                let faults = Faults {
                    api_pods_missing: true,
                    ..Faults::default()
                };
                let what = "the API server answering 404 for every pod, so the callback denies";
                inject(stack, &mut pods, injected(faults, quarter, what)).await?
            }
            Fault::KubeletSlow => {
                let faults = Faults {
                    kubelet_delay_ms: 2000,
                    ..Faults::default()
                };
                let what = "the kubelet answering after 2 s";
                inject(stack, &mut pods, injected(faults, lifetime / 2, what)).await?
            }
            Fault::KubeletFailing => {
                let faults = Faults {
                    kubelet_failing: true,
                    ..Faults::default()
                };
                let what = "the kubelet answering 500";
                inject(stack, &mut pods, injected(faults, quarter, what)).await?
            }
            Fault::KubeletOmittingPods => {
                let faults = Faults {
                    kubelet_omit_pods: true,
                    ..Faults::default()
                };
                let what = "the kubelet listing no pods";
                inject(stack, &mut pods, injected(faults, quarter, what)).await?
            }
            Fault::DiskFull => disk_full(stack, &mut pods, lifetime).await?,
            Fault::SiaKilledMidWrite => {
                sia_killed_mid_write(stack, &pods, options.sia_kills).await?
            }
            Fault::InitContainerKilled => {
                runtime_faults::init_container_killed(stack, &mut pods, options.sia_kills / 10)
                    .await?
            }
            Fault::SidecarRestarted => runtime_faults::sidecars_restarted(stack, &mut pods).await?,
            Fault::ForeignVolume => runtime_faults::foreign_volume(stack, &mut pods).await?,
            Fault::HostProcess => runtime_faults::host_process(stack, &mut pods).await?,
        };
        results.push(result);
    }
    pods.flex.stop(stack).await?;
    pods.files.stop(stack).await?;
    Ok(results)
}

/// Every pod of the run: flex pods first, then files-mode pods (census indices run on).
struct Pods {
    flex: Fleet,
    files: Fleet,
}

impl Pods {
    fn census(&self) -> Census {
        let (mut all, files) = (self.flex.census(), self.files.census());
        let offset = self.flex.volumes.len();
        all.serials.extend(files.serials);
        all.lifetime_used.extend(files.lifetime_used);
        all.expired.extend(files.expired.iter().map(|i| i + offset));
        all.overdue.extend(files.overdue.iter().map(|i| i + offset));
        all.torn.extend(files.torn.iter().map(|i| i + offset));
        all.unreadable.extend(
            files
                .unreadable
                .into_iter()
                .map(|(i, why)| (i + offset, why)),
        );
        all
    }

    /// Renewals that failed so far: the sidecars' and the agent's files-mode ones, as their
    /// logs say.
    fn failed_renewals(&self, stack: &Stack) -> u64 {
        let count = |path: &Path, marker: &str| {
            std::fs::read_to_string(path)
                .map(|text| text.matches(marker).count() as u64)
                .unwrap_or(0)
        };
        let sidecars: u64 = self
            .flex
            .refreshers
            .iter()
            .map(|s| count(&s.process.log_path(), "refresh failed"))
            .sum();
        let agent = count(
            &stack.state_dir.join("logs").join("agent.log"),
            "re-issue failed",
        );
        sidecars + agent
    }
}

/// Restarts what exited, as kubelet would, and reads every set.
async fn supervise(stack: &mut Stack, pods: &mut Pods) -> anyhow::Result<Census> {
    stack.restart_exited()?;
    pods.flex.restart_exited_refreshers().await?;
    Ok(pods.census())
}

fn healthy(census: &Census) -> bool {
    census.all_healthy() && census.overdue.is_empty()
}

/// Waits until every pod is healthy (at most `limit`).
async fn settle(stack: &mut Stack, pods: &mut Pods, limit: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + limit;
    loop {
        let census = supervise(stack, pods).await?;
        if healthy(&census) {
            return Ok(());
        }
        if Instant::now() >= until {
            bail!("the pods did not all become healthy within {limit:?}: {census:?}");
        }
        tokio::time::sleep(TICK).await;
    }
}

/// What one window of reads saw.
#[derive(Default)]
struct Tally {
    affected: BTreeSet<usize>,
    expired: BTreeSet<usize>,
    torn: u64,
    /// Each pod's certificate serial at the first read, and the pods whose serial changed since
    /// (renewed).
    first_serials: Option<Vec<Option<String>>>,
    renewed: BTreeSet<usize>,
}

impl Tally {
    fn add(&mut self, census: &Census) {
        self.affected
            .extend(census.overdue.iter().chain(&census.expired));
        self.expired.extend(&census.expired);
        self.torn += census.torn.len() as u64;
        let first = self
            .first_serials
            .get_or_insert_with(|| census.serials.clone());
        for (i, (then, now)) in first.iter().zip(&census.serials).enumerate() {
            if now.is_some() && then != now {
                self.renewed.insert(i);
            }
        }
    }
}

/// Holds for `hold`, running `during` at each tick (it gets the time since the start).
async fn watch(
    stack: &mut Stack,
    pods: &mut Pods,
    tally: &mut Tally,
    hold: Duration,
    mut during: impl FnMut(&mut Stack, Duration) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < hold {
        during(stack, started.elapsed())?;
        tally.add(&supervise(stack, pods).await?);
        tokio::time::sleep(TICK).await;
    }
    Ok(())
}

/// From now until every pod is healthy and `also` holds (or twice the bound): the recovery
/// time.
async fn recover_when(
    stack: &mut Stack,
    pods: &mut Pods,
    tally: &mut Tally,
    mut also: impl AsyncFnMut() -> bool,
) -> anyhow::Result<Option<f64>> {
    let started = Instant::now();
    while started.elapsed() < RECOVERY_BOUND * 2 {
        let census = supervise(stack, pods).await?;
        tally.add(&census);
        if healthy(&census) && also().await {
            return Ok(Some(started.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(TICK).await;
    }
    Ok(None)
}

async fn recover(
    stack: &mut Stack,
    pods: &mut Pods,
    tally: &mut Tally,
) -> anyhow::Result<Option<f64>> {
    recover_when(stack, pods, tally, async || true).await
}

fn row(
    fault: Fault,
    detail: String,
    tally: &Tally,
    recovery: Option<f64>,
    expiry_allowed: bool,
) -> FaultResult {
    let bound = RECOVERY_BOUND.as_secs_f64();
    FaultResult {
        fault,
        detail,
        pods_affected: tally.affected.len(),
        pods_expired: tally.expired.len(),
        torn_sets: tally.torn,
        recovery_seconds: recovery,
        bound_seconds: bound,
        passed: tally.torn == 0
            && (expiry_allowed || tally.expired.is_empty())
            && recovery.is_some_and(|r| r <= bound),
    }
}

fn signal(stack: &Stack, component: &str, signal: Signal) -> anyhow::Result<()> {
    let pid = *stack
        .info
        .processes
        .get(component)
        .with_context(|| format!("no {component} in the stack"))?;
    let pid = i32::try_from(pid).context("a pid")?;
    kill(Pid::from_raw(pid), signal).with_context(|| format!("signalling {component}"))
}

/// What the renewals and sidecars did between two points of a fault.
struct Effects {
    failed_renewals: u64,
    sidecar_exits: u32,
}

impl Effects {
    fn now(stack: &Stack, pods: &Pods) -> Self {
        Self {
            failed_renewals: pods.failed_renewals(stack),
            sidecar_exits: pods.flex.sidecar_exits(),
        }
    }

    fn since(&self, stack: &Stack, pods: &Pods) -> Self {
        let now = Self::now(stack, pods);
        Self {
            failed_renewals: now.failed_renewals.saturating_sub(self.failed_renewals),
            sidecar_exits: now.sidecar_exits.saturating_sub(self.sidecar_exits),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} renewals failed, {} sidecar exits",
            self.failed_renewals, self.sidecar_exits
        )
    }
}

/// Where renewal starts: the SIA and the agent renew at 70 % of the lifetime less up to 10 %
/// of jitter (`RefreshPolicy::default()`).
const RENEWAL_STARTS: f64 = 0.6;

/// Waits until the pod next to renew enters its renewal window, so a fault put in force now
/// meets at least one renewal while it lasts (a quarter lifetime > the 10 % window) instead
/// of by chance — and at the harshest point for that pod: its retries must succeed in what is
/// left after the fault.
async fn align_with_a_renewal(stack: &mut Stack, pods: &mut Pods) -> anyhow::Result<()> {
    let started = Instant::now();
    let limit = Duration::from_secs(600);
    let next = |census: &Census| {
        census
            .lifetime_used
            .iter()
            .flatten()
            .copied()
            .filter(|used| *used < RENEWAL_STARTS)
            .fold(None, |best: Option<f64>, used| {
                Some(best.map_or(used, |b| b.max(used)))
            })
    };
    let Some(mut waiting_for) = next(&supervise(stack, pods).await?) else {
        return Ok(()); // every pod is already in its window
    };
    while started.elapsed() < limit {
        let census = supervise(stack, pods).await?;
        match next(&census) {
            // the pod crossed into its window (it no longer counts as before it)
            Some(used) if used < waiting_for => return Ok(()),
            Some(used) => waiting_for = used,
            None => return Ok(()),
        }
        tokio::time::sleep(TICK).await;
    }
    bail!("no pod reached its renewal window within {limit:?}")
}

/// A fault put in force through the faults file for `hold`.
struct Injection {
    fault: Fault,
    faults: Faults,
    hold: Duration,
    what: String,
}

/// Puts `injection` in force when a pod is about to renew, holds it, clears it (whatever
/// happened), and waits for recovery. An outage under which no renewal failed did not bite and
/// fails; under a slow kubelet renewals must happen and pass.
async fn inject(
    stack: &mut Stack,
    pods: &mut Pods,
    injection: Injection,
) -> anyhow::Result<FaultResult> {
    let file = stack.state_dir.join(FAULTS_FILE);
    align_with_a_renewal(stack, pods).await?;
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    injection.faults.write(&file)?;
    let held = watch(stack, pods, &mut tally, injection.hold, |_, _| Ok(())).await;
    Faults::default().write(&file)?;
    held?;
    let renewed_during = tally.renewed.len();
    let recovery = recover(stack, pods, &mut tally).await?;
    let effects = before.since(stack, pods);
    // an outage must make renewals fail; a slow kubelet must let them pass, slowly
    let bit = if injection.fault == Fault::KubeletSlow {
        renewed_during > 0 && effects.failed_renewals == 0
    } else {
        effects.failed_renewals > 0
    };
    let mut result = row(
        injection.fault,
        format!(
            "{} for {} s; {} renewed during it, {}{}",
            injection.what,
            injection.hold.as_secs(),
            renewed_during,
            effects.describe(),
            if bit {
                ""
            } else {
                " (the fault did not act as it must)"
            }
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= bit;
    Ok(result)
}

async fn zts_stopped(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    signal(stack, "zts", Signal::SIGSTOP)?;
    let held = watch(stack, pods, &mut tally, lifetime * 3, |_, _| Ok(())).await;
    // whatever happened, ZTS must run again
    signal(stack, "zts", Signal::SIGCONT)?;
    held?;
    let recovery = recover(stack, pods, &mut tally).await?;
    Ok(row(
        Fault::ZtsStopped,
        format!(
            "SIGSTOP for {} s; {}",
            (lifetime * 3).as_secs(),
            before.since(stack, pods).describe()
        ),
        &tally,
        recovery,
        true,
    ))
}

/// When the agent's node certificate expires, from its metric
/// `athenz_agent_node_certificate_expiry_seconds` (what an operator would alert on).
async fn node_cert_expiry(info: &crate::stack::StackInfo) -> anyhow::Result<time::OffsetDateTime> {
    let url = &info
        .nodes
        .first()
        .context("a stack without nodes")?
        .agent
        .metrics_url;
    let text = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("reading {url}"))?
        .text()
        .await?;
    let value = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.split_once(' ')?;
            name.ends_with("node_certificate_expiry_seconds")
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .with_context(|| format!("no node_certificate_expiry_seconds in {url}"))?;
    // a timestamp in whole seconds
    #[allow(clippy::cast_possible_truncation)]
    let seconds = value as i64;
    time::OffsetDateTime::from_unix_timestamp(seconds).context("the node certificate's expiry")
}

/// ZTS stopped until the agent's own certificate (its client identity to the jwt-service) has
/// expired: the agent cannot issue anything until ZTS is back and it registers anew. Recovery
/// needs the node certificate valid again as well as every pod healthy.
async fn agent_node_cert_expired(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    const PAST_EXPIRY: Duration = Duration::from_secs(5);
    let expires = node_cert_expiry(&stack.info).await?;
    let until_expiry =
        Duration::try_from(expires - time::OffsetDateTime::now_utc()).unwrap_or(Duration::ZERO);
    let hold = (until_expiry + PAST_EXPIRY).min(lifetime * 2);
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    signal(stack, "zts", Signal::SIGSTOP)?;
    let held = watch(stack, pods, &mut tally, hold, |_, _| Ok(())).await;
    let expired_while_stopped = match node_cert_expiry(&stack.info).await {
        Ok(at) => at <= time::OffsetDateTime::now_utc(),
        Err(_) => false,
    };
    signal(stack, "zts", Signal::SIGCONT)?;
    held?;
    let metrics_stack = stack.info.clone();
    let recovery = recover_when(stack, pods, &mut tally, async || {
        node_cert_valid(&metrics_stack).await
    })
    .await?;
    let mut result = row(
        Fault::AgentNodeCertExpired,
        format!(
            "ZTS stopped {} s; the node certificate {} while it was away; {}",
            hold.as_secs(),
            if expired_while_stopped {
                "expired"
            } else {
                "did NOT expire"
            },
            before.since(stack, pods).describe()
        ),
        &tally,
        recovery,
        true,
    );
    result.passed &= expired_while_stopped;
    Ok(result)
}

async fn node_cert_valid(info: &crate::stack::StackInfo) -> bool {
    node_cert_expiry(info)
        .await
        .is_ok_and(|at| at > time::OffsetDateTime::now_utc())
}

async fn killed(
    stack: &mut Stack,
    pods: &mut Pods,
    component: &'static str,
    fault: Fault,
    over: Duration,
) -> anyhow::Result<FaultResult> {
    const KILLS: u32 = 5;
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    let mut done = 0;
    let spacing = over / (KILLS + 1);
    watch(stack, pods, &mut tally, over, |stack, elapsed| {
        if done < KILLS && elapsed >= spacing * (done + 1) {
            // the stack's record of pids is refreshed by each restart
            stack.write_stack_json()?;
            signal(stack, component, Signal::SIGKILL)?;
            done += 1;
        }
        Ok(())
    })
    .await?;
    stack.write_stack_json()?;
    let recovery = recover(stack, pods, &mut tally).await?;
    Ok(row(
        fault,
        format!(
            "SIGKILL x{done} over {} s, restarted each time; {}",
            over.as_secs(),
            before.since(stack, pods).describe()
        ),
        &tally,
        recovery,
        false,
    ))
}

/// The tmpfs of the first files-mode pod's volume: `<volumes dir>/<id>/files`, found through
/// the operator's status report (which names each volume's pod).
fn files_tmpfs(stack: &Stack, pods: &Pods) -> anyhow::Result<PathBuf> {
    let volume = pods
        .files
        .volumes
        .first()
        .context("disk-full needs a files-mode pod (--files-pods)")?;
    let node = stack.info.nodes.first().context("a stack without nodes")?;
    let volumes = athenz_core::volume::VolumesDir::new(&node.volumes_dir);
    let report = athenz_identity_agent::status::report(&volumes, time::OffsetDateTime::now_utc())
        .context("reading the agent's volumes")?;
    let entry = report
        .volumes
        .iter()
        .find(|v| v.pod_uid == volume.uid)
        .with_context(|| format!("no volume of pod {} on the node", volume.pod.name))?;
    Ok(node.volumes_dir.join(&entry.id).join("files"))
}

/// Fills `dir`'s filesystem with `name` until it refuses more (ENOSPC); returns the bytes
/// written.
fn fill(dir: &Path, name: &str) -> anyhow::Result<u64> {
    use std::io::Write;
    let path = dir.join(name);
    let mut file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut written = 0u64;
    for chunk in [64 * 1024, 4096, 512, 1] {
        let block = vec![0u8; chunk];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => return Err(e).with_context(|| format!("filling {}", path.display())),
            }
        }
    }
    Ok(written)
}

/// A files-mode pod's tmpfs filled up until a rotation of its set failed (at most a
/// lifetime), then emptied: the set it had must stay whole and valid, nothing half-written may
/// be left, and the next rotation must pass.
async fn disk_full(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    const FILLER: &str = "chaos-filler";
    let tmpfs = files_tmpfs(stack, pods)?;
    let target = pods.files.volumes[0].credentials_dir().to_owned();
    let status_file = tmpfs.with_file_name("status.json");
    let before = Effects::now(stack, pods);
    let started = time::OffsetDateTime::now_utc();
    let mut tally = Tally::default();
    let filled = fill(&tmpfs, FILLER)?;
    // hold until the agent has met the full disk (its status records the failure) and a
    // little longer, at most a lifetime; remove the filler whatever happened
    let held_since = Instant::now();
    let mut met: Option<Duration> = None;
    let held: anyhow::Result<()> = async {
        while held_since.elapsed() < lifetime
            && met.is_none_or(|at| held_since.elapsed() < at + Duration::from_secs(2))
        {
            if met.is_none() && rotation_failed_since(&status_file, started) {
                met = Some(held_since.elapsed());
            }
            tally.add(&supervise(stack, pods).await?);
            tokio::time::sleep(TICK).await;
        }
        Ok(())
    }
    .await;
    std::fs::remove_file(tmpfs.join(FILLER)).context("removing the filler")?;
    held?;
    let recovery = recover(stack, pods, &mut tally).await?;
    let left = stale_entries(&target)?;
    let effects = before.since(stack, pods);
    let mut result = row(
        Fault::DiskFull,
        format!(
            "{filled} bytes filled its tmpfs; {}; {}; {}",
            match met {
                Some(at) => format!("a rotation failed {:.0} s in", at.as_secs_f64()),
                None => "no rotation met the full disk".to_owned(),
            },
            effects.describe(),
            if left.is_empty() {
                "nothing left behind".to_owned()
            } else {
                format!("left behind: {}", left.join(", "))
            }
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= met.is_some() && left.is_empty();
    Ok(result)
}

/// What a writer left in a files-mode volume beyond its set, its links and the one set before
/// it (kept for readers still on it): half-written (`tmp`) entries and older sets.
fn stale_entries(dir: &Path) -> anyhow::Result<Vec<String>> {
    let current = std::fs::read_link(dir.join("..data")).context("reading ..data")?;
    let mut older_sets = Vec::new();
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(dir).context("listing the volume")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name == "..data" || Path::new(&name) == current || !name.starts_with("..") {
            continue;
        }
        if name.contains("tmp") {
            stale.push(name);
        } else {
            older_sets.push(name);
        }
    }
    if older_sets.len() > 1 {
        stale.extend(older_sets);
    }
    Ok(stale)
}

/// Whether the volume's status record shows a failure after `since`.
fn rotation_failed_since(status_file: &Path, since: time::OffsetDateTime) -> bool {
    let Ok(text) = std::fs::read_to_string(status_file) else {
        return false;
    };
    let Ok(record) = serde_json::from_str::<athenz_core::volume::VolumeStatusRecord>(&text) else {
        return false;
    };
    record.last_error.is_some_and(|e| e.at > since)
}

/// `athenz-sia init` for the first pod, killed at a random point of its run `kills` times, with
/// a reader checking every set it reads; then one init that runs to the end, which must leave
/// nothing but the set in the directory.
async fn sia_killed_mid_write(
    stack: &mut Stack,
    pods: &Pods,
    kills: usize,
) -> anyhow::Result<FaultResult> {
    let volume = pods.flex.volumes[0]
        .sia()
        .context("the first pod runs no SIA")?
        .clone();
    let out = volume.credentials_dir.clone();
    let reader = SetReader::start(&out);
    let info = stack.info.clone();
    let mut argv = info.sia.clone();
    argv.push("init".into());
    let argv = crate::node::in_pod(&info, &volume.uid, &argv)?;
    let (program, args) = argv.split_first().context("an empty SIA argv")?;
    let logs = stack.state_dir.join("logs");
    // kill within the span of one whole init, measured now, so most kills land mid-run
    let span = crate::node::sia_init(&info, &volume)
        .await
        .context("a first init")?
        .process;
    let mut exited_first = 0;
    for _ in 0..kills {
        let mut command =
            crate::procs::Command::new("sia-init-killed", Path::new(program), args.to_vec());
        command.cwd = Some(volume.mount_dir.clone());
        command.env = crate::node::sia_env(&stack.info, &volume)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let mut sia = Process::start(command, &logs)?;
        let delay = span.mul_f64(athenz_core::random::unit());
        tokio::time::sleep(delay).await;
        let pid = i32::try_from(sia.pid()).context("a pid")?;
        if pid == 0 || sia.check_alive().is_err() {
            exited_first += 1;
        } else {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = sia.wait_exit(Duration::from_secs(5)).await;
    }
    // one init to the end: it removes what the killed ones left, keeping (by design) the set it
    // replaced, which a reader may still be reading
    let replaced = std::fs::read_link(out.join("..data")).ok();
    let finished = crate::node::sia_init(&info, &volume).await;
    let (reads, torn) = reader.stop();
    finished.context("the init after the kills")?;
    let leftovers = leftovers(&out, replaced.as_deref())?;
    let mut tally = Tally {
        torn,
        ..Tally::default()
    };
    let census = pods.census();
    tally.add(&census);
    let clean = leftovers.is_empty();
    let mut result = row(
        Fault::SiaKilledMidWrite,
        format!(
            "{kills} inits, {} killed mid-run, {exited_first} ended first; {reads} reads; {}",
            kills - exited_first,
            if clean {
                "nothing left behind".to_owned()
            } else {
                format!("left behind: {}", leftovers.join(", "))
            }
        ),
        &tally,
        Some(0.0),
        false,
    );
    result.passed &= clean && reads > 0;
    Ok(result)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_fault_passes_only_within_every_bound() {
        let clean = Tally::default();
        assert!(row(Fault::AgentKilled, String::new(), &clean, Some(3.0), false).passed);
        // too slow, or never
        assert!(!row(Fault::AgentKilled, String::new(), &clean, Some(76.0), false).passed);
        assert!(!row(Fault::AgentKilled, String::new(), &clean, None, false).passed);
        // a torn set fails any fault
        let torn = Tally {
            torn: 1,
            ..Tally::default()
        };
        assert!(!row(Fault::ZtsStopped, String::new(), &torn, Some(1.0), true).passed);
        // expiry fails a fault under which ZTS stayed reachable, not one under which it did not
        let mut expired = Tally::default();
        expired.add(&Census {
            expired: vec![2],
            overdue: vec![1],
            ..Census::default()
        });
        assert_eq!((expired.affected.len(), expired.expired.len()), (2, 1));
        assert!(
            !row(
                Fault::AgentKilled,
                String::new(),
                &expired,
                Some(1.0),
                false
            )
            .passed
        );
        assert!(row(Fault::ZtsStopped, String::new(), &expired, Some(1.0), true).passed);
    }

    #[test]
    fn leftovers_are_what_is_neither_the_set_nor_the_one_it_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["..2026_a", "..2026_b", "..2026_c"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink("..2026_c", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/service.key.pem", d.join("service.key.pem")).unwrap();
        std::fs::write(d.join("..data_tmp.1f"), b"").unwrap();
        let mut left = leftovers(d, Some(Path::new("..2026_b"))).unwrap();
        left.sort();
        assert_eq!(left, ["..2026_a", "..data_tmp.1f"]);
    }
}
