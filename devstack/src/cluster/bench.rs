//! `cluster bench`: what an identity adds to a pod's start on the real node. For each mode and
//! for a pod with no identity (the kubelet's and containerd's own cost, in the same run), the
//! time from the pod's creation (just before the API server is asked) to its app container
//! holding a complete certificate: the app is a static probe that waits for
//! `/var/run/athenz/service.cert.pem` and prints the time it read it (CLOCK_REALTIME: the same
//! clock as ours, on one machine). Two phases per mode: pods created one per interval, then a
//! burst created at once. Also the agent's peak RSS and its CPU per identity.

use super::health::Checker;
use super::images::{self, ImageSpec};
use super::scenario::{CREDENTIALS, Mode, Scenario};
use super::spire::{self, Spire};
use super::{ClusterInfo, Layout};
use crate::procs::Usage;
use anyhow::{Context, bail};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

/// The probe: waits for a complete certificate in its argument's file (none: starts at once),
/// prints `ready <unix ns>`, then waits for SIGTERM.
const PROBE_C: &str = r#"#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static int complete(const char *path) {
  static char buf[16384];
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  return strncmp(buf, "-----BEGIN CERTIFICATE-----", 27) == 0 &&
         strstr(buf, "-----END CERTIFICATE-----") != NULL;
}

int main(int argc, char **argv) {
  signal(SIGTERM, stop);
  if (argc > 1) {
    while (!complete(argv[1])) usleep(1000);
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  printf("ready %lld%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
  fflush(stdout);
  for (;;) pause();
}
"#;
/// The probe's image.
pub const PROBE_IMAGE: &str = "localhost/athenz-devstack/probe:1";
/// How long one pod may take to read its certificate before the bench gives up.
const POD_LIMIT: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    /// Pods created one per `interval`, per mode.
    pub sequential: usize,
    /// The time between two sequential pods.
    pub interval: Duration,
    /// Pods created at once, per mode.
    pub burst: usize,
    /// Which identity systems to measure.
    pub systems: Systems,
}

/// The identity systems a bench measures, in one run on one node.
#[derive(Debug, Clone, Copy)]
pub struct Systems {
    /// Ours: every volume mode, beside pods without identity.
    pub athenz: bool,
    /// SPIRE (tests/spire), installed after ours.
    pub spire: bool,
}

/// p50, p90, p99 of one phase, milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// `{p50, p99}` of an overhead, milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Overhead {
    /// Median with identity minus median without.
    pub p50: f64,
    /// 99th percentile with identity minus 99th without.
    pub p99: f64,
}

/// The JSON `cluster bench` prints.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Kubernetes version of the node.
    pub kubernetes_version: String,
    /// Pods per phase.
    pub sequential_pods: usize,
    /// Pods in the burst.
    pub burst_pods: usize,
    /// Created → app read its certificate (no identity: → app started), by mode:
    /// `none`, `flex`, `csi-socket`, `csi-files`, each `{sequential, burst}`.
    pub start_ms: BTreeMap<String, BTreeMap<String, Percentiles>>,
    /// Start with identity minus without, sequential phase, by mode.
    pub overhead_ms: BTreeMap<String, Overhead>,
    /// The same for the burst.
    pub burst_overhead_ms: BTreeMap<String, Overhead>,
    /// Flex and csi-socket minus `none-same-shape` (sequential): what our init container and
    /// sidecar add beyond what the kubelet charges any pod of that shape.
    pub own_share_ms: BTreeMap<String, Overhead>,
    /// The agent's peak resident set over the run, MiB.
    pub agent_peak_rss_mib: f64,
    /// The agent's CPU time per pod, by mode, milliseconds (its whole process: the node
    /// identity's renewals are in it too).
    pub agent_cpu_ms_per_identity: BTreeMap<String, f64>,
    /// SPIRE on the same node, when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spire: Option<SpireReport>,
}

/// SPIRE's figures from the same run.
#[derive(Debug, Clone, Serialize)]
pub struct SpireReport {
    /// spire-agent's peak resident set over its life, MiB.
    pub agent_peak_rss_mib: f64,
    /// spire-agent's and the SPIFFE CSI driver's CPU per SVID delivered, milliseconds.
    pub node_cpu_ms_per_credential: f64,
    /// Created → the app's first verified Workload API fetch, `{sequential, burst}`.
    pub time_to_credential_ms: BTreeMap<String, Percentiles>,
}

