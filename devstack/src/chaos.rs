//! `athenz-devstack chaos`: one fault at a time against a running stack whose pods renew
//! one-minute certificates, and what each did to the pods.
//!
//! For every fault: wait until every pod holds a healthy set; inject the fault and hold it; clear
//! it; wait until every pod is healthy again. Meanwhile the stack is supervised as kubelet would
//! supervise it (a daemon or sidecar that exits is restarted) and every pod's set is read four
//! times a second, as an application reads it. Per fault it reports the pods affected (a refresh
//! overdue or a certificate expired), the pods whose files expired, torn sets seen, and the
//! recovery time against the bound: the SIA's longest backoff (60 s) plus one refresh round.
//!
//! Bounds (issue 18, DESIGN.md 6): no torn set ever; no pod's files expire while ZTS is
//! reachable; after any fault every pod is healthy within the bound. `zts-stopped` (SIGSTOP for
//! three lifetimes: ZTS unreachable longer than a certificate lives) is the one fault under which
//! files may expire; it must still recover within the bound once ZTS is back.

use crate::fleet::{Census, Fleet};
use crate::procs::Process;
use crate::stack::{Stack, StackOptions, VolumeKind};
use anyhow::{Context, bail};
use athenz_core::files::{CERT_FILE, FileSet, KEY_FILE};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    /// ZTS frozen with SIGSTOP for three certificate lifetimes, then SIGCONT.
    ZtsStopped,
    /// The jwt-service killed with SIGKILL five times over a lifetime (restarted each time).
    JwtServiceKilled,
    /// The agent killed with SIGKILL five times over a lifetime (restarted each time).
    AgentKilled,
    /// `athenz-sia init` killed with SIGKILL at a random point of its run, `--sia-kills` times,
    /// while a reader checks every set it can read.
    SiaKilledMidWrite,
}

/// Every fault, in the order they run.
pub const ALL_FAULTS: [Fault; 4] = [
    Fault::JwtServiceKilled,
    Fault::AgentKilled,
    Fault::SiaKilledMidWrite,
    Fault::ZtsStopped,
];

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Pods.
    pub pods: usize,
    /// Certificate lifetime, minutes.
    pub lifetime_minutes: u32,
    /// The faults, in this order.
    pub faults: Vec<Fault>,
    /// Kills of the SIA mid-write.
    pub sia_kills: usize,
    /// Separately built component binaries to run instead of this one.
    pub components: Option<PathBuf>,
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
    /// Pods.
    pub pods: usize,
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
        volume: VolumeKind::Flex,
        cert_expiry_minutes: Some(options.lifetime_minutes),
        ..StackOptions::new(state_dir.to_owned(), "p256")
    })
    .await?;
    let result = faults(&mut stack, options).await;
    stack.stop().await;
    let faults = result?;
    Ok(ChaosReport {
        pods: options.pods,
        lifetime_seconds: u64::from(options.lifetime_minutes) * 60,
        passed: faults.iter().all(|f| f.passed),
        faults,
        seconds: started.elapsed().as_secs(),
    })
}

async fn faults(stack: &mut Stack, options: &ChaosOptions) -> anyhow::Result<Vec<FaultResult>> {
    let lifetime = Duration::from_secs(u64::from(options.lifetime_minutes) * 60);
    let mut fleet = Fleet::start(stack, options.pods, VolumeKind::Flex).await?;
    let mut results = Vec::new();
    for &fault in &options.faults {
        settle(stack, &mut fleet, lifetime * 3)
            .await
            .with_context(|| format!("before {fault:?}"))?;
        let result = match fault {
            Fault::ZtsStopped => zts_stopped(stack, &mut fleet, lifetime).await?,
            Fault::JwtServiceKilled => {
                killed(stack, &mut fleet, "jwt-service", fault, lifetime).await?
            }
            Fault::AgentKilled => killed(stack, &mut fleet, "agent", fault, lifetime).await?,
            Fault::SiaKilledMidWrite => {
                sia_killed_mid_write(stack, &fleet, options.sia_kills).await?
            }
        };
        results.push(result);
    }
    fleet.stop(stack).await?;
    Ok(results)
}

/// Restarts what exited, as kubelet would, and reads every set.
fn supervise(stack: &mut Stack, fleet: &mut Fleet) -> anyhow::Result<Census> {
    stack.restart_exited()?;
    fleet.restart_exited_refreshers()?;
    Ok(fleet.census())
}

fn healthy(census: &Census) -> bool {
    census.all_healthy() && census.overdue.is_empty()
}

