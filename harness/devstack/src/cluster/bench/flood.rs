//! `cluster flood`: what a tenant who may create pods can do to a node's ordinary pods through
//! early issuance (docs/design.md §4.10): labelled files-mode pods bound to the node
//! (`spec.nodeName`) and deleted at once, in batches, while ordinary files-mode pods start
//! there one per interval. The ordinary pods' times to a verified credential are measured
//! without a flood, beside a flood of unlabelled pods (the same load on the API server, the
//! webhook and the kubelet, nothing for the agent: the control) and beside the flood, the
//! rounds alternating on one node; the flood's cost is counted where it lands: registrations in the dev ZTS's log, and the agent's early issuances by outcome.

use super::Phase;
use super::kinds::Kind;
use super::pods::{Churn, SERVICE_ACCOUNT, Workload};
use super::{AGENT_OPS_PORT, costs::Cgroups};
use crate::bench::Latency;
use crate::cluster::health::Checker;
use crate::cluster::scenario::Scenario;
use crate::cluster::{ClusterInfo, Layout};
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use std::collections::BTreeMap;
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
    /// Rounds of each (without, with), alternating.
    pub rounds: usize,
}

/// What the flood measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FloodReport {
    /// Ordinary pods' created → verified credential, without the flood (ms).
    pub quiet_ms: Latency,
    /// The same, while a flood of pods without the injection label ran (the same load on the
    /// API server, the webhook and the kubelet; nothing for the agent to issue): the control.
    pub control_ms: Latency,
    /// The same, while the flood ran.
    pub flooded_ms: Latency,
    /// flooded p99 / control p99: what the flood's early issuances added.
    pub p99_over_control: f64,
    /// flooded p99 / quiet p99.
    pub p99_ratio: f64,
    /// Flood pods created (each deleted at once).
    pub flood_pods: usize,
    /// Registrations the dev ZTS logged for the flood's pods.
    pub flood_registrations: usize,
    /// The agent's early issuances during the flooded rounds, by outcome.
    pub early_issues: BTreeMap<String, u64>,
    /// Warm-up requests the agent's queue dropped before they had a slot.
    pub warmup_cancelled_in_queue: u64,
    /// The agent's most warm-up issuances at once, as its gauge read every 50 ms.
    pub warmup_in_flight_max: u64,
}

