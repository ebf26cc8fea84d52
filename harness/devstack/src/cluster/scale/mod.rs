//! `athenz-devstack cluster scale`: a cluster at Kubernetes' published limits on one machine
//! (docs/design.md §5, docs/benchmarks.md "A cluster at Kubernetes' limits"). The real API
//! server, etcd, controller-manager and scheduler (the node's binaries), kwok's controller
//! keeping thousands of fake nodes and playing their pods' lives ([`kwok`]), and the cluster's
//! objects made through the API server ([`fleet`]); at each scale point (nodes, pods) what the
//! control plane costs at rest and while pods are created at a steady rate ([`measure`]).
//!
//! Nothing here mounts or runs a container: the state dir holds etcd's data, the PKI and the
//! logs, and every process is stopped when the run ends, whatever its outcome.

pub mod admission;
pub mod agents;
pub mod callback;
pub mod fleet;
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
/// How long past the window's last creation its last pods may take to be confirmed.
const CONFIRM_GRACE: Duration = Duration::from_secs(30);
/// How long every agent's watch may take to open once the agents start.
const WATCHES_WAIT: Duration = Duration::from_secs(300);
/// A pause between the last watch opened and the rest span.
const SETTLE: Duration = Duration::from_secs(5);
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
    /// How long the control plane is watched at rest at each point.
    pub rest: Duration,
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
        anyhow::ensure!(
            self.window_pods > 0 && self.points[0].pods > 2 * self.window_pods,
            "--window-pods ({}) must be above zero and below half the first point's pods ({}): \
             each point has a control window and a measured window of that many",
            self.window_pods,
            self.points[0].pods
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
    up.controller_manager_and_scheduler(&pki).await?;
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
        ours: Some(ours::Ours::start(&setup, std::iter::empty()).await?),
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

/// Grows the cluster to `point`: nodes, namespaces and pods up to the two windows (our parts
/// running, the webhook in the pods' path); then with ours stopped, the control plane at rest
/// and a control window of pods at the rate in a namespace not opted in; then with ours
/// started again (every node's agent), at rest and the measured window, each pod confirmed as
/// ZTS would; then a callback with its cache full.
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
    made.nodes = point.nodes;
    let namespaces = point.pods.div_ceil(fleet::PODS_PER_NAMESPACE);
    fleet::create_all(
        api,
        (made.namespaces..namespaces).flat_map(fleet::namespace),
        FILL_PARALLEL,
    )
    .await?;
    made.namespaces = namespaces;
    let filled = point.pods - 2 * options.window_pods - made.control_pods;
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
        "{} nodes, {filled} pods running in {fill_seconds:.0} s",
        point.nodes
    ));

    if let Some(ours) = made.ours.take() {
        ours.stop().await;
    }
    let sampler = &at.measured.sampler;
    let at_rest_without_ours = sampler.at_rest(options.rest).await;
    let control_batch = format!("{}-control", at.index);
    let control: Vec<_> = (made.control_pods..made.control_pods + options.window_pods)
        .map(|n| fleet::control_pod(n, point.nodes, &control_batch))
        .collect();
    let (creating_without_ours, mut control_creations) = sampler
        .over(|| async {
            let took = fleet::create_at_rate(api, control, options.rate).await?;
            wait_running(api, made.pods + made.control_pods + options.window_pods).await?;
            Ok(took)
        })
        .await?;
    made.control_pods += options.window_pods;

    let watches_before = measure::pod_watches(api).await?;
    let mut ours = ours::Ours::start(at.setup, (0..point.nodes).map(fleet::node_name)).await?;
    // at rest means every agent's watch is open: their first lists are not rest
    ours.agents_started_seconds +=
        wait_watches(api, watches_before + point.nodes as f64 + 1.0).await?;
    tokio::time::sleep(SETTLE).await;
    let sampler = sampler.with(&ours.processes());
    let at_rest = sampler.at_rest(options.rest).await;
    let pod_watches = measure::pod_watches(api).await?;
    let batch = format!("{}-window", at.index);
    let window: Vec<_> = (made.pods..made.pods + options.window_pods)
        .map(|n| fleet::pod(n, point.nodes, &batch))
        .collect();
    let window_time =
        Duration::from_secs_f64(options.window_pods as f64 / options.rate) + CONFIRM_GRACE;
    let confirming = pending::start(
        api,
        Arc::clone(&ours.callback),
        &batch,
        options.window_pods,
        window_time,
    )
    .await?;
    let webhook_before = webhook_buckets(api).await?;
    let (creating, mut creations) = sampler
        .over(|| async {
            let took = fleet::create_at_rate(api, window, options.rate).await?;
            wait_running(api, point.pods).await?;
            Ok(took)
        })
        .await?;
    made.pods += options.window_pods;
    let webhook =
        admission::WebhookLatency::of(&webhook_buckets(api).await?.since(&webhook_before));
    let mut confirmed = confirming.await.context("the confirmations' task")?;
    anyhow::ensure!(
        confirmed.failures == 0,
        "{} of {} confirmations failed: {:?}",
        confirmed.failures,
        options.window_pods,
        confirmed.failed
    );
    let callback_cached_pods = measure::callback_cached_pods(&ours.callback_ops).await?;
    let full_cache = full_cache(at, &ours, made.pods).await?;
    let point_report = PointReport {
        nodes: point.nodes,
        pods: point.pods,
        fill_seconds,
        rate: options.rate,
        control_creation: crate::bench::Latency::of(&mut control_creations),
        creation: crate::bench::Latency::of(&mut creations),
        webhook,
        confirmation: crate::bench::Latency::of(&mut confirmed.took),
        callback_cached_pods,
        full_cache,
        api_share_at_rest: measure::share(&at_rest, &at_rest_without_ours),
        api_share_creating: measure::share(&creating, &creating_without_ours),
        at_rest_without_ours,
        at_rest,
        agents_started_seconds: ours.agents_started_seconds,
        pod_watches,
        creating_without_ours,
        creating,
        etcd_db_bytes: measure::etcd_db_bytes(&at.measured.etcd_url).await?,
    };
    made.ours = Some(ours);
    report(point_report.line());
    Ok(point_report)
}

/// Waits until the API server serves `expected` pod watches; how long that took, seconds.
async fn wait_watches(api: &fleet::Api, expected: f64) -> anyhow::Result<f64> {
    let watching = Instant::now();
    loop {
        let open = measure::pod_watches(api).await?;
        if open >= expected {
            return Ok(watching.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            watching.elapsed() < WATCHES_WAIT,
            "{open} of {expected} pod watches open {WATCHES_WAIT:?} after the agents started"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
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
async fn wait_running(api: &fleet::Api, pods: usize) -> anyhow::Result<()> {
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
