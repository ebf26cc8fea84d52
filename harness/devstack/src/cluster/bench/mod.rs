//! `cluster bench`: what an identity costs a pod on the real node, ours beside SPIRE's, in one
//! run. For each kind of pod (no identity, the same shape with nothing of ours, each of our
//! modes, SPIRE) the time from the pod's creation (just before the API server is asked) to its
//! app container holding a credential naming it: the app is a probe that prints the time it
//! held it (CLOCK_REALTIME: the bench's clock too, on one machine). Three phases: pods created
//! one per interval, a burst created at once, and a churn of creations and deletions at a
//! steady rate. Every phase measures every kind before the next phase starts, the systems
//! alternating, so both see the same node in the same state. Per kind also: the CPU of its
//! system's node and control-plane pods over its windows, its pods' own identity containers'
//! CPU and memory, the API requests its system caused, and its node agent's peak RSS.

mod arrivals;
mod costs;
pub mod flood;
mod init_wait;
mod kinds;
mod log_waits;
mod pods;
mod report;
mod room;
mod volume_wait;

use super::health::Checker;
use super::images::{self, ImageSpec};
use super::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use super::layout::Processes;
use super::scenario::Scenario;
use super::spire::{self, Spire};
use super::{ClusterInfo, Layout};
use crate::agent_upstreams;
use crate::bench::Latency;
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use costs::{AuditLog, Cgroups, CpuSource, SystemMeter};
use kinds::{Kind, PROBE_GO, PROBE_IMAGE, System};
pub use log_waits::LogWaits;
pub use pods::Churn;
use pods::{SERVICE_ACCOUNT, Workload};
pub use report::BenchReport;
use report::{ChurnShape, Idle, IdleRates, KindTotals};
use std::collections::BTreeMap;
use std::time::Duration;

/// The agent's ops port on its node (`OPS_LISTEN: $(NODE_IP):9190`, deploy/base/agent.yaml);
/// the agent runs on the host's network.
const AGENT_OPS_PORT: u16 = 9190;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    /// Pods created one per `interval`, per kind.
    pub sequential: usize,
    /// The time between two sequential pods.
    pub interval: Duration,
    /// Pods created at once, per kind.
    pub burst: usize,
    /// The churn phase.
    pub churn: Churn,
    /// Which identity systems to measure.
    pub systems: Systems,
    /// How far [`Kind::ALL`]'s order is rotated before the phases alternate it: a series of
    /// runs given 0, 1, 2, … puts each kind first, second, … in turn ([`in_turn`]).
    pub order_offset: usize,
}

/// The identity systems a bench measures, in one run on one node.
#[derive(Debug, Clone, Copy)]
pub struct Systems {
    /// Ours: every volume mode, and a pod of their shape without identity.
    pub athenz: bool,
    /// SPIRE (harness/peers/spire), its entries made this way.
    pub spire: Option<spire::Entries>,
}

/// A phase of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Pods created one per interval.
    Sequential,
    /// Pods created at once.
    Burst,
    /// Pods created and deleted at a steady rate.
    Churn,
}

impl Phase {
    /// In the order they run.
    pub const ALL: [Phase; 3] = [Phase::Sequential, Phase::Burst, Phase::Churn];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Sequential => "sequential",
            Phase::Burst => "burst",
            Phase::Churn => "churn",
        }
    }
}

/// The namespaces whose service accounts are a system's.
fn namespaces(system: System) -> &'static [&'static str] {
    match system {
        System::Athenz => &[NODE_NAMESPACE, CONTROL_NAMESPACE],
        System::Spire => &[spire::NAMESPACE],
    }
}

/// The workloads in the order phase `index` measures them: [`Kind::ALL`]'s rotated left by
/// `offset`, then reversed every other phase, so no system always runs right after another (the
/// node's state, the caches it left, fall on each in turn), and runs with different offsets
/// put each system at a different point of the node's life (the kubelet's loops drift against
/// the clock, so where they stand in a kind's minute can repeat from run to run at one offset).
fn in_turn<T>(workloads: &[T], index: usize, offset: usize) -> Vec<&T> {
    let mut order: Vec<&T> = workloads.iter().collect();
    if let Some(shift) = offset.checked_rem(order.len()) {
        order.rotate_left(shift);
    }
    if index % 2 == 1 {
        order.reverse();
    }
    order
}

