//! `cluster flood`: what a tenant who may create pods can do to a node's ordinary pods through
//! early issuance (docs/design.md §4.10): labelled files-mode pods bound to the node
//! (`spec.nodeName`) and deleted at once, in batches, while ordinary files-mode pods start
//! there one per interval. Each round measures the ordinary pods' times to a verified credential
//! under one [`Round`]: no flood; a flood of unlabelled pods (the kubelet's, the API server's
//! and the webhook's own load, nothing for the agent); the labelled flood; and, with the agent's
//! early issuance switched off (`CSI_EARLY_ISSUE=false`, the DaemonSet rolled), no flood and
//! the same labelled flood. The last is the fair control: the same pods, the same kubelet
//! publishes for those it reaches, only early issuance's share missing. Each round also reads
//! from the kubelet's log how long the ordinary pods' identity volumes took to set up (what of
//! their time is ours), and counts the flood's registrations in the dev ZTS's log and the agent's
//! early issuances by outcome.

use super::Phase;
use super::kinds::Kind;
use super::pods::{Churn, SERVICE_ACCOUNT, Workload};
use super::volume_wait;
use super::{AGENT_OPS_PORT, costs::Cgroups};
use crate::bench::Latency;
use crate::cluster::components::KUBELET;
use crate::cluster::health::Checker;
use crate::cluster::install::{NODE_NAMESPACE, ZTS};
use crate::cluster::scenario::Scenario;
use crate::cluster::{ClusterInfo, Layout};
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

/// The flood pods' namespace (domain `bench.flood`).
const FLOOD_NAMESPACE: &str = "bench-flood";

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct FloodOptions {
    /// Ordinary pods per round, created one per `interval`.
    pub pods: usize,
    /// The time between two ordinary pods.
    pub interval: Duration,
    /// Flood pods per flooded round, spread over the round in batches, each batch deleted as
    /// soon as it is created.
    pub flood_pods: usize,
    /// How many times every [`Round`] runs, in the order of [`Round::ALL`].
    pub rounds: usize,
}

/// The conditions the ordinary pods start under, in the order each pass runs them (the agent's
/// early issuance switched once each way per pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// No flood.
    Quiet,
    /// A flood of unlabelled pods: the kubelet's, the API server's and the webhook's own load.
    NodeLoad,
    /// The labelled flood, early issuance on.
    Flooded,
    /// No flood, early issuance off.
    QuietWithoutEarlyIssue,
    /// The labelled flood, early issuance off: the fair control.
    FloodedWithoutEarlyIssue,
}

impl Round {
    /// Every round, in the order a pass runs them.
    pub const ALL: [Round; 5] = [
        Round::Quiet,
        Round::NodeLoad,
        Round::Flooded,
        Round::QuietWithoutEarlyIssue,
        Round::FloodedWithoutEarlyIssue,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Round::Quiet => "quiet",
            Round::NodeLoad => "node_load",
            Round::Flooded => "flooded",
            Round::QuietWithoutEarlyIssue => "quiet_without_early_issue",
            Round::FloodedWithoutEarlyIssue => "flooded_without_early_issue",
        }
    }

    /// Whether the agent issues early during it.
    fn early_issue(self) -> bool {
        matches!(self, Round::Quiet | Round::NodeLoad | Round::Flooded)
    }

    /// Whether its flood pods carry the injection label (`None`: no flood).
    fn flood_labelled(self) -> Option<bool> {
        match self {
            Round::Quiet | Round::QuietWithoutEarlyIssue => None,
            Round::NodeLoad => Some(false),
            Round::Flooded | Round::FloodedWithoutEarlyIssue => Some(true),
        }
    }
}

/// One round's figures, over its passes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RoundFigures {
    /// Ordinary pods' created → verified credential (ms).
    pub time_to_credential_ms: Latency,
    /// Their identity volumes' set-up, `MountVolume started` → `SetUp succeeded` in the
    /// kubelet's log (ms): the share of their time that is the agent's publish.
    pub identity_volume_setup_ms: Option<Latency>,
    /// Registrations the dev ZTS logged for the flood's pods during the round.
    pub flood_registrations: usize,
}

