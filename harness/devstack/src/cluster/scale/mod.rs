//! `athenz-devstack cluster scale`: a cluster at Kubernetes' published limits on one machine
//! (docs/design.md §5, docs/benchmarks.md "A cluster at Kubernetes' limits"). The real API
//! server, etcd, controller-manager and scheduler (the node's binaries), kwok's controller
//! keeping thousands of fake nodes and playing their pods' lives ([`kwok`]), and the cluster's
//! objects made through the API server ([`fleet`]); at each scale point (nodes, pods) what the
//! control plane costs at rest and while pods are created at a steady rate ([`measure`]).
//!
//! Nothing here mounts or runs a container: the state dir holds etcd's data, the PKI and the
//! logs, and every process is stopped when the run ends, whatever its outcome.

pub mod agents;
pub mod callback;
pub mod fleet;
pub mod kwok;
pub mod measure;
pub mod pending;

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
use std::time::{Duration, Instant};

/// The tenant pods' API calls in flight while the cluster is filled to a point.
const FILL_PARALLEL: usize = 32;
/// etcd's backend quota: the 8 GiB etcd suggests as the most, since 150,000 pods and their
/// history outgrow the 2 GiB default.
const ETCD_QUOTA_BYTES: u64 = 8 << 30;
/// How long past the window's last creation its last pods may take to be confirmed.
const CONFIRM_GRACE: Duration = Duration::from_secs(30);
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
            self.window_pods > 0 && self.points[0].pods > self.window_pods,
            "--window-pods ({}) must be above zero and below the first point's pods ({})",
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

