//! What a scale point costs: each control-plane process's CPU and resident memory over a span
//! (from /proc, as a node's monitoring reads it), etcd's database size, and the pod creations'
//! latency at the point's rate.

use super::admission::WebhookLatency;
use crate::bench::Latency;
use crate::procs::{Process, Usage};
use serde::Serialize;
use std::future::Future;
use std::time::Instant;

/// The processes measured: each one's name and pid.
pub struct Sampler {
    processes: Vec<(String, u32)>,
}

/// One process's cost over a span.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessCost {
    pub process: String,
    /// CPU cores it used on average over the span.
    pub cores: f64,
    /// Its resident set at the span's end, MiB.
    pub rss_mib: f64,
}

impl Sampler {
    /// Measures every process of `processes` (as they are now).
    pub fn of(processes: &[Process]) -> Self {
        Self {
            processes: processes
                .iter()
                .map(|p| (p.command.name.clone(), p.pid()))
                .collect(),
        }
    }

    /// Runs `work` and returns each process's cost over it, with what `work` returned.
    pub async fn over<F, Fut, T>(&self, work: F) -> anyhow::Result<(Vec<ProcessCost>, T)>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let before: Vec<Usage> = self
            .processes
            .iter()
            .map(|(_, pid)| Usage::of(*pid))
            .collect();
        let started = Instant::now();
        let value = work().await?;
        let seconds = started.elapsed().as_secs_f64().max(f64::EPSILON);
        let costs = self
            .processes
            .iter()
            .zip(before)
            .map(|((name, pid), before)| {
                let after = Usage::of(*pid);
                ProcessCost {
                    process: name.clone(),
                    cores: (after.cpu_seconds - before.cpu_seconds).max(0.0) / seconds,
                    rss_mib: after.rss_kib as f64 / 1024.0,
                }
            })
            .collect();
        Ok((costs, value))
    }
}

impl Sampler {
    /// These processes and `more`.
    pub fn with(&self, more: &[&Process]) -> Self {
        let mut processes = self.processes.clone();
        processes.extend(more.iter().map(|p| (p.command.name.clone(), p.pid())));
        Self { processes }
    }

    /// Each process's cost over `span` of doing nothing here.
    pub async fn at_rest(&self, span: std::time::Duration) -> Vec<ProcessCost> {
        let rested = self
            .over(|| async {
                tokio::time::sleep(span).await;
                anyhow::Ok(())
            })
            .await;
        rested.map(|(costs, ())| costs).unwrap_or_default()
    }
}

/// The pod watches the API server serves now (`apiserver_longrunning_requests`, verb `WATCH`,
/// resource `pods`): the simulated agents' show there, one each, beside the controllers'.
pub async fn pod_watches(api: &super::fleet::Api) -> anyhow::Result<f64> {
    let text = api.text("/metrics", "text/plain").await?;
    Ok(
        crate::scrape::samples(&text, "apiserver_longrunning_requests")
            .filter(|(labels, _)| {
                crate::scrape::label(labels, "verb") == Some("WATCH")
                    && crate::scrape::label(labels, "resource") == Some("pods")
            })
            .map(|(_, v)| v)
            .sum(),
    )
}

/// The pods the callback's cache holds (`pod_cache_pods` on its ops address).
pub async fn callback_cached_pods(ops: &str) -> anyhow::Result<f64> {
    first_sample(&format!("{ops}/metrics"), "pod_cache_pods").await
}

/// etcd's database size (`etcd_mvcc_db_total_size_in_bytes` on its client URL's `/metrics`).
pub async fn etcd_db_bytes(etcd_url: &str) -> anyhow::Result<f64> {
    first_sample(
        &format!("{etcd_url}/metrics"),
        "etcd_mvcc_db_total_size_in_bytes",
    )
    .await
}

/// The first sample of metric `name` on the page at `url`.
async fn first_sample(url: &str, name: &str) -> anyhow::Result<f64> {
    let text = crate::scrape::text(url).await?;
    crate::scrape::samples(&text, name)
        .map(|(_, v)| v)
        .next()
        .ok_or_else(|| anyhow::anyhow!("{url} has no {name}"))
}

/// The API server's cores in `costs` (the process named `kube-apiserver`).
pub fn api_server_cores(costs: &[ProcessCost]) -> f64 {
    costs
        .iter()
        .find(|c| c.process == crate::cluster::components::APISERVER)
        .map_or(0.0, |c| c.cores)
}

/// Our parts' share of the API server's CPU: what it used with them, less what it used
/// without them doing the same, over what it used with them. Negative when the difference is
/// below the two spans' noise.
pub fn share(with: &[ProcessCost], without: &[ProcessCost]) -> f64 {
    let with = api_server_cores(with);
    (with - api_server_cores(without)) / with.max(f64::EPSILON)
}

/// A span of one comparison: how long, how many of the API server's GCs it held, each
/// process's cost.
#[derive(Debug, Clone, Serialize)]
pub struct Span {
    pub seconds: f64,
    pub gc_cycles: f64,
    pub processes: Vec<ProcessCost>,
}

/// One comparison's spans and what it found.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub at_rest_without_ours: Span,
    pub creating_without_ours: Span,
    pub at_rest: Span,
    pub creating: Span,
    /// Our share of the API server's CPU at rest and while creating ([`measure::share`]).
    pub api_share_at_rest: f64,
    pub api_share_creating: f64,
    /// From the agents' start until the API server served every node's agent watch.
    pub agents_started_seconds: f64,
    /// The pod watches the API server served with every node's agent watching.
    pub pod_watches: f64,
}

/// A share over the comparisons: their mean and its standard error (none from one).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ShareEstimate {
    pub mean: f64,
    pub standard_error: Option<f64>,
}