/// What the flood measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FloodReport {
    /// Each round's figures, by [`Round::name`].
    pub rounds: BTreeMap<String, RoundFigures>,
    /// flooded p99 / quiet p99.
    pub p99_ratio: f64,
    /// flooded p99 / flooded-without-early-issue p99: what early issuance adds to the flood.
    pub p99_over_control: f64,
    /// flooded p99 / node-load p99.
    pub p99_over_node_load: f64,
    /// Flood pods created in the labelled rounds with early issuance on (each deleted at once).
    pub flood_pods: usize,
    /// The agent's early issuances during the flooded rounds, by outcome.
    pub early_issues: BTreeMap<String, u64>,
    /// Warm-up requests the agent's queue dropped before they had a slot (flooded rounds).
    pub warmup_cancelled_in_queue: u64,
    /// The agent's most warm-up issuances at once, as its gauge read every 50 ms.
    pub warmup_in_flight_max: u64,
}

impl FloodReport {
    /// The report as lines.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for round in Round::ALL {
            let Some(figures) = self.rounds.get(round.name()) else {
                continue;
            };
            let t = &figures.time_to_credential_ms;
            let setup = figures
                .identity_volume_setup_ms
                .as_ref()
                .map(|s| format!("p50 {:.0} ms, p99 {:.0} ms", s.p50, s.p99))
                .unwrap_or_else(|| "not in the kubelet's log".to_owned());
            out.push_str(&format!(
                "{:<28} p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms; volume set-up {setup}; \
                 flood registrations {}\n",
                round.name(),
                t.p50,
                t.p90,
                t.p99,
                figures.flood_registrations,
            ));
        }
        out.push_str(&format!(
            "flooded p99 ×{:.3} of quiet, ×{:.3} of the same flood without early issuance, \
             ×{:.3} of the unlabelled flood\n\
             flood: {} labelled pods bound here and deleted at once with early issuance on; early \
             issuances {:?}; {} warm-up requests left the queue unserved; warm-up in flight at \
             most {}\n",
            self.p99_ratio,
            self.p99_over_control,
            self.p99_over_node_load,
            self.flood_pods,
            self.early_issues,
            self.warmup_cancelled_in_queue,
            self.warmup_in_flight_max,
        ));
        out
    }
}

/// Sums the samples of metric `name` whose labels contain `label` (all, when empty).
fn metric_sum(page: &str, name: &str, label: &str) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The early-issuance outcomes on `page`.
fn early_outcomes(page: &str) -> BTreeMap<String, u64> {
    let mut outcomes = BTreeMap::new();
    for outcome in [
        "taken",
        "failed",
        "expired",
        "dropped",
        "cancelled",
        "overtaken",
    ] {
        let n = metric_sum(
            page,
            "athenz_agent_csi_early_issues_total",
            &format!("outcome=\"{outcome}\""),
        );
        outcomes.insert(outcome.to_owned(), n);
    }
    outcomes
}

/// `line` without its terminal colour codes (`ESC [ … m`).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for skipped in chars.by_ref() {
                if skipped == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Registrations the dev ZTS logged for domain `domain`.
fn zts_registrations(log: &str, domain: &str) -> usize {
    let field = format!("domain={domain} ");
    log.lines()
        .map(plain)
        .filter(|l| l.contains("instance registered") && l.contains(&field))
        .count()
}