/// What a measured pod is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The app alone, no identity: the kubelet's and containerd's own cost.
    Bare,
    /// No identity, but the shape the webhook gives flex and csi-socket pods: an init container
    /// (here one that exits at once) and a native sidecar (one that sleeps): what the kubelet
    /// charges for that shape, whoever fills it.
    SameShape,
    /// An identity in this mode.
    Identity(Mode),
    /// A SPIRE SVID through the SPIFFE CSI driver's Workload API socket.
    Spire,
}

/// The kinds measured, in order.
const KINDS: [Kind; 5] = [
    Kind::Bare,
    Kind::SameShape,
    Kind::Identity(Mode::Flex),
    Kind::Identity(Mode::CsiSocket),
    Kind::Identity(Mode::CsiFiles),
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bare => "none",
            Kind::SameShape => "none-same-shape",
            Kind::Identity(Mode::Flex) => "flex",
            Kind::Identity(Mode::CsiSocket) => "csi-socket",
            Kind::Identity(Mode::CsiFiles) => "csi-files",
            Kind::Spire => "spire",
        }
    }

    fn mode(self) -> Option<Mode> {
        match self {
            Kind::Identity(mode) => Some(mode),
            _ => None,
        }
    }
}

/// Runs the bench on the running cluster of `layout`.
pub async fn run(
    layout: &Layout,
    info: &ClusterInfo,
    options: BenchOptions,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<BenchReport> {
    let zts = info.zts.as_ref().context("the cluster has no dev ZTS")?;
    let probe = images::compile_static(&layout.images.join("probe"), "probe", PROBE_C)?;
    let archive = images::build_once(
        &layout.images,
        &ImageSpec {
            name: PROBE_IMAGE.to_owned(),
            files: vec![(probe, "/probe".to_owned())],
            entrypoint: vec!["/probe".to_owned()],
        },
    )?;
    images::import(layout, &archive)?;
    let scenario = Scenario::new(layout, &zts.ca);
    let api = Checker::for_cluster(layout, info)?;
    let agent = crate::procs::pid_named("athenz-identity-agent")
        .context("no athenz-identity-agent process on this node")?;
    let mut start_ms = BTreeMap::new();
    let mut cpu = BTreeMap::new();
    Scenario::import_app_image(layout)?;
    let kinds: &[Kind] = if options.systems.athenz { &KINDS } else { &[] };
    for &kind in kinds {
        let name = kind.name();
        let mode = kind.mode();
        let ns = format!("bench-{name}");
        scenario.ensure_namespace(&ns, mode == Some(Mode::Flex))?;
        scenario.kubectl().apply_manifest(
            &format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: probe, namespace: {ns}}}\n"
            ),
            &format!("service account {ns}/probe"),
        )?;
        let cpu_before = Usage::of(agent).cpu_seconds;
        let mut phases = BTreeMap::new();
        for (phase, count) in [("sequential", options.sequential), ("burst", options.burst)] {
            let times = phase_times(
                &scenario,
                &api,
                &ns,
                kind,
                None,
                phase,
                count,
                options.interval,
            )
            .await
            .with_context(|| format!("{name}, {phase}"))?;
            let p = percentiles(times);
            report(format!(
                "{name:<10} {phase:<10} {count:>3} pods: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms",
                p.p50, p.p90, p.p99
            ));
            phases.insert(phase.to_owned(), p);
            delete_all(&scenario, &ns)?;
        }
        if mode.is_some() {
            let pods = (options.sequential + options.burst).max(1) as f64;
            cpu.insert(
                name.to_owned(),
                (Usage::of(agent).cpu_seconds - cpu_before) * 1e3 / pods,
            );
        }
        start_ms.insert(name.to_owned(), phases);
    }
    // each of `kinds` minus `base` in `phase`; nothing when ours was not measured
    let minus = |base: &str, kinds: &[Kind], phase: &str| -> BTreeMap<String, Overhead> {
        let Some(base) = start_ms.get(base).map(|phases| phases[phase]) else {
            return BTreeMap::new();
        };
        kinds
            .iter()
            .map(|k| {
                let with = start_ms[k.name()][phase];
                let overhead = Overhead {
                    p50: with.p50 - base.p50,
                    p99: with.p99 - base.p99,
                };
                (k.name().to_owned(), overhead)
            })
            .collect()
    };
    let spire = if options.systems.spire {
        Some(spire_phases(layout, &scenario, &api, options, report).await?)
    } else {
        None
    };
    let identities: Vec<Kind> = KINDS.into_iter().filter(|k| k.mode().is_some()).collect();
    let overhead = |phase: &str| minus("none", &identities, phase);
    let own_share = minus(
        "none-same-shape",
        &[Kind::Identity(Mode::Flex), Kind::Identity(Mode::CsiSocket)],
        "sequential",
    );
    Ok(BenchReport {
        kubernetes_version: info.kubernetes_version.clone(),
        sequential_pods: options.sequential,
        burst_pods: options.burst,
        overhead_ms: overhead("sequential"),
        burst_overhead_ms: overhead("burst"),
        own_share_ms: own_share,
        start_ms,
        agent_peak_rss_mib: Usage::of(agent).peak_rss_kib as f64 / 1024.0,
        agent_cpu_ms_per_identity: cpu,
        spire,
    })
}

