//! One comparison of a scale point: the control plane with our parts stopped (at rest, then a
//! control window of pods in a namespace that is not opted in), then with them running (at
//! rest once every agent's watch is open, then the measured window: each pod through the
//! webhook, confirmed through the callback with its node's agent's JWT, and a sample of the
//! nodes' agents' registrations confirmed through the callback's TokenReview).
//!
//! Every span starts and ends just after one of the API server's garbage collections ends, so
//! each holds whole GC cycles: a 5,000-node API server's heap is gigabytes, and a span that
//! holds one collection more than another differs by more than our parts add.

use super::agents::{AgentPod, NODE_AUDIENCE};
use super::measure::{self, Comparison, Sampler, Span};
use super::{fleet, ours, pending};
use crate::bench::Latency;
use anyhow::Context;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long every agent's watch may take to open once the agents start.
const WATCHES_WAIT: Duration = Duration::from_secs(300);
/// A pause between the last watch opened (or closed) and the rest span.
const SETTLE: Duration = Duration::from_secs(5);
/// How long past the window's last creation its last pods may take to be confirmed.
const CONFIRM_GRACE: Duration = Duration::from_secs(30);
/// How long a span's edge waits for the API server's next garbage collection.
const GC_WAIT: Duration = Duration::from_secs(180);
/// How often the API server's GC count is read at a span's edge.
const GC_POLL: Duration = Duration::from_secs(1);
/// One node agent's registration confirmed for this many pods of the window: at 50 pods a
/// second that is 5 a second, against the ~0.1 a second of 5,000 nodes' identities refreshed
/// twice a day.
pub const PODS_PER_NODE_CONFIRMATION: usize = 10;

/// What one comparison's windows timed, each call's time.
#[derive(Debug, Default)]
pub struct Timed {
    pub control_creations: Vec<Duration>,
    pub creations: Vec<Duration>,
    pub confirmations: Vec<Duration>,
    pub jwts: Vec<Duration>,
    pub node_confirmations: Vec<Duration>,
}

/// What a comparison runs against.
pub struct Against<'a> {
    pub api: &'a fleet::Api,
    pub sampler: &'a Sampler,
    pub setup: &'a ours::Setup,
    pub agents: &'a [AgentPod],
    pub rest: Duration,
    pub rate: f64,
}

/// The pods of one comparison's two windows, and the pods that will run after each.
pub struct Windows {
    pub control: Vec<(String, serde_json::Value)>,
    pub measured: Vec<(String, serde_json::Value)>,
    /// The measured window's batch label.
    pub batch: String,
    pub running_after_control: usize,
    pub running_after_measured: usize,
}

/// Runs one comparison: stops `running` (ours), measures without, starts ours again and
/// measures with; returns ours running, the comparison, and what its windows timed.
pub async fn once(
    at: &Against<'_>,
    running: Option<ours::Ours>,
    windows: Windows,
) -> anyhow::Result<(ours::Ours, Comparison, Timed)> {
    let api = at.api;
    if let Some(ours) = running {
        let closed = measure::pod_watches(api).await? - ours.agents.len() as f64;
        ours.stop().await;
        // at rest without us means every agent's watch is closed: their ending is ours
        wait_watches(api, |open| open <= closed).await?;
        tokio::time::sleep(SETTLE).await;
    }
    let mut timed = Timed::default();
    let at_rest_without_ours = rest(at, at.sampler).await?;
    let (creating_without_ours, control_creations) = whole_gc_cycles(api, at.sampler, || async {
        let took = fleet::create_at_rate(api, windows.control, at.rate).await?;
        super::wait_running(api, windows.running_after_control).await?;
        Ok(took)
    })
    .await?;
    timed.control_creations = control_creations;

    let watches_before = measure::pod_watches(api).await?;
    let mut ours = ours::Ours::start(at.setup, at.agents).await?;
    // at rest means every agent's watch is open: their first lists are not rest
    let expected = watches_before + at.agents.len() as f64 + 1.0;
    ours.agents_started_seconds += wait_watches(api, |open| open >= expected).await?;
    tokio::time::sleep(SETTLE).await;
    let sampler = at.sampler.with(&ours.processes());
    let at_rest = rest(at, &sampler).await?;
    let pod_watches = measure::pod_watches(api).await?;

    let count = windows.measured.len();
    let window_time = Duration::from_secs_f64(count as f64 / at.rate) + CONFIRM_GRACE;
    let confirming = pending::start(
        api,
        (Arc::clone(&ours.callback), Arc::clone(&ours.jwt)),
        &windows.batch,
        count,
        window_time,
    )
    .await?;
    let node_tokens = node_tokens(api, at.agents, count / PODS_PER_NODE_CONFIRMATION).await?;
    let (creating, (creations, node_confirmations)) = whole_gc_cycles(api, &sampler, || async {
        let nodes = confirm_nodes(
            Arc::clone(&ours.callback),
            node_tokens,
            at.rate / PODS_PER_NODE_CONFIRMATION as f64,
        );
        let took = fleet::create_at_rate(api, windows.measured, at.rate).await?;
        super::wait_running(api, windows.running_after_measured).await?;
        Ok((took, nodes.await.context("the node confirmations' task")??))
    })
    .await?;
    timed.creations = creations;
    timed.node_confirmations = node_confirmations;
    let confirmed = confirming.await.context("the confirmations' task")?;
    anyhow::ensure!(
        confirmed.failures == 0,
        "{} of {count} confirmations failed: {:?}",
        confirmed.failures,
        confirmed.failed
    );
    timed.confirmations = confirmed.took;
    timed.jwts = confirmed.jwt_took;
    let comparison = Comparison {
        api_share_at_rest: measure::share(&at_rest.processes, &at_rest_without_ours.processes),
        api_share_creating: measure::share(&creating.processes, &creating_without_ours.processes),
        at_rest_without_ours,
        creating_without_ours,
        at_rest,
        creating,
        agents_started_seconds: ours.agents_started_seconds,
        pod_watches,
    };
    Ok((ours, comparison, timed))
}

