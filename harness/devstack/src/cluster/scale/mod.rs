//! `athenz-devstack cluster scale`: a cluster at Kubernetes' published limits on one machine
//! (docs/design.md §5.3, docs/benchmarks.md "A cluster at Kubernetes' limits"). The real API
//! server, etcd, controller-manager and scheduler (the node's binaries), kwok's controller
//! keeping thousands of fake nodes and playing their pods' lives ([`kwok`]), and the cluster's
//! objects made through the API server ([`fleet`], [`agents`]); at each scale point (nodes,
//! pods) what the control plane costs at rest and while pods are created at a steady rate,
//! with our parts ([`ours`]) and without them, several times ([`compare`], [`measure`]).
//!
//! Nothing here mounts or runs a container: the state dir holds etcd's data, the PKI and the
//! logs, and every process is stopped when the run ends, whatever its outcome.

pub mod admission;
pub mod agents;
pub mod callback;
pub mod calls;
pub mod compare;
pub mod fleet;
pub mod jwt;
pub mod kwok;
pub mod measure;
pub mod ours;
pub mod pending;
pub mod webhook;

use super::components::Starter;
use super::health::Checker;
use super::host;
use super::layout::Layout;
use super::nodes::NodeSpec;
use super::pki::{ClusterPki, ExtraClient};
use crate::procs::{Process, free_port};
use anyhow::Context;
use measure::{PointReport, Sampler};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tenant pods' API calls in flight while the cluster is filled to a point.
const FILL_PARALLEL: usize = 32;
/// etcd's backend quota: the 8 GiB etcd suggests as the most, since 150,000 pods and their
/// history outgrow the 2 GiB default.
const ETCD_QUOTA_BYTES: u64 = 8 << 30;
/// How long a callback with its cache full may take to list every pod.
const FULL_CACHE_WAIT: Duration = Duration::from_secs(600);
/// How long every pod made may take to run, per 1,000 pods.
const RUNNING_WAIT_PER_THOUSAND: Duration = Duration::from_secs(60);

/// One scale point: the cluster's nodes and pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ScalePoint {
    pub nodes: usize,
    pub pods: usize,
}

impl std::str::FromStr for ScalePoint {
    type Err = String;

    /// `NODES:PODS`, e.g. `5000:150000`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (nodes, pods) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?}: a scale point is NODES:PODS, e.g. 5000:150000"))?;
        let number = |what: &str, n: &str| {
            n.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{text:?}: {what} must be a whole number above zero"))
        };
        Ok(Self {
            nodes: number("the nodes", nodes)?,
            pods: number("the pods", pods)?,
        })
    }
}

/// What `cluster scale` is asked for.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// Where etcd's data, the PKI and the logs go (reset at the start).
    pub state_dir: PathBuf,
    /// The node's binaries (etcd, kube-apiserver, controller-manager, scheduler).
    pub kube_bin: PathBuf,
    /// kwok's binary.
    pub kwok_bin: PathBuf,
    /// The release's binaries (the callback's).
    pub release_bin: PathBuf,
    /// The scale points, each larger than the one before in nodes and pods.
    pub points: Vec<ScalePoint>,
    /// Pods a second in each point's measured window (an open arrival process).
    pub rate: f64,
    /// Pods created in each point's measured window (the point's last ones).
    pub window_pods: usize,
    /// How long the control plane is watched at rest at each point (at least: each span
    /// ends with the API server's next garbage collection).
    pub rest: Duration,
    /// Comparisons (with our parts and without) at each point.
    pub repeats: usize,
}

impl ScaleOptions {
    /// The points must grow, and each must hold its measured window.
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.points.is_empty(), "--points: name at least one");
        for pair in self.points.windows(2) {
            anyhow::ensure!(
                pair[1].nodes >= pair[0].nodes && pair[1].pods > pair[0].pods,
                "--points must grow: {}:{} then {}:{}",
                pair[0].nodes,
                pair[0].pods,
                pair[1].nodes,
                pair[1].pods
            );
        }
        anyhow::ensure!(self.repeats > 0, "--repeats must be above zero");
        anyhow::ensure!(
            self.window_pods > 0 && self.points[0].pods > 2 * self.repeats * self.window_pods,
            "--window-pods ({}) must be above zero and below the first point's pods ({}) over \
             twice --repeats ({}): each comparison has a control window and a measured window \
             of that many",
            self.window_pods,
            self.points[0].pods,
            self.repeats
        );
        anyhow::ensure!(
            self.rate.is_finite() && self.rate > 0.0,
            "--rate must be above zero"
        );
        Ok(())
    }
}

