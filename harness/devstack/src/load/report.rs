//! What a load run reports: each replica's throughput per core, latency and memory, and the
//! Kubernetes API's requests per identity and per node renewal.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// One replica's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaLoad {
    /// Calls answered 200.
    pub answered: u64,
    /// Calls refused or failed.
    pub failed: u64,
    /// Calls answered per second of the run.
    pub per_second: f64,
    /// Its CPU over the run, seconds.
    pub cpu_seconds: f64,
    /// Calls answered per second of its CPU: what one core of it serves.
    pub per_core_second: f64,
    /// Latency p50, ms (the confirmation: connect, full handshake, answer).
    pub p50_ms: f64,
    /// Latency p99, ms.
    pub p99_ms: f64,
    /// Latency max, ms.
    pub max_ms: f64,
    /// Its peak resident memory, MiB.
    pub peak_rss_mib: f64,
}

/// The callback's figures, as docs/operating.md ("Capacity") reports them.
#[derive(Debug, Clone, Serialize)]
pub struct CallbackLoad {
    /// Confirmations answered per second of the callback's CPU.
    pub confirmations_per_core_second: f64,
    /// Confirmation latency p99, ms.
    pub p99_ms: f64,
    /// Whether p99 stayed within 50 ms at this rate (else the per-core figure is not a capacity).
    pub p99_within_bound: bool,
    /// Everything measured.
    pub replica: ReplicaLoad,
}

/// Kubernetes API requests per pod identity (the node renewals' own requests apart).
#[derive(Debug, Clone, Serialize)]
pub struct ApiPerIdentity {
    /// Per launch confirmed.
    pub issue: f64,
    /// Per refresh confirmed.
    pub refresh: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Nodes (agents).
    pub nodes: usize,
    /// Pods in the API.
    pub pods: usize,
    /// The rate asked for, identities a second.
    pub rate: f64,
    /// Seconds driven.
    pub seconds: f64,
    /// The callback (one replica).
    pub callback: CallbackLoad,
    /// The jwt-service (one replica), its calls over kept-alive mutual TLS as agents make them.
    pub jwt_service: ReplicaLoad,
    /// API requests per identity, as the API stand-in counted them.
    pub api_requests_per_identity: ApiPerIdentity,
    /// TokenReviews per node-identity registration or refresh (the agents' own, over the whole
    /// stack's life).
    pub tokenreviews_per_node_renewal: f64,
    /// Every API request per node-identity registration (its TokenReview and its reads of the
    /// node and of the agent's pod), from the stack's start.
    pub api_requests_per_node_renewal: f64,
    /// Node-identity registrations and refreshes the agents made.
    pub node_renewals: u64,
    /// Every API request during the run, by `verb resource[/subresource]`.
    pub api_requests: BTreeMap<String, u64>,
}

/// A replica's figures from its calls' latencies (`None`: failed), the run's length, its CPU
/// and memory.
pub(super) fn replica_load(
    times: &[Option<Duration>],
    seconds: f64,
    cpu: f64,
    rss_mib: f64,
) -> ReplicaLoad {
    let mut ok: Vec<f64> = times
        .iter()
        .flatten()
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    ok.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        if ok.is_empty() {
            return 0.0;
        }
        let i = ((ok.len() as f64 * q).ceil() as usize).clamp(1, ok.len()) - 1;
        ok[i]
    };
    let answered = ok.len() as u64;
    ReplicaLoad {
        answered,
        failed: times.len() as u64 - answered,
        per_second: answered as f64 / seconds.max(f64::EPSILON),
        cpu_seconds: cpu,
        per_core_second: if cpu > 0.0 {
            answered as f64 / cpu
        } else {
            0.0
        },
        p50_ms: quantile(0.5),
        p99_ms: quantile(0.99),
        max_ms: ok.last().copied().unwrap_or(0.0),
        peak_rss_mib: rss_mib,
    }
}

/// The report for people.
pub fn print_human(report: &LoadReport) {
    let c = &report.callback.replica;
    let j = &report.jwt_service;
    println!(
        "load: {} nodes, {} pods, {:.0} identities/s asked for {:.1} s",
        report.nodes, report.pods, report.rate, report.seconds
    );
    println!(
        "callback     {:>6} confirmed ({} failed), {:.0}/s; {:.0} per core-second; p50 {:.1} ms, p99 {:.1} ms{}; peak RSS {:.1} MiB",
        c.answered,
        c.failed,
        c.per_second,
        c.per_core_second,
        c.p50_ms,
        c.p99_ms,
        if report.callback.p99_within_bound {
            ""
        } else {
            " (over 50 ms: not a capacity)"
        },
        c.peak_rss_mib
    );
    println!(
        "jwt-service  {:>6} signed ({} failed), {:.0}/s; {:.0} per core-second; p50 {:.1} ms, p99 {:.1} ms; peak RSS {:.1} MiB",
        j.answered, j.failed, j.per_second, j.per_core_second, j.p50_ms, j.p99_ms, j.peak_rss_mib
    );
    println!(
        "API          {:.2} requests per identity issued, {:.2} per refresh; {:.2} TokenReviews and {:.2} requests in all per node renewal ({} renewals)",
        report.api_requests_per_identity.issue,
        report.api_requests_per_identity.refresh,
        report.tokenreviews_per_node_renewal,
        report.api_requests_per_node_renewal,
        report.node_renewals
    );
    for (request, n) in &report.api_requests {
        println!("  {request:<28} {n}");
    }
}
