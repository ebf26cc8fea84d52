//! What a scale point costs: each control-plane process's CPU and resident memory over a span
//! (from /proc, as a node's monitoring reads it), etcd's database size, and the pod creations'
//! latency at the point's rate.

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

/// What one scale point measured.
#[derive(Debug, Serialize)]
pub struct PointReport {
    pub nodes: usize,
    pub pods: usize,
    /// From the point's first node made to its pods (but the window's) running.
    pub fill_seconds: f64,
    /// The window's creation rate, pods a second.
    pub rate: f64,
    /// The window's pod creations, each `POST` to its answer, ms.
    pub creation: Latency,
    /// ZTS's confirmations of the window's pods, each over a new connection, ms.
    pub confirmation: Latency,
    /// Pods the callback's cache held after the window (`pod_cache_pods`).
    pub callback_cached_pods: f64,
    /// Each process at rest (leases renewed, nothing created), before this point's agents.
    pub at_rest: Vec<ProcessCost>,
    /// How long this point's new agents took to start their watches.
    pub agents_started_seconds: f64,
    /// The pod watches the API server served with every node's agent watching.
    pub pod_watches: f64,
    /// Each process at rest with every node's agent watching.
    pub at_rest_with_agents: Vec<ProcessCost>,
    /// Each process while the window's pods were created and started, agents watching.
    pub creating: Vec<ProcessCost>,
    /// etcd's database after the point, bytes.
    pub etcd_db_bytes: f64,
}

impl PointReport {
    /// One line for the terminal.
    pub fn line(&self) -> String {
        let costs = |costs: &[ProcessCost]| {
            costs
                .iter()
                .map(|c| format!("{} {:.2} cores {:.0} MiB", c.process, c.cores, c.rss_mib))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "{} nodes, {} pods: creation at {}/s p50 {:.1} ms p99 {:.1} ms; confirmation p50 {:.1} ms p99 {:.1} ms; at rest: {}; with agents ({} pod watches): {}; creating: {}; etcd {:.0} MiB",
            self.nodes,
            self.pods,
            self.rate,
            self.creation.p50,
            self.creation.p99,
            self.confirmation.p50,
            self.confirmation.p99,
            costs(&self.at_rest),
            self.pod_watches,
            costs(&self.at_rest_with_agents),
            costs(&self.creating),
            self.etcd_db_bytes / (1 << 20) as f64
        )
    }
}