/// Runs every point and returns what each measured; every process is stopped at the end.
pub async fn run(
    options: &ScaleOptions,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<Vec<PointReport>> {
    options.check()?;
    let layout = Layout::new(&options.state_dir, &options.kube_bin)?;
    layout.reset()?;
    let mut processes = Vec::new();
    let outcome = run_points(options, &layout, &mut processes, report).await;
    for process in processes.iter_mut().rev() {
        process.stop().await;
    }
    outcome
}

/// The processes whose cost is measured, by name, and where their own figures are read.
struct Measured {
    sampler: Sampler,
    etcd_url: String,
    /// The callback's ops address (its `/metrics`).
    callback_ops: String,
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

async fn run_points(
    options: &ScaleOptions,
    layout: &Layout,
    processes: &mut Vec<Process>,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<Vec<PointReport>> {
    let ip = host::default_ipv4()?;
    let api_port = free_port()?;
    let api_url = format!("https://{ip}:{api_port}");
    let control = NodeSpec {
        index: 0,
        name: "scale-control-plane".to_owned(),
        ip,
    };
    let agent_client = ExtraClient {
        name: "athenz-agent",
        user: agents::AGENT_USER.to_owned(),
        group: Some("system:serviceaccounts"),
    };
    let callback_client = ExtraClient {
        name: "athenz-callback",
        user: callback::CALLBACK_USER.to_owned(),
        group: Some("system:serviceaccounts"),
    };
    let pki = ClusterPki::create_with_clients(
        layout,
        &[control],
        &api_url,
        false,
        &[agent_client, callback_client],
    )?;
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
    let (callback_process, callback_ops, callback) = callback::Callback::start(
        &options.release_bin.join("athenz-callback"),
        pki.kubeconfig("athenz-callback")?,
        &layout.dir,
        &layout.logs,
    )
    .await?;
    processes.push(callback_process);
    report("the callback up, as deploy/ grants it".to_owned());
    let measured = Measured {
        sampler: Sampler::of(processes),
        etcd_url,
        callback_ops,
    };
    let api = fleet::Api::new(&pki, &api_url)?;
    let mut made = Made {
        agents_kubeconfig: pki.kubeconfig("athenz-agent")?.to_owned(),
        callback: Some(std::sync::Arc::new(callback)),
        ..Made::default()
    };
    let mut points = Vec::new();
    for (index, point) in options.points.iter().enumerate() {
        points.push(run_point(options, index, *point, &api, &measured, &mut made, report).await?);
    }
    Ok(points)
}

/// What the run has made so far.
#[derive(Default)]
struct Made {
    nodes: usize,
    namespaces: usize,
    pods: usize,
    /// The agents' identity.
    agents_kubeconfig: PathBuf,
    /// The simulated agents, one set per point (each for the nodes that point added).
    agents: Vec<agents::SimulatedAgents>,
    /// ZTS's way to the callback.
    callback: Option<std::sync::Arc<callback::Callback>>,
}

/// Grows the cluster to `point`: nodes, namespaces and pods up to the measured window; the
/// control plane at rest; then the window's pods at the rate.
async fn run_point(
    options: &ScaleOptions,
    index: usize,
    point: ScalePoint,
    api: &fleet::Api,
    measured: &Measured,
    made: &mut Made,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<PointReport> {
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
    let filled = point.pods - options.window_pods;
    fleet::create_all(
        api,
        (made.pods..filled).map(|n| fleet::pod(n, point.nodes, &format!("{index}-fill"))),
        FILL_PARALLEL,
    )
    .await?;
    made.pods = filled;
    wait_running(api, filled).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    report(format!(
        "{} nodes, {filled} pods running in {fill_seconds:.0} s",
        point.nodes
    ));

    let rest = measured.sampler.at_rest(options.rest).await;
    let watching = Instant::now();
    let nodes_added = made
        .agents
        .iter()
        .map(agents::SimulatedAgents::len)
        .sum::<usize>()..point.nodes;
    made.agents.push(
        agents::SimulatedAgents::start(&made.agents_kubeconfig, nodes_added.map(fleet::node_name))
            .await?,
    );
    let agents_started_seconds = watching.elapsed().as_secs_f64();
    let rest_with_agents = measured.sampler.at_rest(options.rest).await;
    let pod_watches = measure::pod_watches(api).await?;
    let batch = format!("{index}-window");
    let window: Vec<_> = (filled..point.pods)
        .map(|n| fleet::pod(n, point.nodes, &batch))
        .collect();
    let callback = made
        .callback
        .clone()
        .context("the callback was not started")?;
    let window_time =
        Duration::from_secs_f64(options.window_pods as f64 / options.rate) + CONFIRM_GRACE;
    let confirming =
        pending::start(api, callback, &batch, options.window_pods, window_time).await?;
    let (busy, mut creations) = measured
        .sampler
        .over(|| fleet::create_at_rate(api, window, options.rate))
        .await?;
    made.pods = point.pods;
    let mut confirmed = confirming.await.context("the confirmations' task")?;
    wait_running(api, point.pods).await?;
    anyhow::ensure!(
        confirmed.failures == 0,
        "{} of {} confirmations failed: {:?}",
        confirmed.failures,
        options.window_pods,
        confirmed.failed
    );
    let callback_cached = measure::callback_cached_pods(&measured.callback_ops).await?;
    let etcd_db_bytes = measure::etcd_db_bytes(&measured.etcd_url).await?;
    let point_report = PointReport {
        nodes: point.nodes,
        pods: point.pods,
        fill_seconds,
        rate: options.rate,
        creation: crate::bench::Latency::of(&mut creations),
        confirmation: crate::bench::Latency::of(&mut confirmed.took),
        callback_cached_pods: callback_cached,
        at_rest: rest,
        agents_started_seconds,
        pod_watches,
        at_rest_with_agents: rest_with_agents,
        creating: busy,
        etcd_db_bytes,
    };
    report(point_report.line());
    Ok(point_report)
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
        options(&["10:100", "20:200"], 50).check().unwrap();
        let shrinking = options(&["20:200", "10:300"], 50).check().unwrap_err();
        assert!(shrinking.to_string().contains("must grow"), "{shrinking}");
        let same_pods = options(&["10:200", "20:200"], 50).check().unwrap_err();
        assert!(same_pods.to_string().contains("must grow"), "{same_pods}");
        let window = options(&["10:100"], 100).check().unwrap_err();
        assert!(window.to_string().contains("--window-pods"), "{window}");
        assert!(options(&[], 1).check().is_err());
    }
}