/// The control plane at rest for at least the run's rest span, in whole GC cycles.
async fn rest(at: &Against<'_>, sampler: &Sampler) -> anyhow::Result<Span> {
    let (span, ()) = whole_gc_cycles(at.api, sampler, || async {
        tokio::time::sleep(at.rest).await;
        Ok(())
    })
    .await?;
    Ok(span)
}

/// Runs `work` from just after one of the API server's GCs ends to just after the first to
/// end once `work` is done; each process's cost over that span.
async fn whole_gc_cycles<F, Fut, T>(
    api: &fleet::Api,
    sampler: &Sampler,
    work: F,
) -> anyhow::Result<(Span, T)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let first = next_gc(api, gc_cycles(api).await?).await?;
    let started = Instant::now();
    let (processes, (value, last)) = sampler
        .over(|| async {
            let value = work().await?;
            let last = next_gc(api, gc_cycles(api).await?).await?;
            Ok((value, last))
        })
        .await?;
    let span = Span {
        seconds: started.elapsed().as_secs_f64(),
        gc_cycles: last - first,
        processes,
    };
    Ok((span, value))
}

/// The API server's garbage collections so far (`go_gc_duration_seconds_count`).
async fn gc_cycles(api: &fleet::Api) -> anyhow::Result<f64> {
    let text = api.text("/metrics", "text/plain").await?;
    crate::scrape::samples(&text, "go_gc_duration_seconds_count")
        .map(|(_, v)| v)
        .next()
        .context("the API server's /metrics has no go_gc_duration_seconds_count")
}

/// Waits until the API server's GC count passes `seen`; the new count.
async fn next_gc(api: &fleet::Api, seen: f64) -> anyhow::Result<f64> {
    let waiting = Instant::now();
    loop {
        tokio::time::sleep(GC_POLL).await;
        let now = gc_cycles(api).await?;
        if now > seen {
            return Ok(now);
        }
        anyhow::ensure!(
            waiting.elapsed() < GC_WAIT,
            "the API server collected no garbage in {GC_WAIT:?}"
        );
    }
}

/// Waits until the pod watches the API server serves are as `wanted` says (the agents' all
/// open, or all closed); how long that took, seconds.
async fn wait_watches(api: &fleet::Api, wanted: impl Fn(f64) -> bool) -> anyhow::Result<f64> {
    let watching = Instant::now();
    loop {
        let open = measure::pod_watches(api).await?;
        if wanted(open) {
            return Ok(watching.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            watching.elapsed() < WATCHES_WAIT,
            "{open} pod watches open {WATCHES_WAIT:?} after the agents started or stopped"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Node-audience tokens of `count` agents spread over the nodes (asked before the window, as
/// the kubelet keeps an agent's projected token fresh ahead of its use).
async fn node_tokens(
    api: &fleet::Api,
    agents: &[AgentPod],
    count: usize,
) -> anyhow::Result<Vec<(String, athenz_core::secret::Secret)>> {
    let count = count.clamp(1, agents.len().max(1));
    let mut tokens = Vec::with_capacity(count);
    for agent in agents
        .iter()
        .step_by((agents.len() / count).max(1))
        .take(count)
    {
        tokens.push((
            agent.node.clone(),
            agent.token(api, Some(NODE_AUDIENCE)).await?,
        ));
    }
    Ok(tokens)
}

/// Confirms each agent's registration through the callback at `per_second`, each on time
/// whatever the earlier ones take; each confirmation's time (a refusal fails).
fn confirm_nodes(
    callback: Arc<super::callback::Callback>,
    tokens: Vec<(String, athenz_core::secret::Secret)>,
    per_second: f64,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<Duration>>> {
    tokio::spawn(async move {
        super::calls::at_rate(tokens, per_second, |(node, token)| {
            let callback = Arc::clone(&callback);
            async move { callback.confirm_node(&node, token).await }
        })
        .await
    })
}

/// Every comparison's latencies, pooled.
pub fn pooled(timed: Vec<Timed>) -> Timed {
    let mut all = Timed::default();
    for t in timed {
        all.control_creations.extend(t.control_creations);
        all.creations.extend(t.creations);
        all.confirmations.extend(t.confirmations);
        all.jwts.extend(t.jwts);
        all.node_confirmations.extend(t.node_confirmations);
    }
    all
}

/// The latencies of `took`, ms (none when empty).
pub fn latency(mut took: Vec<Duration>) -> Latency {
    Latency::of(&mut took)
}