/// Creates `count` flood pods over `over`, in batches one `every` apart, each batch deleted as
/// soon as it is created (no grace: as a tenant who wants them gone would).
async fn flood(
    api: &Checker,
    prototype: &serde_json::Value,
    prefix: &str,
    count: usize,
    over: Duration,
    every: Duration,
) -> anyhow::Result<usize> {
    let path = format!("/api/v1/namespaces/{FLOOD_NAMESPACE}/pods");
    let batches = (over.as_secs_f64() / every.as_secs_f64()).max(1.0) as usize;
    let per_batch = count.div_ceil(batches);
    let start = tokio::time::Instant::now();
    let mut created = 0;
    for batch in 0..batches {
        tokio::time::sleep_until(start + every * batch as u32).await;
        let names: Vec<String> = (0..per_batch)
            .map(|i| batch * per_batch + i)
            .take_while(|i| *i < count)
            .map(|i| format!("{prefix}-{i}"))
            .collect();
        let mut sends = tokio::task::JoinSet::new();
        for name in &names {
            let mut pod = prototype.clone();
            pod["metadata"]["name"] = name.as_str().into();
            let (api, path) = (api.clone(), path.clone());
            sends.spawn(async move { api.api_post(&path, &pod).await });
        }
        while let Some(sent) = sends.join_next().await {
            sent.context("a flood pod's creation")??;
        }
        let mut deletes = tokio::task::JoinSet::new();
        for name in names {
            let (api, path) = (api.clone(), format!("{path}/{name}?gracePeriodSeconds=0"));
            deletes.spawn(async move { api.api_delete(&path).await });
        }
        while let Some(deleted) = deletes.join_next().await {
            deleted.context("a flood pod's deletion")??;
        }
        created += per_batch.min(count.saturating_sub(batch * per_batch));
    }
    Ok(created)
}

