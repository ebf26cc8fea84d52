//! `athenz-devstack cluster`: a real single-node Kubernetes cluster on this machine
//! (docs/design.md §5.1), built from Kubernetes' own Go modules by `harness/real-node/kube/build.sh`: embedded
//! etcd, the API server, controller-manager, scheduler, containerd 2 with runc, the kubelet and
//! kube-proxy, with a CNI bridge for pods. The stand-ins keep the first command fast; this is where
//! every Kubernetes-facing claim is proven.
//!
//! `cluster up --bare` starts the Kubernetes part alone (the Athenz side is not added yet), waits
//! until the node is Ready, writes `DIR/kubeconfig` and `DIR/cluster.json`, supervises until
//! SIGTERM or Ctrl-C and then takes everything down again. `cluster down` does the same from
//! another process, from what the state dir records, and is safe to run any number of times.
//!
//! Everything it makes lives under the state dir, except what Kubernetes fixes elsewhere:
//! `/var/lib/kubelet` (CSI and plugin registration paths depend on it), the cgroups under
//! `/kubepods`, the iptables chains, the `cni0` bridge and the sockets under
//! `/run/athenz-devstack-cluster/` (a Unix socket path must stay under 108 bytes, a state dir
//! need not).

pub mod bench;
pub mod components;
pub mod config;
pub mod control_plane;
pub mod dns;
pub mod end_to_end;
pub mod features;
pub mod health;
pub mod host;
pub mod images;
pub mod info;
pub mod install;
pub mod installed;
pub mod iptables;
pub mod kubectl;
pub mod layout;
pub mod node_authorizer;
pub mod node_build;
pub mod node_loss;
mod node_start;
pub mod nodes;
pub mod pki;
pub mod previous_release;
pub mod runbook;
pub mod scale;
pub mod scenario;
pub mod spire;
pub mod storage_e2e;
pub mod teardown;
pub mod tenant_domains;
pub mod tenant_pods;

pub use info::ClusterInfo;
pub use layout::{Layout, NodeLock};

use crate::procs::Process;
use anyhow::Context;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The Kubernetes release `harness/real-node/kube/build.sh` builds by default (its pin).
pub const KUBE_VERSION: &str = "v1.37.2";
/// The containerd namespace the CRI plugin (so the kubelet) uses.
pub const CONTAINERD_NAMESPACE: &str = "k8s.io";
/// The pods' network (kube-proxy's `clusterCIDR`, the controller-manager's `--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The node's pod range: the first /24 of [`CLUSTER_CIDR`], which the controller-manager
/// allocates to the first (only) node, and the CNI bridge's subnet.
pub const NODE_POD_CIDR: &str = "10.244.0.0/24";
/// The Services' range; its first address is the `kubernetes` Service.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's ClusterIP, in the API server's certificate.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The `kube-dns` Service's address, where the kubelet tells pods cluster DNS is (CoreDNS runs
/// behind it, except with `--bare`).
pub const CLUSTER_DNS: &str = "10.96.0.10";
/// The bridge the CNI `bridge` plugin makes.
pub const BRIDGE: &str = "cni0";
/// The CNI network's name (it names the IPAM and result cache entries and the iptables rules'
/// comments).
pub const CNI_NETWORK: &str = "athenz-devstack";
/// The service-account issuer, as a conformant cluster names it.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// What `cluster up` was asked for.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where everything lives.
    pub state_dir: PathBuf,
    /// The directory holding `kube` (and its component symlinks), `containerd`, `ctr` and
    /// `containerd-shim-runc-v2`.
    pub kube_bin: PathBuf,
    /// The node's address; the source address of the default route when `None`.
    pub node_ip: Option<Ipv4Addr>,
    /// The node's name; this host's name (lowercased) when `None`.
    pub node_name: Option<String>,
    /// How many nodes: the host's, and each further one in namespaces of its own
    /// ([`nodes`]).
    pub nodes: usize,
    /// The release to install (cluster DNS, the dev ZTS, the image, `deploy/overlays/local`);
    /// `None` stops at a Ready node (`--bare`).
    pub release: Option<install::Release>,
    /// Whether the API server authorizes with the node authorizer's chain, the authorizer
    /// running on the host ([`node_authorizer`]; `--node-authorizer`).
    pub node_authorizer: bool,
}