/// Runs every point, adding what each measured to `points` as it ends (so a run that fails at
/// a later point keeps the earlier ones); every process is stopped at the end.
pub async fn run(
    options: &ScaleOptions,
    report: &mut dyn FnMut(String),
    points: &mut Vec<PointReport>,
) -> anyhow::Result<()> {
    options.check()?;
    let layout = Layout::new(&options.state_dir, &options.kube_bin)?;
    layout.reset()?;
    let mut processes = Vec::new();
    let outcome = run_points(options, &layout, &mut processes, report, points).await;
    for process in processes.iter_mut().rev() {
        process.stop().await;
    }
    outcome
}

/// The processes whose cost is measured, by name, and where their own figures are read.
struct Measured {
    /// The control plane's processes (etcd, the API server, controller-manager, scheduler,
    /// kwok); ours are added while they run.
    sampler: Sampler,
    etcd_url: String,
}

/// What deploy/ grants our parts: its namespaces and `deploy/base/rbac.yaml` as shipped (the
/// agents and the callback authenticate as those service accounts' users).
fn grant_as_deploy_does(layout: &Layout) -> anyhow::Result<()> {
    let kubectl = super::kubectl::Kubectl::new(layout);
    for namespace in ["athenz-system", "k8s-admin"] {
        kubectl.run(&["create", "namespace", namespace])?;
    }
    let rbac = super::workspace_path("deploy/base/rbac.yaml");
    let text =
        std::fs::read_to_string(&rbac).with_context(|| format!("reading {}", rbac.display()))?;
    kubectl.apply_manifest(&text, "deploy/base/rbac.yaml")?;
    Ok(())
}

/// The clients of ours the API server knows, each as its service account's user.
fn our_clients() -> [ExtraClient; 3] {
    let client = |name, user: &str| ExtraClient {
        name,
        user: user.to_owned(),
        group: Some("system:serviceaccounts"),
    };
    [
        client("athenz-agent", agents::AGENT_USER),
        client("athenz-callback", callback::CALLBACK_USER),
        client("athenz-initializer", webhook::INITIALIZER_USER),
    ]
}

async fn run_points(
    options: &ScaleOptions,
    layout: &Layout,
    processes: &mut Vec<Process>,
    report: &mut dyn FnMut(String),
    points: &mut Vec<PointReport>,
) -> anyhow::Result<()> {
    let ip = host::default_ipv4()?;
    let api_port = free_port()?;
    let api_url = format!("https://{ip}:{api_port}");
    let control = NodeSpec {
        index: 0,
        name: "scale-control-plane".to_owned(),
        ip,
    };
    let pki = ClusterPki::create_with_clients(layout, &[control], &api_url, false, &our_clients())?;
    let checker = Checker::new(&pki.ca, &pki.admin.cert, &pki.admin.key, &api_url)?;
    let mut up = Starter {
        layout,
        processes,
        checker,
        report,
    };
    let etcd_url = up.etcd_with_quota(ETCD_QUOTA_BYTES).await?;
    up.api_server(
        &pki,
        ip,
        api_port,
        &etcd_url,
        &api_url,
        &super::node_authorizer::Authorization::NodeRbac,
    )
    .await?;
    up.controller_manager_and_scheduler(&pki, false).await?;
    let kwok = kwok::start(
        &options.kwok_bin,
        pki.kubeconfig("admin")?,
        &layout.dir,
        &layout.logs,
        free_port()?,
    )
    .await?;
    processes.push(kwok);
    grant_as_deploy_does(layout)?;
    let kubectl = super::kubectl::Kubectl::new(layout);
    let webhook_at = (ip, free_port()?);
    let setup = ours::Setup {
        release_bin: options.release_bin.clone(),
        dir: layout.dir.clone(),
        logs: layout.logs.clone(),
        initializer_kubeconfig: pki.kubeconfig("athenz-initializer")?.to_owned(),
        callback_kubeconfig: pki.kubeconfig("athenz-callback")?.to_owned(),
        agents_kubeconfig: pki.kubeconfig("athenz-agent")?.to_owned(),
        webhook_config: webhook::install(&kubectl, webhook_at.0, webhook_at.1)?,
        webhook_at,
        trust: Arc::new(jwt::RunTrust::create(&layout.dir)?),
    };
    let measured = Measured {
        sampler: Sampler::of(processes),
        etcd_url,
    };
    let api = fleet::Api::new(&pki, &api_url)?;
    fleet::create_all(
        &api,
        fleet::namespace_with_account(fleet::CONTROL_NAMESPACE, false),
        1,
    )
    .await?;
    let mut made = Made {
        ours: Some(ours::Ours::start(&setup, &[]).await?),
        ..Made::default()
    };
    report(
        "the initializer in the pods' path and the callback up, as deploy/ grants them".to_owned(),
    );
    for (index, point) in options.points.iter().enumerate() {
        let context = Point {
            options,
            index,
            point: *point,
            api: &api,
            measured: &measured,
            setup: &setup,
        };
        points.push(run_point(&context, &mut made, report).await?);
    }
    if let Some(ours) = made.ours.take() {
        ours.stop().await;
    }
    Ok(())
}