impl FloodReport {
    /// The report as lines.
    pub fn table(&self) -> String {
        format!(
            "ordinary pods, quiet:   p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms\n\
             ordinary pods, control: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms (unlabelled flood)\n\
             ordinary pods, flooded: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms (p99 ×{:.3} of quiet, ×{:.3} of control)\n\
             flood: {} pods bound here and deleted at once; {} registered at ZTS; early \
             issuances {:?}; {} warm-up requests left the queue unserved; warm-up in flight at \
             most {}\n",
            self.quiet_ms.p50,
            self.quiet_ms.p90,
            self.quiet_ms.p99,
            self.control_ms.p50,
            self.control_ms.p90,
            self.control_ms.p99,
            self.flooded_ms.p50,
            self.flooded_ms.p90,
            self.flooded_ms.p99,
            self.p99_ratio,
            self.p99_over_control,
            self.flood_pods,
            self.flood_registrations,
            self.early_issues,
            self.warmup_cancelled_in_queue,
            self.warmup_in_flight_max,
        )
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
    let mut flood_pod = kind.pod(
        &scenario,
        FLOOD_NAMESPACE,
        "prototype",
        SERVICE_ACCOUNT,
        None,
    )?;
    flood_pod["spec"]["nodeName"] = info.node_name.as_str().into();
    let mut control_pod = Kind::Bare.pod(
        &scenario,
        FLOOD_NAMESPACE,
        "prototype",
        SERVICE_ACCOUNT,
        None,
    )?;
    control_pod["spec"]["nodeName"] = info.node_name.as_str().into();
    let no_churn = Churn {
        duration: Duration::ZERO,
        interval: options.interval,
        lifetime: Duration::ZERO,
    };
    workload
        .run(Phase::Sequential, 1, Duration::ZERO, no_churn)
        .await
        .context("the warm-up pod")?;
    let metrics_url = format!("http://{}:{AGENT_OPS_PORT}/metrics", info.node_ip);
    let zts_log = layout
        .logs
        .join(format!("{}.log", crate::cluster::install::ZTS));
    let registered_before = std::fs::read_to_string(&zts_log)
        .map(|log| zts_registrations(&log, "bench.flood"))
        .unwrap_or(0);
    let before = crate::scrape::text(&metrics_url).await?;
    let (mut quiet, mut control, mut flooded) = (Vec::new(), Vec::new(), Vec::new());
    let mut flood_pods = 0;
    let mut warmup_most = 0;
    let window = options.interval * options.pods as u32;
    for round in 0..options.rounds {
        let outcome = workload
            .run(Phase::Sequential, options.pods, options.interval, no_churn)
            .await
            .with_context(|| format!("round {round}, quiet"))?;
        report(format!(
            "round {round} quiet:   p99 {:.0} ms",
            Latency::of(&mut outcome.times.clone()).p99
        ));
        quiet.extend(outcome.times);
        let prefix = format!("control-{round}");
        let (outcome, created) = tokio::join!(
            workload.run(Phase::Sequential, options.pods, options.interval, no_churn),
            flood(
                &api,
                &control_pod,
                &prefix,
                options.flood_pods,
                window,
                options.interval / 2,
            ),
        );
        let outcome = outcome.with_context(|| format!("round {round}, control"))?;
        created?;
        report(format!(
            "round {round} control: p99 {:.0} ms",
            Latency::of(&mut outcome.times.clone()).p99
        ));
        control.extend(outcome.times);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let sampler = tokio::spawn(sample_warmups(metrics_url.clone(), stopped));
        let prefix = format!("flood-{round}");
        let (outcome, created) = tokio::join!(
            workload.run(Phase::Sequential, options.pods, options.interval, no_churn),
            flood(
                &api,
                &flood_pod,
                &prefix,
                options.flood_pods,
                window,
                options.interval / 2,
            ),
        );
        let _ = stop.send(());
        warmup_most = warmup_most.max(sampler.await.unwrap_or(0));
        let outcome = outcome.with_context(|| format!("round {round}, flooded"))?;
        flood_pods += created?;
        report(format!(
            "round {round} flooded: p99 {:.0} ms",
            Latency::of(&mut outcome.times.clone()).p99
        ));
        flooded.extend(outcome.times);
    }
    // the flood's pods gone, so its last cancellations are counted
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = crate::scrape::text(&metrics_url).await?;
    let registered = std::fs::read_to_string(&zts_log)
        .with_context(|| format!("reading {}", zts_log.display()))
        .map(|log| zts_registrations(&log, "bench.flood"))?;
    let outcomes_before = early_outcomes(&before);
    let early_issues = early_outcomes(&after)
        .into_iter()
        .map(|(k, v)| {
            let was = outcomes_before.get(&k).copied().unwrap_or(0);
            (k, v.saturating_sub(was))
        })
        .collect();
    let cancelled = |page: &str| {
        metric_sum(
            page,
            "athenz_agent_issuance_cancelled_total",
            "priority=\"warmup\"",
        )
    };
    let quiet_ms = Latency::of(&mut quiet);
    let control_ms = Latency::of(&mut control);
    let flooded_ms = Latency::of(&mut flooded);
    Ok(FloodReport {
        p99_ratio: flooded_ms.p99 / quiet_ms.p99,
        p99_over_control: flooded_ms.p99 / control_ms.p99,
        quiet_ms,
        control_ms,
        flooded_ms,
        flood_pods,
        flood_registrations: registered.saturating_sub(registered_before),
        early_issues,
        warmup_cancelled_in_queue: cancelled(&after).saturating_sub(cancelled(&before)),
        warmup_in_flight_max: warmup_most,
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
    fn registrations_are_counted_for_the_floods_domain_only() {
        let log = "INFO instance registered domain=bench.flood service=probe\n\
                   INFO instance registered domain=bench.csi.files service=probe\n\
                   \u{1b}[2mINFO\u{1b}[0m instance registered \u{1b}[3mdomain\u{1b}[0m\u{1b}[2m=\u{1b}[0mbench.flood \u{1b}[3mservice\u{1b}[0m=probe\n\
                   INFO instance registered domain=bench.flood.more service=probe\n\
                   INFO refresh domain=bench.flood\n";
        assert_eq!(zts_registrations(log, "bench.flood"), 2);
    }
}