/// The default release archive: what `deploy/image.sh` writes for this workspace's version.
pub fn default_image_archive() -> PathBuf {
    workspace_path(&format!(
        "target/image/athenz-k8s-identity-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// The default `deploy/`: this workspace's.
pub fn default_deploy_dir() -> PathBuf {
    workspace_path("deploy")
}

/// `relative` under the current directory when it exists there, else under the workspace this
/// executable was built in (`<workspace>/target/<profile>/athenz-devstack`).
pub(crate) fn workspace_path(relative: &str) -> PathBuf {
    let here = PathBuf::from(relative);
    if here.exists() {
        return here;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|a| a.file_name().is_some_and(|n| n == "target"))
                .and_then(Path::parent)
                .map(|workspace| workspace.join(relative))
        })
        .filter(|p| p.exists())
        .unwrap_or(here)
}

/// The default `--kube-bin`: `target/kube/<version>/bin` of this workspace, found from the
/// current directory or, failing that, from this executable (`target/<profile>/athenz-devstack`).
/// While `harness/real-node/kube/build.sh` is building it, this waits for that build to end
/// (at most [`node_build::BUILD_WAIT`]), so a test started beside the build finds it whole.
pub fn default_kube_bin() -> PathBuf {
    let dir = workspace_path(&format!("target/kube/{KUBE_VERSION}/bin"));
    node_build::wait_for_build(&dir, node_build::BUILD_WAIT);
    dir
}

/// A running cluster: its processes (in start order) and what `cluster.json` says.
pub struct Cluster {
    /// Where it lives.
    pub layout: Layout,
    /// `cluster.json`.
    pub info: ClusterInfo,
    processes: Vec<Process>,
    /// The host's node is this cluster's while it runs.
    _node: NodeLock,
}

impl Cluster {
    /// Starts every component and waits until the node is Ready. On failure whatever was
    /// started is taken down again before the error (which names what did not come up, with the
    /// tail of its log) is returned.
    pub async fn start(
        options: &ClusterOptions,
        report: &mut dyn FnMut(String),
    ) -> anyhow::Result<Self> {
        let layout = Layout::new(&options.state_dir, &options.kube_bin)?;
        let node = match NodeLock::take(&layout.dir)? {
            Ok(node) => node,
            Err(holder) => anyhow::bail!(
                "another cluster is up on this host (state dir {holder}), and a host runs one \
                 node: /var/lib/kubelet, the /kubepods cgroups, {BRIDGE} and the iptables chains \
                 are the host's. Take it down first: athenz-devstack cluster down --state-dir \
                 {holder}"
            ),
        };
        // a crash of an earlier run leaves its processes, mounts and rules, and an earlier
        // cluster's etcd and containerd state would not match the new PKI: start clean
        teardown::clean(&layout, true, &mut |_| {}).await?;
        layout.reset()?;
        let mut processes = Vec::new();
        let started = async {
            let mut info = components::start_all(&layout, options, &mut processes, report).await?;
            if let Some(release) = &options.release {
                let node_ip = info.node_ip.parse().context("the node's address")?;
                let installed =
                    install::install(&layout, node_ip, release, &mut processes, report).await?;
                info.zts = Some(installed.zts);
                info.image = Some(installed.image);
                info.overlay = Some(installed.overlay);
                info.pids = layout::pids(&processes);
            }
            // cluster.json appears only once everything asked for is ready
            crate::json_file::write_atomically(&layout.cluster_json, &info)?;
            anyhow::Ok(info)
        }
        .await;
        match started {
            Ok(info) => Ok(Self {
                layout,
                info,
                processes,
                _node: node,
            }),
            Err(e) => {
                report("start failed; taking down what was started".to_owned());
                stop_processes(&mut processes).await;
                if let Err(clean) = teardown::clean(&layout, true, &mut |_| {}).await {
                    report(format!("cleaning up after the failed start: {clean:#}"));
                }
                drop(processes);
                Err(e)
            }
        }
    }

    /// Restarts any component that exited (as a supervisor restarts a crashed daemon) and
    /// records the new pids; returns the names of those restarted.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<String>> {
        let mut restarted = Vec::new();
        for process in &mut self.processes {
            // a node stopped on purpose (`cluster stop-node`) stays down
            if node_loss::is_on_stopped_node(&self.layout, &process.command.name) {
                continue;
            }
            if process.restart_if_exited()? {
                restarted.push(process.command.name.clone());
            }
        }
        if !restarted.is_empty() {
            self.info.pids = layout::pids(&self.processes);
            layout::write_pids(&self.layout, &self.processes)?;
            crate::json_file::write_atomically(&self.layout.cluster_json, &self.info)?;
        }
        Ok(restarted)
    }

    /// Stops every component and removes everything the cluster made: the kubelet and
    /// kube-proxy first (so nothing recreates a pod or a rule), then the containers through
    /// containerd, containerd, the control plane, etcd last.
    pub async fn stop(mut self, report: &mut dyn FnMut(String)) -> anyhow::Result<()> {
        stop_processes(&mut self.processes).await;
        let cleaned = teardown::clean(&self.layout, true, report).await;
        drop(self.processes);
        cleaned
    }
}