/// What the run has made so far.
#[derive(Default)]
struct Made {
    nodes: usize,
    namespaces: usize,
    /// Pods in the tenant namespaces, and in the control namespace.
    pods: usize,
    control_pods: usize,
    /// Every node's agent pod.
    agents: Vec<agents::AgentPod>,
    /// Our parts, when running.
    ours: Option<ours::Ours>,
}

/// One point of the run and what it runs against.
struct Point<'a> {
    options: &'a ScaleOptions,
    index: usize,
    point: ScalePoint,
    api: &'a fleet::Api,
    measured: &'a Measured,
    setup: &'a ours::Setup,
}

/// Grows the cluster to `point`: nodes with their agent pods, namespaces and pods up to the
/// comparisons' windows (our parts running, the webhook in the pods' path); then each
/// comparison ([`compare::once`]); then a callback with its cache full.
async fn run_point(
    at: &Point<'_>,
    made: &mut Made,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<PointReport> {
    let (options, point, api) = (at.options, at.point, at.api);
    let started = Instant::now();
    fleet::create_all(
        api,
        (made.nodes..point.nodes).map(fleet::node),
        FILL_PARALLEL,
    )
    .await?;
    made.agents.extend(
        agents::AgentPod::create_all(
            api,
            (made.nodes..point.nodes).map(fleet::node_name),
            FILL_PARALLEL,
        )
        .await?,
    );
    made.nodes = point.nodes;
    let namespaces = point.pods.div_ceil(fleet::PODS_PER_NAMESPACE);
    fleet::create_all(
        api,
        (made.namespaces..namespaces).flat_map(fleet::namespace),
        FILL_PARALLEL,
    )
    .await?;
    made.namespaces = namespaces;
    let window = options.window_pods;
    let filled = point.pods - 2 * options.repeats * window - made.control_pods;
    fleet::create_all(
        api,
        (made.pods..filled).map(|n| fleet::pod(n, point.nodes, &format!("{}-fill", at.index))),
        FILL_PARALLEL,
    )
    .await?;
    made.pods = filled;
    wait_running(api, filled + made.control_pods).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    report(format!(
        "{} nodes and their agent pods, {filled} pods running in {fill_seconds:.0} s",
        point.nodes
    ));

    let against = compare::Against {
        api,
        sampler: &at.measured.sampler,
        setup: at.setup,
        agents: &made.agents,
        rest: options.rest,
        rate: options.rate,
    };
    let webhook_before = webhook_buckets(api).await?;
    let (mut comparisons, mut timed) = (Vec::new(), Vec::new());
    for repeat in 0..options.repeats {
        let running = made.pods + made.control_pods;
        let windows = compare::Windows {
            control: (made.control_pods..made.control_pods + window)
                .map(|n| {
                    fleet::control_pod(n, point.nodes, &format!("{}-control-{repeat}", at.index))
                })
                .collect(),
            measured: (made.pods..made.pods + window)
                .map(|n| fleet::pod(n, point.nodes, &format!("{}-window-{repeat}", at.index)))
                .collect(),
            batch: format!("{}-window-{repeat}", at.index),
            running_after_control: running + window,
            running_after_measured: running + 2 * window,
        };
        let (ours, comparison, times) = compare::once(&against, made.ours.take(), windows).await?;
        made.ours = Some(ours);
        made.control_pods += window;
        made.pods += window;
        report(format!(
            "  comparison {}: our share of the API server's CPU {:.1} % at rest, {:.1} % creating",
            repeat + 1,
            comparison.api_share_at_rest * 100.0,
            comparison.api_share_creating * 100.0
        ));
        comparisons.push(comparison);
        timed.push(times);
    }
    let webhook =
        admission::WebhookLatency::of(&webhook_buckets(api).await?.since(&webhook_before));
    let ours = made
        .ours
        .as_ref()
        .context("our parts stopped after the comparisons")?;
    let callback_cached_pods = measure::callback_cached_pods(&ours.callback_ops).await?;
    let full_cache = full_cache(at, ours, made.pods).await?;
    let timed = compare::pooled(timed);
    let share = |of: fn(&measure::Comparison) -> f64| {
        measure::ShareEstimate::of(&comparisons.iter().map(of).collect::<Vec<_>>())
    };
    let point_report = PointReport {
        nodes: point.nodes,
        pods: point.pods,
        agent_pods: made.agents.len(),
        fill_seconds,
        rate: options.rate,
        control_creation: compare::latency(timed.control_creations),
        creation: compare::latency(timed.creations),
        webhook,
        confirmation: compare::latency(timed.confirmations),
        jwt: compare::latency(timed.jwts),
        node_confirmations: timed.node_confirmations.len(),
        node_confirmation: compare::latency(timed.node_confirmations),
        callback_cached_pods,
        full_cache,
        api_share_at_rest: share(|c| c.api_share_at_rest),
        api_share_creating: share(|c| c.api_share_creating),
        comparisons,
        etcd_db_bytes: measure::etcd_db_bytes(&at.measured.etcd_url).await?,
    };
    report(point_report.line());
    Ok(point_report)
}

/// The API server's histogram of our webhook's calls, now.
async fn webhook_buckets(api: &fleet::Api) -> anyhow::Result<admission::Buckets> {
    let page = api.text("/metrics", "text/plain").await?;
    Ok(admission::Buckets::parse(&page, webhook::WEBHOOK_NAME)?)
}

/// Starts a callback whose cache holds every injected pod (`injected` of them), waits until it
/// holds them all, and reads its memory beside the shipped callback's; then stops it.
async fn full_cache(
    at: &Point<'_>,
    ours: &ours::Ours,
    injected: usize,
) -> anyhow::Result<measure::FullCache> {
    let started = Instant::now();
    let (mut process, ops, _) = ours::start_full_cache(at.setup).await?;
    let (api_costs, pods) = at
        .measured
        .sampler
        .over(|| async {
            loop {
                let held = measure::callback_cached_pods(&ops).await.unwrap_or(0.0);
                if held >= injected as f64 {
                    return Ok(held);
                }
                anyhow::ensure!(
                    started.elapsed() < FULL_CACHE_WAIT,
                    "the full cache held {held} of {injected} pods after {FULL_CACHE_WAIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await?;
    let list_seconds = started.elapsed().as_secs_f64();
    let full = process.usage();
    let shipped = ours.callback_process.usage();
    let pending_pods = measure::callback_cached_pods(&ours.callback_ops).await?;
    process.stop().await;
    let kib = |k: u64| k as f64 / 1024.0;
    Ok(measure::FullCache {
        pods,
        rss_mib: kib(full.rss_kib),
        pending_rss_mib: kib(shipped.rss_kib),
        pending_pods,
        bytes_per_pod: (full.rss_kib as f64 - shipped.rss_kib as f64) * 1024.0
            / (pods - pending_pods).max(1.0),
        list_seconds,
        list_cpu_seconds: full.cpu_seconds,
        api_server_cpu_seconds: measure::api_server_cores(&api_costs) * list_seconds,
    })
}

/// Waits until `pods` of the run's pods run (kwok has played their start).
pub(crate) async fn wait_running(api: &fleet::Api, pods: usize) -> anyhow::Result<()> {
    let limit = RUNNING_WAIT_PER_THOUSAND * u32::try_from(pods.div_ceil(1000)).unwrap_or(u32::MAX);
    let started = Instant::now();
    loop {
        let running = api.count_pods("status.phase=Running").await?;
        if running >= pods {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < limit,
            "{running} of {pods} pods running after {limit:?} (kwok's log says why)"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn options(points: &[&str], window: usize) -> ScaleOptions {
        ScaleOptions {
            state_dir: PathBuf::from("/nonexistent"),
            kube_bin: PathBuf::from("/nonexistent"),
            kwok_bin: PathBuf::from("/nonexistent"),
            release_bin: PathBuf::from("/nonexistent"),
            points: points.iter().map(|p| p.parse().unwrap()).collect(),
            rate: 50.0,
            window_pods: window,
            rest: Duration::from_secs(1),
            repeats: 1,
        }
    }

    #[test]
    fn points_are_read_and_checked() {
        assert_eq!(
            "5000:150000".parse::<ScalePoint>().unwrap(),
            ScalePoint {
                nodes: 5000,
                pods: 150_000
            }
        );
        for bad in ["5000", "0:10", "10:0", "a:1", "1:-1", ":"] {
            assert!(bad.parse::<ScalePoint>().is_err(), "{bad}");
        }
        options(&["10:100", "20:200"], 40).check().unwrap();
        let shrinking = options(&["20:200", "10:300"], 50).check().unwrap_err();
        assert!(shrinking.to_string().contains("must grow"), "{shrinking}");
        let same_pods = options(&["10:200", "20:200"], 50).check().unwrap_err();
        assert!(same_pods.to_string().contains("must grow"), "{same_pods}");
        let window = options(&["10:100"], 50).check().unwrap_err();
        assert!(window.to_string().contains("--window-pods"), "{window}");
        assert!(options(&[], 1).check().is_err());
    }
}