/// Installs SPIRE, registers the bench's service account, and runs both phases with SPIRE
/// pods: created → the probe's first verified SVID.
async fn spire_phases(
    layout: &Layout,
    scenario: &Scenario,
    api: &Checker,
    options: BenchOptions,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<SpireReport> {
    let installed = Spire::install(
        layout,
        scenario.kubectl(),
        &spire::default_bin_dir(),
        report,
    )
    .await?;
    let ns = "bench-spire";
    scenario.ensure_namespace(ns, false)?;
    scenario.kubectl().apply_manifest(
        &format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: probe, namespace: {ns}}}\n"
        ),
        &format!("service account {ns}/probe"),
    )?;
    let id = installed.register_workload(ns, "probe")?;
    // SPIRE's best case: the agent holds the entry's SVID before the measured pods start. One
    // pod, not measured, waits for it (the agent syncs entries every few seconds).
    let warmed = phase_times(
        scenario,
        api,
        ns,
        Kind::Spire,
        Some(&id),
        "warmup",
        1,
        Duration::ZERO,
    )
    .await
    .context("spire, the warm-up pod")?;
    report(format!(
        "spire      warm-up pod had its SVID after {:.1} s (entry sync)",
        warmed.first().map_or(0.0, Duration::as_secs_f64)
    ));
    delete_all(scenario, ns)?;
    let agent =
        crate::procs::pid_named("spire-agent").context("no spire-agent process on this node")?;
    let csi = crate::procs::pid_named("spiffe-csi-driver")
        .context("no spiffe-csi-driver on this node")?;
    let cpu = || Usage::of(agent).cpu_seconds + Usage::of(csi).cpu_seconds;
    let cpu_before = cpu();
    let mut phases = BTreeMap::new();
    for (phase, count) in [("sequential", options.sequential), ("burst", options.burst)] {
        let times = phase_times(
            scenario,
            api,
            ns,
            Kind::Spire,
            Some(&id),
            phase,
            count,
            options.interval,
        )
        .await
        .with_context(|| format!("spire, {phase}"))?;
        let p = percentiles(times);
        report(format!(
            "{:<10} {phase:<10} {count:>3} pods: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms",
            "spire", p.p50, p.p90, p.p99
        ));
        phases.insert(phase.to_owned(), p);
        delete_all(scenario, ns)?;
    }
    let pods = (options.sequential + options.burst).max(1) as f64;
    Ok(SpireReport {
        agent_peak_rss_mib: Usage::of(agent).peak_rss_kib as f64 / 1024.0,
        node_cpu_ms_per_credential: (cpu() - cpu_before) * 1e3 / pods,
        time_to_credential_ms: phases,
    })
}