/// Samples the agent's warm-up gauge every 50 ms until `stop`; the most seen.
async fn sample_warmups(metrics: String, mut stop: tokio::sync::oneshot::Receiver<()>) -> u64 {
    let mut most = 0;
    loop {
        if let Ok(page) = crate::scrape::text(&metrics).await {
            most = most.max(metric_sum(
                &page,
                "athenz_agent_issuance_in_flight",
                "priority=\"warmup\"",
            ));
        }
        tokio::select! {
            _ = &mut stop => return most,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// The agent's DaemonSet, as `kubectl` names it.
const AGENT_DAEMONSET: &str = "daemonset/athenz-agent";
/// How long the agent's DaemonSet may take to roll.
const ROLL_LIMIT: Duration = Duration::from_secs(180);

/// Switches the agent's early issuance (`CSI_EARLY_ISSUE`) and waits for the DaemonSet to roll.
fn set_early_issue(scenario: &Scenario, on: bool) -> anyhow::Result<()> {
    let kubectl = scenario.kubectl();
    let value = format!("CSI_EARLY_ISSUE={on}");
    kubectl
        .run(&["-n", NODE_NAMESPACE, "set", "env", AGENT_DAEMONSET, &value])
        .with_context(|| format!("setting {value} on the agent"))?;
    kubectl.wait_rolled_out(NODE_NAMESPACE, AGENT_DAEMONSET, ROLL_LIMIT)
}

/// A log a process keeps appending to, read a round at a time: each read returns the whole
/// lines written since the one before, so no round parses what earlier rounds already did.
struct LogTail {
    path: PathBuf,
    /// Where the next read starts: just after the last whole line read.
    offset: u64,
}

impl LogTail {
    /// The log at `path`, from its current end.
    fn from_end(path: PathBuf) -> anyhow::Result<Self> {
        let offset = std::fs::metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        Ok(Self { path, offset })
    }

    /// The whole lines written since the last read (a line still being written waits).
    fn read_new(&mut self) -> anyhow::Result<String> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        bytes.truncate(whole);
        self.offset += whole as u64;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// What the agent counted during the flooded rounds (each read from the agent of its round:
/// rolling the DaemonSet starts its counters again).
#[derive(Default)]
struct AgentCounts {
    early_issues: BTreeMap<String, u64>,
    warmup_cancelled: u64,
    warmup_most: u64,
}

impl AgentCounts {
    /// Adds what the agent counted between `before` and `after`.
    fn add(&mut self, before: &str, after: &str) {
        let was = early_outcomes(before);
        for (outcome, n) in early_outcomes(after) {
            *self.early_issues.entry(outcome.clone()).or_default() +=
                n.saturating_sub(was.get(&outcome).copied().unwrap_or(0));
        }
        let cancelled = |page: &str| {
            metric_sum(
                page,
                "athenz_agent_issuance_cancelled_total",
                "priority=\"warmup\"",
            )
        };
        self.warmup_cancelled += cancelled(after).saturating_sub(cancelled(before));
    }
}

/// Every round's samples, over the passes.
#[derive(Default)]
struct Samples {
    times: Vec<Duration>,
    setups: Vec<Duration>,
    registrations: usize,
}

/// Runs the flood on the running cluster of `layout`.
pub async fn run(
    layout: &Layout,
    info: &ClusterInfo,
    options: FloodOptions,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<FloodReport> {
    let zts = info.zts.as_ref().context("the cluster has no dev ZTS")?;
    super::prepare_probe(layout)?;
    let scenario = Scenario::new(layout, &zts.ca);
    let api = Checker::for_cluster(layout, info)?;
    let cgroups = Cgroups::host();
    let kind = Kind::Identity(VolumeMode::CsiFiles);
    let ns = format!("bench-{}", kind.name());
    for namespace in [ns.as_str(), FLOOD_NAMESPACE] {
        scenario.ensure_namespace(namespace, false)?;
        scenario.ensure_service_account(namespace, SERVICE_ACCOUNT)?;
    }
    let workload = Workload {
        scenario: &scenario,
        api: &api,
        cgroups: &cgroups,
        kind,
        prototype: kind.pod(&scenario, &ns, "prototype", SERVICE_ACCOUNT, None)?,
        ns,
    };
    let flood_pod = |kind: Kind| -> anyhow::Result<serde_json::Value> {
        let mut pod = kind.pod(
            &scenario,
            FLOOD_NAMESPACE,
            "prototype",
            SERVICE_ACCOUNT,
            None,
        )?;
        pod["spec"]["nodeName"] = info.node_name.as_str().into();
        Ok(pod)
    };
    let labelled_pod = flood_pod(kind)?;
    let unlabelled_pod = flood_pod(Kind::Bare)?;
    let no_churn = Churn {
        duration: Duration::ZERO,
        interval: options.interval,
        lifetime: Duration::ZERO,
    };
    let warm_up = || async {
        workload
            .run(Phase::Sequential, 1, Duration::ZERO, no_churn)
            .await
            .context("the warm-up pod")
    };
    warm_up().await?;
    let metrics_url = format!("http://{}:{AGENT_OPS_PORT}/metrics", info.node_ip);
    let mut zts_log = LogTail::from_end(layout.logs.join(format!("{ZTS}.log")))?;
    let mut kubelet_log = LogTail::from_end(layout.logs.join(format!("{KUBELET}.log")))?;
    let mut samples: BTreeMap<&'static str, Samples> = BTreeMap::new();
    let mut counts = AgentCounts::default();
    let mut flood_pods = 0;
    let mut early_issue_on = true;
    let window = options.interval * options.pods as u32;
    for pass in 0..options.rounds {
        for round in Round::ALL {
            if round.early_issue() != early_issue_on {
                set_early_issue(&scenario, round.early_issue())?;
                early_issue_on = round.early_issue();
                warm_up().await?;
            }
            // what the logs say of this round alone
            zts_log.read_new()?;
            kubelet_log.read_new()?;
            let counted = round == Round::Flooded;
            let before = if counted {
                Some(crate::scrape::text(&metrics_url).await?)
            } else {
                None
            };
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let sampler =
                counted.then(|| tokio::spawn(sample_warmups(metrics_url.clone(), stopped)));
            let prefix = format!("{}-{pass}", round.name().replace('_', "-"));
            let prototype = match round.flood_labelled() {
                Some(true) => Some(&labelled_pod),
                Some(false) => Some(&unlabelled_pod),
                None => None,
            };
            let flooding = async {
                match prototype {
                    Some(pod) => {
                        flood(
                            &api,
                            pod,
                            &prefix,
                            options.flood_pods,
                            window,
                            options.interval / 2,
                        )
                        .await
                    }
                    None => Ok(0),
                }
            };
            let (outcome, created) = tokio::join!(
                workload.run(Phase::Sequential, options.pods, options.interval, no_churn),
                flooding,
            );
            let _ = stop.send(());
            let warmups = match sampler {
                Some(sampler) => sampler.await.unwrap_or(0),
                None => 0,
            };
            let outcome = outcome.with_context(|| format!("pass {pass}, {}", round.name()))?;
            let created = created?;
            if let Some(before) = before {
                // the flood's pods gone, so its last cancellations are counted
                tokio::time::sleep(Duration::from_secs(5)).await;
                let after = crate::scrape::text(&metrics_url).await?;
                counts.add(&before, &after);
                counts.warmup_most = counts.warmup_most.max(warmups);
                flood_pods += created;
            }
            let setups = volume_wait::identity_setups(
                &kubelet_log.read_new()?,
                &workload.ns,
                Phase::Sequential.name(),
            );
            let figures = samples.entry(round.name()).or_default();
            figures.registrations += zts_registrations(&zts_log.read_new()?, "bench.flood");
            report(format!(
                "pass {pass} {:<28} p99 {:.0} ms",
                round.name(),
                Latency::of(&mut outcome.times.clone()).p99
            ));
            figures.times.extend(outcome.times);
            figures.setups.extend(setups);
        }
    }
    if !early_issue_on {
        set_early_issue(&scenario, true)?;
    }
    let mut rounds = BTreeMap::new();
    for (name, mut s) in samples {
        rounds.insert(
            name.to_owned(),
            RoundFigures {
                time_to_credential_ms: Latency::of(&mut s.times),
                identity_volume_setup_ms: (!s.setups.is_empty())
                    .then(|| Latency::of(&mut s.setups)),
                flood_registrations: s.registrations,
            },
        );
    }
    let p99 = |round: Round| {
        rounds
            .get(round.name())
            .map_or(f64::NAN, |f| f.time_to_credential_ms.p99)
    };
    Ok(FloodReport {
        p99_ratio: p99(Round::Flooded) / p99(Round::Quiet),
        p99_over_control: p99(Round::Flooded) / p99(Round::FloodedWithoutEarlyIssue),
        p99_over_node_load: p99(Round::Flooded) / p99(Round::NodeLoad),
        rounds,
        flood_pods,
        early_issues: counts.early_issues,
        warmup_cancelled_in_queue: counts.warmup_cancelled,
        warmup_in_flight_max: counts.warmup_most,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_name_and_label() {
        let page = "athenz_agent_csi_early_issues_total{outcome=\"cancelled\"} 12\n\
                    athenz_agent_csi_early_issues_total{outcome=\"taken\"} 3\n\
                    athenz_agent_issuance_in_flight{priority=\"warmup\"} 2\n\
                    athenz_agent_issuance_in_flight_other{priority=\"warmup\"} 9\n";
        let outcomes = early_outcomes(page);
        assert_eq!(outcomes["cancelled"], 12);
        assert_eq!(outcomes["taken"], 3);
        assert_eq!(outcomes["dropped"], 0);
        assert_eq!(
            metric_sum(page, "athenz_agent_issuance_in_flight", "warmup"),
            2
        );
    }

    #[test]
    fn a_log_tail_returns_each_whole_line_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zts.log");
        std::fs::write(&path, "before the round\n").unwrap();
        let mut tail = LogTail::from_end(path.clone()).unwrap();
        assert_eq!(tail.read_new().unwrap(), "");
        let append = |text: &str| {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            file.write_all(text.as_bytes()).unwrap();
        };
        append("one\ntw");
        assert_eq!(
            tail.read_new().unwrap(),
            "one\n",
            "a line being written waits"
        );
        append("o\n");
        assert_eq!(tail.read_new().unwrap(), "two\n");
        assert_eq!(tail.read_new().unwrap(), "");
        assert!(LogTail::from_end(dir.path().join("missing")).is_err());
    }

    #[test]
    fn registrations_are_counted_for_the_floods_domain_only() {
        let log = "INFO instance registered domain=bench.flood service=probe\n\
                   INFO instance registered domain=bench.csi.files service=probe\n\
                   \u{1b}[2mINFO\u{1b}[0m instance registered \u{1b}[3mdomain\u{1b}[0m\u{1b}[2m=\u{1b}[0mbench.flood \u{1b}[3mservice\u{1b}[0m=probe\n\
                   INFO instance registered domain=bench.flood.more service=probe\n\
                   INFO refresh domain=bench.flood\n";
        assert_eq!(zts_registrations(log, "bench.flood"), 2);
    }
}