/// Runs the bench on the running cluster of `layout`.
pub async fn run(
    layout: &Layout,
    info: &ClusterInfo,
    options: BenchOptions,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<BenchReport> {
    let zts = info.zts.as_ref().context("the cluster has no dev ZTS")?;
    prepare_probe(layout)?;
    let scenario = Scenario::new(layout, &zts.ca);
    let api = Checker::for_cluster(layout, info)?;
    let cgroups = Cgroups::host();
    let spire = match options.systems.spire {
        Some(entries) => Some(
            Spire::install(
                layout,
                scenario.kubectl(),
                &spire::default_bin_dir(),
                entries,
                report,
            )
            .await?,
        ),
        None => None,
    };
    let (allocatable, present) = room::capacity(scenario.kubectl())?;
    room::check(room::pods_at_once(&options), allocatable, present)?;
    let measured = |kind: &Kind| match kind.system() {
        Some(System::Spire) => options.systems.spire.is_some(),
        Some(System::Athenz) => options.systems.athenz,
        None => *kind == Kind::Bare || options.systems.athenz,
    };
    let mut workloads = Vec::new();
    for kind in Kind::ALL.into_iter().filter(measured) {
        let ns = format!("bench-{}", kind.name());
        scenario.ensure_namespace(&ns, kind.mode() == Some(VolumeMode::Flex))?;
        if kind.mode() == Some(VolumeMode::Flex) {
            // flex is the operator's choice (the template's allowedVolumes), made before the run
            scenario.allow_volume(VolumeMode::Flex, &ns)?;
        }
        scenario.ensure_service_account(&ns, SERVICE_ACCOUNT)?;
        let spiffe_id = match (&spire, kind) {
            (Some(spire), Kind::Spire) => Some((
                spire.register_workload(scenario.kubectl(), &ns, SERVICE_ACCOUNT)?,
                spire.entries(),
            )),
            _ => None,
        };
        let prototype = kind.pod(
            &scenario,
            &ns,
            "prototype",
            SERVICE_ACCOUNT,
            spiffe_id
                .as_ref()
                .map(|(id, entries)| (id.as_str(), *entries)),
        )?;
        workloads.push(Workload {
            scenario: &scenario,
            api: &api,
            cgroups: &cgroups,
            kind,
            ns,
            prototype,
        });
    }
    // every kind's first pod, not measured: SPIRE's agent syncs its new entry (its best case is
    // an SVID cached before the pods come), ours opens its connections
    for workload in &workloads {
        let warm = workload
            .run(Phase::Sequential, 1, Duration::ZERO, options.churn)
            .await
            .with_context(|| format!("{}, the warm-up pod", workload.kind.name()))?;
        report(format!(
            "{:<16} warm-up pod: {:.1} s",
            workload.kind.name(),
            warm.times.first().map_or(0.0, Duration::as_secs_f64)
        ));
    }
    let meters = system_meters(layout, &api, options.systems).await?;
    let audit = AuditLog::at(layout.logs.join(super::control_plane::AUDIT_LOG));
    let idle = idle_rates(&meters, &cgroups, &audit).await?;
    let kubernetes = kubernetes_meter(layout)?;
    let mut totals: BTreeMap<Kind, KindTotals> = BTreeMap::new();
    let agent_metrics = format!("http://{}:{AGENT_OPS_PORT}/metrics", info.node_ip);
    let mut agent_upstreams: BTreeMap<String, BTreeMap<String, _>> = BTreeMap::new();
    // the kinds in the order each phase measured them, as they ran
    let mut kind_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (index, phase) in Phase::ALL.into_iter().enumerate() {
        let count = match phase {
            Phase::Sequential => options.sequential,
            Phase::Burst => options.burst,
            Phase::Churn => 0,
        };
        if count == 0 && (phase != Phase::Churn || options.churn.duration.is_zero()) {
            continue;
        }
        let order = in_turn(&workloads, index, options.order_offset);
        kind_order.insert(
            phase.name().to_owned(),
            order.iter().map(|w| w.kind.name().to_owned()).collect(),
        );
        for workload in order {
            let meter = workload.kind.system().and_then(|s| meters.get(&s));
            let ours = workload.kind.system() == Some(System::Athenz);
            let agent_before = if ours {
                Some(agent_upstreams::scrape(&agent_metrics).await?)
            } else {
                None
            };
            let before = meter.map(|m| m.snapshot(&cgroups)).transpose()?;
            let kubernetes_before = kubernetes.snapshot(&cgroups)?;
            let from = audit.end();
            let started = std::time::Instant::now();
            let outcome = workload
                .run(phase, count, options.interval, options.churn)
                .await
                .with_context(|| format!("{}, {}", workload.kind.name(), phase.name()))?;
            let to = audit.end();
            if let Some(agent_before) = agent_before {
                let steps = agent_upstreams::scrape(&agent_metrics)
                    .await?
                    .since(&agent_before);
                agent_upstreams
                    .entry(workload.kind.name().to_owned())
                    .or_default()
                    .insert(phase.name().to_owned(), steps);
            }
            let kind_totals = totals.entry(workload.kind).or_default();
            kind_totals
                .kubernetes
                .add(&kubernetes.snapshot(&cgroups)?.since(&kubernetes_before));
            if let (Some(meter), Some(before), Some(system)) =
                (meter, before, workload.kind.system())
            {
                kind_totals
                    .cpu
                    .add(&meter.snapshot(&cgroups)?.since(&before));
                kind_totals.api_requests += audit.count(from, to, namespaces(system))?;
                kind_totals.window_seconds += started.elapsed().as_secs_f64();
            }
            let latency = Latency::of(&mut outcome.times.clone());
            let final_latency = Latency::of(&mut outcome.final_times.clone());
            report(format!(
                "{:<16} {:<10} {:>3} pods: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms; final p50 \
                 {:.0} ms, p99 {:.0} ms",
                workload.kind.name(),
                phase.name(),
                outcome.times.len(),
                latency.p50,
                latency.p90,
                latency.p99,
                final_latency.p50,
                final_latency.p99
            ));
            kind_totals.shares.extend(outcome.shares);
            kind_totals.times.insert(phase, outcome.times);
            kind_totals.final_times.insert(phase, outcome.final_times);
        }
    }
    let peak_rss = |system: System| {
        let name = match system {
            System::Athenz => "athenz-identity-agent",
            System::Spire => "spire-agent",
        };
        // the largest of every node's (one agent per node)
        crate::procs::pids_named(name)
            .into_iter()
            .map(|pid| crate::procs::Usage::of(pid).peak_rss_kib as f64 / 1024.0)
            .reduce(f64::max)
            .with_context(|| format!("no {name} process on any node"))
    };
    let mut systems = BTreeMap::new();
    for (kind, kind_totals) in &totals {
        if let (Some(key), Some(system)) = (kind.system_key(), kind.system()) {
            systems.insert(
                key.to_owned(),
                kind_totals.system_report(
                    *kind,
                    peak_rss(system)?,
                    idle.get(&system).copied().unwrap_or_default(),
                ),
            );
        }
    }
    let namespaces: Vec<(Kind, String)> =
        workloads.iter().map(|w| (w.kind, w.ns.clone())).collect();
    let LogWaits {
        volume_waits,
        init_waits,
    } = LogWaits::read(&layout.logs, &namespaces)?;
    Ok(BenchReport {
        kubernetes_version: info.kubernetes_version.clone(),
        sequential_pods: options.sequential,
        sequential_interval_ms: options.interval.as_secs_f64() * 1e3,
        burst_pods: options.burst,
        order_offset: options.order_offset,
        kind_order,
        churn: ChurnShape {
            seconds: options.churn.duration.as_secs_f64(),
            interval_ms: options.churn.interval.as_secs_f64() * 1e3,
            lifetime_ms: options.churn.lifetime.as_secs_f64() * 1e3,
        },
        baseline_pod_start_ms: totals
            .get(&Kind::Bare)
            .map(KindTotals::latencies)
            .unwrap_or_default(),
        start_ms: totals
            .iter()
            .map(|(kind, t)| (kind.name().to_owned(), t.latencies()))
            .collect(),
        same_shape_per_pod_cpu_ms: totals.get(&Kind::SameShape).map(KindTotals::per_pod_cpu_ms),
        baseline_kubernetes_cpu_ms_per_pod: totals
            .get(&Kind::Bare)
            .map(KindTotals::kubernetes_ms_per_pod)
            .unwrap_or_default(),
        systems,
        spire_config: options.systems.spire.map(spire::config),
        volume_waits,
        init_waits,
        agent_upstream_ms: agent_upstreams,
        dev_zts_build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    })
}

/// Builds the probe's image and imports it and the app's into the node.
fn prepare_probe(layout: &Layout) -> anyhow::Result<()> {
    let probe = images::compile_go_static(&layout.images.join("probe"), "probe", PROBE_GO)?;
    let archive = images::build_once(
        &layout.images,
        &ImageSpec {
            name: PROBE_IMAGE.to_owned(),
            files: vec![(probe, "/probe".to_owned())],
            entrypoint: vec!["/probe".to_owned()],
        },
    )?;
    images::import(layout, &archive)?;
    Scenario::import_app_image(layout)
}

/// How long each system's idle CPU is measured, with no measured pod on the node.
const IDLE_WINDOW: Duration = Duration::from_secs(30);

/// Each system's CPU and API requests over [`IDLE_WINDOW`] with nothing to do.
async fn idle_rates(
    meters: &BTreeMap<System, SystemMeter>,
    cgroups: &Cgroups,
    audit: &AuditLog,
) -> anyhow::Result<BTreeMap<System, Idle>> {
    let mut before = BTreeMap::new();
    for (system, meter) in meters {
        before.insert(*system, meter.snapshot(cgroups)?);
    }
    let from = audit.end();
    tokio::time::sleep(IDLE_WINDOW).await;
    let to = audit.end();
    let mut rates = BTreeMap::new();
    for (system, meter) in meters {
        let used = meter.snapshot(cgroups)?.since(&before[system]);
        let per_s = |parts: &BTreeMap<String, f64>| {
            parts.values().sum::<f64>() * 1e3 / IDLE_WINDOW.as_secs_f64()
        };
        let requests = audit.count(from, to, namespaces(*system))?;
        rates.insert(
            *system,
            Idle {
                cpu_ms_per_s: IdleRates {
                    node: per_s(&used.node),
                    control_plane: per_s(&used.control),
                },
                api_requests_per_s: requests as f64 / IDLE_WINDOW.as_secs_f64(),
            },
        );
    }
    Ok(rates)
}

/// The API server and etcd, host processes here: measured in every kind's windows, the
/// baseline's too, so what a system adds to them shows beside what any pod costs them.
fn kubernetes_meter(layout: &Layout) -> anyhow::Result<SystemMeter> {
    let processes = Processes::read(&layout.processes_json)
        .context("reading processes.json for the API server and etcd")?;
    let mut meter = SystemMeter::default();
    for name in [super::components::APISERVER, super::components::ETCD] {
        let process = processes
            .components
            .get(name)
            .with_context(|| format!("processes.json names no {name}"))?;
        meter
            .control
            .push((name.to_owned(), CpuSource::Process(process.pid)));
    }
    Ok(meter)
}

/// Each measured system's long-running parts: its namespaces' pods, and for ours the dev ZTS
/// process (the share a real ZTS would carry).
async fn system_meters(
    layout: &Layout,
    api: &Checker,
    systems: Systems,
) -> anyhow::Result<BTreeMap<System, SystemMeter>> {
    let mut meters = BTreeMap::new();
    let chosen = [
        (System::Athenz, systems.athenz),
        (System::Spire, systems.spire.is_some()),
    ];
    for (system, _) in chosen.into_iter().filter(|(_, on)| *on) {
        let mut lists = Vec::new();
        for ns in namespaces(system) {
            lists.push(
                api.api_json(&format!("/api/v1/namespaces/{ns}/pods"))
                    .await
                    .with_context(|| format!("listing the pods of {ns}"))?,
            );
        }
        let mut meter = SystemMeter::from_pod_lists(&lists)?;
        if system == System::Athenz {
            let zts = Processes::read(&layout.processes_json)
                .and_then(|p| p.components.get(super::install::ZTS).copied())
                .context("processes.json names no dev ZTS")?;
            meter
                .control
                .push((costs::DEV_ZTS.to_owned(), CpuSource::Process(zts.pid)));
        }
        meters.insert(system, meter);
    }
    Ok(meters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_other_phase_measures_the_kinds_the_other_way_round() {
        let kinds = Kind::ALL;
        let first: Vec<&str> = in_turn(&kinds, 0, 0).iter().map(|k| k.name()).collect();
        let second: Vec<&str> = in_turn(&kinds, 1, 0).iter().map(|k| k.name()).collect();
        let third: Vec<&str> = in_turn(&kinds, 2, 0).iter().map(|k| k.name()).collect();
        assert_eq!(first[..3], ["none", "csi-files", "spire"]);
        assert_eq!(second[3..], ["spire", "csi-files", "none"]);
        assert_eq!(first, third);
        // ours in files mode and SPIRE swap places from one phase to the next
        let at = |order: &[&str], name| order.iter().position(|n| *n == name);
        assert!(at(&first, "csi-files") < at(&first, "spire"));
        assert!(at(&second, "csi-files") > at(&second, "spire"));
    }

    #[test]
    fn an_order_offset_puts_each_kind_first_in_turn() {
        let kinds = Kind::ALL;
        let firsts: Vec<&str> = (0..kinds.len())
            .map(|offset| in_turn(&kinds, 0, offset)[0].name())
            .collect();
        let all: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        assert_eq!(firsts, all);
        // the offset wraps, and the phases still alternate around it
        let wrapped: Vec<&str> = in_turn(&kinds, 0, kinds.len() + 1)
            .iter()
            .map(|k| k.name())
            .collect();
        assert_eq!(wrapped[..2], ["csi-files", "spire"]);
        let reversed: Vec<&str> = in_turn(&kinds, 1, 1).iter().map(|k| k.name()).collect();
        assert_eq!(reversed[4..], ["spire", "csi-files"]);
        assert!(in_turn::<Kind>(&[], 0, 3).is_empty());
    }
}