/// Creates `count` probe pods (one per `interval`, or all at once for the burst) and returns
/// each one's created → ready time.
#[allow(clippy::too_many_arguments)]
async fn phase_times(
    scenario: &Scenario,
    api: &Checker,
    ns: &str,
    kind: Kind,
    spiffe_id: Option<&str>,
    phase: &str,
    count: usize,
    interval: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let mode = kind.mode();
    let container = match (kind, spiffe_id) {
        (Kind::Spire, Some(id)) => spire::probe_container(id),
        (Kind::Spire, None) => bail!("a SPIRE pod needs its SPIFFE ID"),
        _ => probe_container(mode),
    };
    let path = format!("/api/v1/namespaces/{ns}/pods");
    let mut created = BTreeMap::new();
    let mut posts = Vec::new();
    for i in 0..count {
        let name = format!("{phase}-{i}");
        let mut pod = scenario.pod_json(ns, &name, "probe", mode, container.clone())?;
        if kind == Kind::SameShape {
            pod["spec"]["initContainers"] = same_shape_init_containers();
        }
        if kind == Kind::Spire {
            pod["spec"]["volumes"] = serde_json::json!([spire::workload_api_volume()]);
        }
        if phase == "sequential" {
            if i > 0 {
                tokio::time::sleep(interval).await;
            }
            created.insert(name, SystemTime::now());
            api.api_post(&path, &pod).await?;
        } else {
            posts.push((name, pod));
        }
    }
    if !posts.is_empty() {
        // all at once: one task per pod, each its own request
        let at = SystemTime::now();
        let mut sends = tokio::task::JoinSet::new();
        for (name, pod) in posts {
            let (api, path) = (api.clone(), path.clone());
            sends.spawn(async move { api.api_post(&path, &pod).await });
            created.insert(name, at);
        }
        while let Some(sent) = sends.join_next().await {
            sent.context("a pod's creation task")??;
        }
    }
    // each pod's probe says when it read its certificate
    let deadline = Instant::now() + POD_LIMIT;
    let mut times = Vec::new();
    while !created.is_empty() {
        if Instant::now() > deadline {
            bail!(
                "{} pods never read a certificate within {POD_LIMIT:?}: {:?}",
                created.len(),
                created.keys().collect::<Vec<_>>()
            );
        }
        let mut done = Vec::new();
        for (name, at) in &created {
            let log = api
                .api_text(&format!("{path}/{name}/log?container=app"))
                .await
                .unwrap_or_default();
            if let Some(ready) = ready_time(&log) {
                times.push(ready.duration_since(*at).unwrap_or_default());
                done.push(name.clone());
            }
        }
        for name in done {
            created.remove(&name);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(times)
}

/// Our probe: waits for the certificate the mode delivers (none: starts at once).
fn probe_container(mode: Option<Mode>) -> serde_json::Value {
    serde_json::json!({
        "name": "app",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "args": if mode.is_some() {
            vec![format!("{CREDENTIALS}/service.cert.pem")]
        } else {
            Vec::new()
        },
    })
}

/// An init container that exits at once and a native sidecar that sleeps: the shape of a
/// flex or csi-socket pod, with nothing of ours in it.
fn same_shape_init_containers() -> serde_json::Value {
    let busybox = |name: &str, args: &[&str]| {
        serde_json::json!({
            "name": name,
            "image": super::scenario::APP_IMAGE,
            "imagePullPolicy": "Never",
            "command": [super::scenario::BUSYBOX],
            "args": args,
        })
    };
    let mut sidecar = busybox("sidecar", &["sleep", "3600"]);
    sidecar["restartPolicy"] = "Always".into();
    serde_json::json!([busybox("init", &["true"]), sidecar])
}

/// The time in a probe's `ready <unix ns>` line.
fn ready_time(log: &str) -> Option<SystemTime> {
    let ns: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("ready "))?
        .trim()
        .parse()
        .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

/// Deletes every pod in `ns` and waits until they are gone (their volumes unmounted).
fn delete_all(scenario: &Scenario, ns: &str) -> anyhow::Result<()> {
    scenario.kubectl().run(&[
        "-n",
        ns,
        "delete",
        "pods",
        "--all",
        "--wait=true",
        "--timeout=180s",
    ])?;
    Ok(())
}

/// p50, p90, p99 of `times`, milliseconds.
fn percentiles(mut times: Vec<Duration>) -> Percentiles {
    times.sort();
    let ms = |p| athenz_testbed::stats::percentile(&times, p).as_secs_f64() * 1e3;
    Percentiles {
        p50: ms(0.5),
        p90: ms(0.9),
        p99: ms(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_line_is_its_time_and_anything_else_is_none() {
        let t = ready_time("ready 1795697829123456789\n").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
            Duration::from_nanos(1_795_697_829_123_456_789)
        );
        assert!(ready_time("").is_none());
        assert!(ready_time("ready soon\n").is_none());
        assert!(ready_time("ready 99999999999999999999999\n").is_none());
    }
}