/// Waits until every pod is healthy (at most `limit`).
async fn settle(stack: &mut Stack, fleet: &mut Fleet, limit: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + limit;
    loop {
        let census = supervise(stack, fleet)?;
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
}

impl Tally {
    fn add(&mut self, census: &Census) {
        self.affected
            .extend(census.overdue.iter().chain(&census.expired));
        self.expired.extend(&census.expired);
        self.torn += census.torn.len() as u64;
    }
}

/// Holds for `hold`, running `during` at each tick (it gets the time since the start).
async fn watch(
    stack: &mut Stack,
    fleet: &mut Fleet,
    tally: &mut Tally,
    hold: Duration,
    mut during: impl FnMut(&mut Stack, Duration) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < hold {
        during(stack, started.elapsed())?;
        tally.add(&supervise(stack, fleet)?);
        tokio::time::sleep(TICK).await;
    }
    Ok(())
}

/// From now until every pod is healthy (or twice the bound): the recovery time.
async fn recover(
    stack: &mut Stack,
    fleet: &mut Fleet,
    tally: &mut Tally,
) -> anyhow::Result<Option<f64>> {
    let started = Instant::now();
    while started.elapsed() < RECOVERY_BOUND * 2 {
        let census = supervise(stack, fleet)?;
        tally.add(&census);
        if healthy(&census) {
            return Ok(Some(started.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(TICK).await;
    }
    Ok(None)
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

async fn zts_stopped(
    stack: &mut Stack,
    fleet: &mut Fleet,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    let mut tally = Tally::default();
    signal(stack, "zts", Signal::SIGSTOP)?;
    let held = watch(stack, fleet, &mut tally, lifetime * 3, |_, _| Ok(())).await;
    // whatever happened, ZTS must run again
    signal(stack, "zts", Signal::SIGCONT)?;
    held?;
    let recovery = recover(stack, fleet, &mut tally).await?;
    Ok(row(
        Fault::ZtsStopped,
        format!("SIGSTOP for {} s", (lifetime * 3).as_secs()),
        &tally,
        recovery,
        true,
    ))
}

async fn killed(
    stack: &mut Stack,
    fleet: &mut Fleet,
    component: &'static str,
    fault: Fault,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    const KILLS: u32 = 5;
    let mut tally = Tally::default();
    let mut done = 0;
    let spacing = lifetime / (KILLS + 1);
    watch(stack, fleet, &mut tally, lifetime, |stack, elapsed| {
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
    let recovery = recover(stack, fleet, &mut tally).await?;
    Ok(row(
        fault,
        format!("SIGKILL x{done}, restarted each time"),
        &tally,
        recovery,
        false,
    ))
}

/// `athenz-sia init` for the first pod, killed at a random point of its run `kills` times, with
/// a reader checking every set it reads; then one init that runs to the end, which must leave
/// nothing but the set in the directory.
async fn sia_killed_mid_write(
    stack: &mut Stack,
    fleet: &Fleet,
    kills: usize,
) -> anyhow::Result<FaultResult> {
    let volume = fleet.volumes[0]
        .sia()
        .context("the first pod runs no SIA")?
        .clone();
    let out = volume.credentials_dir.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, torn) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (stop, reads, torn, out) = (stop.clone(), reads.clone(), torn.clone(), out.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(set) = FileSet::new(&out).read(&[KEY_FILE, CERT_FILE]) {
                    reads.fetch_add(1, Ordering::Relaxed);
                    if !set_matches(&set[0], &set[1]) {
                        torn.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
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
        command.env = crate::node::sia_env(&volume)
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
    stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
    finished.context("the init after the kills")?;
    let leftovers = leftovers(&out, replaced.as_deref())?;
    let (reads, torn) = (reads.load(Ordering::Relaxed), torn.load(Ordering::Relaxed));
    let mut tally = Tally {
        torn,
        ..Tally::default()
    };
    let census = fleet.census();
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

fn set_matches(key: &[u8], cert: &[u8]) -> bool {
    let (Ok(info), Ok(key)) = (
        athenz_core::crypto::CertInfo::from_pem(&String::from_utf8_lossy(cert)),
        athenz_core::crypto::PrivateKey::from_pem(&String::from_utf8_lossy(key)),
    ) else {
        return false;
    };
    athenz_core::crypto::key_matches_cert(&key, &info)
}

/// Entries of the credentials dir other than the set, its links and the set it replaced.
fn leftovers(out: &Path, replaced: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let current = std::fs::read_link(out.join("..data")).context("reading ..data")?;
    let mut extra = Vec::new();
    for entry in std::fs::read_dir(out).context("listing the credentials dir")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let kept = name == "..data"
            || Path::new(&name) == current
            || Some(Path::new(&name)) == replaced
            || !name.starts_with("..");
        if !kept {
            extra.push(name);
        }
    }
    Ok(extra)
}

/// The table of the closing note: one line per fault.
pub fn print_human(report: &ChaosReport) {
    println!(
        "chaos: {} pods, certificates of {} s, {} s",
        report.pods, report.lifetime_seconds, report.seconds
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