impl ShareEstimate {
    /// Of `shares` (at least one).
    pub fn of(shares: &[f64]) -> Self {
        let n = shares.len().max(1) as f64;
        let mean = shares.iter().sum::<f64>() / n;
        let standard_error = (shares.len() > 1).then(|| {
            let variance = shares.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (variance / n).sqrt()
        });
        Self {
            mean,
            standard_error,
        }
    }
}

/// The callback with its cache full (every injected pod, `--pod-cache-fields=`), beside the
/// shipped one (pending pods only) at the same moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FullCache {
    /// Pods it held once its first list was done.
    pub pods: f64,
    /// Its resident set then, MiB.
    pub rss_mib: f64,
    /// The shipped callback's resident set at the same moment, and the pods it held.
    pub pending_rss_mib: f64,
    pub pending_pods: f64,
    /// What each further pod held costs: the two resident sets' difference over the two
    /// caches' difference, bytes.
    pub bytes_per_pod: f64,
    /// From its start to its cache holding every pod: its first list and watch (what a relist
    /// costs), seconds; its own CPU seconds over that; the API server's.
    pub list_seconds: f64,
    pub list_cpu_seconds: f64,
    pub api_server_cpu_seconds: f64,
}

/// What one scale point measured. "Ours" is the initializer in the pods' path, the callback,
/// the jwt-service and every node's agent watch; "without ours" is the same cluster with them
/// stopped. Latencies are pooled over the point's comparisons.
#[derive(Debug, Serialize)]
pub struct PointReport {
    pub nodes: usize,
    pub pods: usize,
    /// The agents' pods (one a node, each its agent's token's pod).
    pub agent_pods: usize,
    /// From the point's first node made to its pods (but the comparisons' windows') running.
    pub fill_seconds: f64,
    /// The windows' creation rate, pods a second.
    pub rate: f64,
    /// The control windows' creations (a namespace not opted in, ours stopped), ms.
    pub control_creation: Latency,
    /// The measured windows' creations (opted in, through the webhook), ms.
    pub creation: Latency,
    /// The webhook's calls in the measured windows, as the API server timed them.
    pub webhook: WebhookLatency,
    /// ZTS's confirmations of the windows' pods, each over a new connection, ms.
    pub confirmation: Latency,
    /// Each confirmed pod's identity JWT from the jwt-service, asked by its node's agent, ms.
    pub jwt: Latency,
    /// Node agents' registrations confirmed (each a TokenReview, its agent pod's and node's
    /// reads), and their time, ms.
    pub node_confirmations: usize,
    pub node_confirmation: Latency,
    /// Pods the shipped callback's cache held after the windows (`pod_cache_pods`).
    pub callback_cached_pods: f64,
    /// A callback with its cache full.
    pub full_cache: FullCache,
    /// Each comparison's spans.
    pub comparisons: Vec<Comparison>,
    /// Our share of the API server's CPU at rest and while creating, over the comparisons.
    pub api_share_at_rest: ShareEstimate,
    pub api_share_creating: ShareEstimate,
    /// etcd's database after the point, bytes.
    pub etcd_db_bytes: f64,
}

impl PointReport {
    /// One line for the terminal.
    pub fn line(&self) -> String {
        let mean_cores = |span: fn(&Comparison) -> &Span| {
            self.comparisons
                .iter()
                .map(|c| api_server_cores(&span(c).processes))
                .sum::<f64>()
                / self.comparisons.len().max(1) as f64
        };
        format!(
            "{} nodes, {} pods: creation at {}/s p99 {:.1} ms ({:.1} without us); webhook p50 {} p99 {} ms ({} calls); confirmation p50 {:.1} ms p99 {:.1} ms (JWT p99 {:.1} ms); {} node confirmations p99 {:.1} ms; our share of the API server's CPU {} at rest, {} creating; API server at rest {:.2} cores ({:.2} without us); full cache {:.0} pods, {:.0} bytes a pod, listed in {:.1} s; etcd {:.0} MiB",
            self.nodes,
            self.pods,
            self.rate,
            self.creation.p99,
            self.control_creation.p99,
            shown(self.webhook.p50_ms),
            shown(self.webhook.p99_ms),
            self.webhook.calls,
            self.confirmation.p50,
            self.confirmation.p99,
            self.jwt.p99,
            self.node_confirmations,
            self.node_confirmation.p99,
            percent(&self.api_share_at_rest),
            percent(&self.api_share_creating),
            mean_cores(|c| &c.at_rest),
            mean_cores(|c| &c.at_rest_without_ours),
            self.full_cache.pods,
            self.full_cache.bytes_per_pod,
            self.full_cache.list_seconds,
            self.etcd_db_bytes / (1 << 20) as f64
        )
    }
}

fn percent(share: &ShareEstimate) -> String {
    match share.standard_error {
        Some(se) => format!("{:.1} ± {:.1} %", share.mean * 100.0, se * 100.0),
        None => format!("{:.1} %", share.mean * 100.0),
    }
}

fn shown(ms: Option<f64>) -> String {
    ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_estimate_is_the_mean_and_its_standard_error() {
        let one = ShareEstimate::of(&[0.04]);
        assert!((one.mean - 0.04).abs() < 1e-12);
        assert!(one.standard_error.is_none(), "one comparison has no spread");
        let three = ShareEstimate::of(&[0.01, 0.03, 0.05]);
        assert!((three.mean - 0.03).abs() < 1e-12);
        // sample sd 0.02, over √3
        let se = three.standard_error.unwrap_or(f64::NAN);
        assert!((se - 0.02 / 3f64.sqrt()).abs() < 1e-12, "{se}");
    }
}