/// Stops the kubelet and kube-proxy (so nothing recreates a pod or a rule); the rest go in
/// [`teardown::clean`], by their recorded pids, once the containers are deleted through
/// containerd. (The handles dropped afterwards only reap them.)
async fn stop_processes(processes: &mut Vec<Process>) {
    for component in [components::KUBELET, components::KUBE_PROXY] {
        while let Some(at) = processes
            .iter()
            .position(|p| components::is_component(&p.command.name, component))
        {
            processes.remove(at).stop().await;
        }
    }
}

/// Starts the cluster as this process's (`cluster down` asks it to stop), unless `stop` comes
/// first: then whatever had started is taken down and there is no cluster.
async fn start_unless_stopped(
    options: &ClusterOptions,
    stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<Option<Cluster>> {
    let layout = Layout::new(&options.state_dir, &options.kube_bin)?;
    layout.write_supervisor_pid()?;
    tokio::select! {
        result = Cluster::start(options, &mut *report) => result.map(Some),
        () = stop => {
            report("stopped while starting; taking everything down".into());
            // the processes started so far were dropped (and killed) with the start
            clean_up(&layout, report).await.map(|()| None)
        }
    }
}

/// `cluster up`: start, describe, supervise until SIGTERM or Ctrl-C, take down.
pub async fn up(options: ClusterOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let stop = athenz_core::http::termination_signal();
    tokio::pin!(stop);
    let mut report = |line: String| println!("{line}");
    let Some(mut cluster) = start_unless_stopped(&options, stop.as_mut(), &mut report).await?
    else {
        return Ok(());
    };
    let info = &cluster.info;
    println!(
        "cluster is up in {:.1} s; cluster.json: {}",
        started.elapsed().as_secs_f64(),
        cluster.layout.cluster_json.display()
    );
    println!("  Kubernetes       {}", info.kubernetes_version);
    println!("  API server       {}", info.api_server.url);
    for node in &info.nodes {
        println!(
            "  node             {} ({}, pods {}){}",
            node.name,
            node.ip,
            node.pod_cidr,
            match &node.namespaces {
                Some(ns) => format!(" in {}", ns.net.display()),
                None => String::new(),
            }
        );
    }
    println!("  kubeconfig       {}", info.kubeconfig.display());
    println!(
        "  containerd       {} (namespace {})",
        info.containerd.socket.display(),
        info.containerd.namespace
    );
    println!("  logs             {}", cluster.layout.logs.display());
    println!(
        "  try              {} --kubeconfig {} get nodes -o wide",
        info.kube_bin.join("kubectl").display(),
        info.kubeconfig.display()
    );
    println!("Ctrl-C to stop.");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = tick.tick() => {
                for name in cluster.restart_exited()? {
                    eprintln!("{name} exited; restarted it");
                }
            }
        }
    }
    println!("stopping");
    let stopping = Instant::now();
    cluster.stop(&mut report).await?;
    println!(
        "cluster is down in {:.1} s",
        stopping.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cluster demo`: starts the cluster with our release, runs the end-to-end
/// ([`scenario::Scenario::run_all`]), prints each pod's identity, takes the cluster down.
/// Returns whether every check passed.
pub async fn demo(options: ClusterOptions, json: bool) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut report = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    let cluster = Cluster::start(&options, &mut report).await?;
    report(format!(
        "Kubernetes {} with our release up in {:.1} s",
        cluster.info.kubernetes_version,
        started.elapsed().as_secs_f64()
    ));
    let outcome = run_scenario(&cluster);
    let stopped = cluster.stop(&mut |_| {}).await;
    // what the scenario found is printed whatever the teardown says; a teardown that leaves
    // something behind then fails the command, naming it
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("cluster demo failed: {e:#}");
            stopped?;
            return Ok(false);
        }
    };
    let identities = &outcome.identities;
    if json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        println!(
            "{:<11} {:<34} {:<12} {:<12} {:<20} expires",
            "mode", "pod", "node", "pod IP", "principal"
        );
        for id in identities {
            println!(
                "{:<11} {:<34} {:<12} {:<12} {:<20} {}",
                serde_json::to_value(id.mode)?.as_str().unwrap_or_default(),
                format!("{}/{}", id.namespace, id.pod),
                id.node,
                id.pod_ip,
                id.principal,
                id.not_after
            );
        }
        let features = &outcome.features;
        println!(
            "{}/{} (no mode annotation, Pod Security restricted): role certificate {}, access \
             token from its token server (scp {}), SDS served {}",
            features.identity.namespace,
            features.identity.pod,
            features.role_certificate,
            features.access_token_scope.join(" "),
            features.sds_principal
        );
        println!(
            "the template change allowing flex reached the initializer in {:.1} s, no restart",
            outcome.template_change.as_secs_f64()
        );
        println!(
            "every app container read a certificate naming its pod, verified to the ZTS CA \
             ({:.1} s in all)",
            started.elapsed().as_secs_f64()
        );
    }
    stopped?;
    Ok(true)
}

/// What a bench on a real node reports: as JSON, or as lines.
pub trait BenchResult: serde::Serialize {
    /// The report as lines.
    fn table(&self) -> String;
}

impl BenchResult for bench::BenchReport {
    fn table(&self) -> String {
        bench::BenchReport::table(self)
    }
}

impl BenchResult for bench::flood::FloodReport {
    fn table(&self) -> String {
        bench::flood::FloodReport::table(self)
    }
}

/// Starts the cluster with our release, runs `bench` on it, prints its report (JSON or lines)
/// and takes the cluster down; SIGTERM or Ctrl-C stops the bench and takes the cluster down too
/// (`cluster down --state-dir` asks it to). Progress goes to stderr with `--json`, so stdout
/// is the report alone.
async fn bench_on_cluster<R: BenchResult>(
    options: ClusterOptions,
    what: &str,
    json: bool,
    bench: impl AsyncFnOnce(&Cluster, &mut dyn FnMut(String)) -> anyhow::Result<R>,
) -> anyhow::Result<()> {
    let stop = athenz_core::http::termination_signal();
    tokio::pin!(stop);
    let mut report = |line: String| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let Some(cluster) = start_unless_stopped(&options, stop.as_mut(), &mut report).await? else {
        anyhow::bail!("stopped by a signal before the {what} began");
    };
    let outcome = tokio::select! {
        outcome = bench(&cluster, &mut report) => outcome,
        () = &mut stop => Err(anyhow::anyhow!(
            "stopped by a signal during the {what}; its cluster is taken down"
        )),
    };
    let stopped = cluster.stop(&mut |_| {}).await;
    let result = outcome?;
    stopped?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", result.table());
    }
    Ok(())
}

/// `cluster bench`: [`bench::run`] on a cluster started with our release ([`bench_on_cluster`]).
pub async fn bench_command(
    options: ClusterOptions,
    bench_options: bench::BenchOptions,
    json: bool,
) -> anyhow::Result<()> {
    bench_on_cluster(options, "bench", json, async |cluster, report| {
        bench::run(&cluster.layout, &cluster.info, bench_options, report).await
    })
    .await
}

/// `cluster flood`: [`bench::flood::run`] on a cluster started as `cluster up` would
/// ([`bench_on_cluster`]).
pub async fn flood_command(
    options: ClusterOptions,
    flood_options: bench::flood::FloodOptions,
    json: bool,
) -> anyhow::Result<()> {
    bench_on_cluster(options, "flood", json, async |cluster, report| {
        bench::flood::run(&cluster.layout, &cluster.info, flood_options, report).await
    })
    .await
}

/// Imports the apps' image and runs every workload of the scenario.
fn run_scenario(cluster: &Cluster) -> anyhow::Result<end_to_end::Outcome> {
    let zts = cluster
        .info
        .zts
        .as_ref()
        .context("the cluster has no dev ZTS (started --bare?)")?;
    scenario::Scenario::import_app_image(&cluster.layout)?;
    scenario::Scenario::new(&cluster.layout, &zts.ca).run_all()
}

/// `cluster down`: asks a running `cluster up` to stop (it takes its cluster down), then removes
/// whatever is left, from what the state dir records. Idempotent.
pub async fn down(state_dir: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let layout = Layout::existing(state_dir)?;
    let mut report = |line: String| println!("{line}");
    if let Some(pid) = layout.running_supervisor() {
        report(format!(
            "asking cluster up (pid {pid}) to stop and take its cluster down"
        ));
        teardown::terminate(pid, teardown::SUPERVISOR_GRACE).await;
    }
    clean_up(&layout, &mut report)
        .await
        .context("taking the cluster down")?;
    println!(
        "cluster is down in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// [`teardown::clean`] with the node lock when it can be had; when another cluster holds it,
/// only what is this cluster's own (its processes, its state dir's mounts) goes, and the host's
/// node state is left to the cluster that runs it.
async fn clean_up(layout: &Layout, report: &mut dyn FnMut(String)) -> anyhow::Result<()> {
    match NodeLock::take(&layout.dir)? {
        Ok(_node) => teardown::clean(layout, true, report).await,
        Err(holder) => {
            report(format!(
                "the cluster in {holder} runs this host's node: its cgroups, chains, {BRIDGE} and \
                 /var/lib/kubelet are left alone"
            ));
            teardown::clean(layout, false, report).await
        }
    }
}
