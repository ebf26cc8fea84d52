//! `cluster up|demo|bench|storage-e2e|scale|stop-node|down|previous-image`: a real Kubernetes cluster on this
//! machine (one node, or several with `--nodes`), with our release installed as an operator
//! installs it (or none: `--bare`).

use super::{passed_or_failed, runtime};
use athenz_devstack::bench::parse_arrival;
use athenz_devstack::cluster::{self, ClusterOptions, install::Release};
use athenz_devstack::stack::ZtsServer;
use std::path::PathBuf;
use std::process::ExitCode;

/// `cluster up|down`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Start etcd, the control plane, containerd, the kubelet and kube-proxy; wait until the
    /// node is Ready; add cluster DNS, a ZTS (the dev ZTS, or Athenz's with --zts athenz) and
    /// our release (deploy/overlays/local); write DIR/kubeconfig and DIR/cluster.json; keep
    /// running until Ctrl-C or SIGTERM, then take everything down.
    Up(UpArgs),
    /// `cluster up`, then the end-to-end: pods in flex, csi-socket and csi-files mode get
    /// their identity through the real kubelet and API server; prints what each app container
    /// read (checked against its pod); takes the cluster down. Exits 1 if any check fails.
    Demo(DemoArgs),
    /// `cluster up`, then what an identity adds to a pod's start on the real node: created →
    /// app container holding its certificate, per mode and for the same pod without identity,
    /// pods one per interval then a burst; the agent's RSS and CPU. Takes the cluster down.
    Bench(BenchArgs),
    /// What a flood of pods bound to the node and deleted at once does to ordinary pods
    /// starting there (early issuance's bounds): their times with and without it, and where
    /// the flood's cost landed.
    Flood(FloodArgs),
    /// What the node's logs say about a finished `cluster bench` run's pods, by kind and phase:
    /// identity volumes' set-up, the kubelet's volume checks waited, and init containers' own
    /// run beside the kubelet's lag in noticing their exit (JSON).
    LogWaits(LogWaitsArgs),
    /// `cluster up`, then Kubernetes' own storage e2e suite (`e2e.test`, built by
    /// `harness/real-node/kube/build.sh --e2e`) against csi.athenz.io: "External Storage [Driver:
    /// csi.athenz.io]", the specs that apply to an inline ephemeral driver. Takes the cluster
    /// down. Exits 1 if a spec failed or none passed.
    StorageE2e(StorageE2eArgs),
    /// A cluster at Kubernetes' published limits on this machine: the real API server, etcd,
    /// controller-manager and scheduler, and kwok's controller (`harness/real-node/kube/build.sh
    /// --kwok`) keeping fake nodes and their pods; at each point NODES:PODS, the control
    /// plane's CPU and memory at rest and while pods are created at --rate, the creations'
    /// latency and etcd's size (JSON with --json). Everything is stopped at the end.
    Scale(ScaleArgs),
    /// Lose a further node of the running cluster in DIR, as a power cut loses it: its
    /// kubelet, kube-proxy, containerd and every container on it stop and stay stopped; its
    /// Node object stays (NotReady). `cluster down` still removes everything.
    StopNode(StopNodeArgs),
    /// Take the cluster in DIR down: its processes, containers, mounts, cgroups, iptables
    /// chains, bridge and IPAM state. Safe to run again.
    Down(DownArgs),
    /// The previous release's image (CHANGELOG.md's newest release, built from its commit
    /// with its own deploy/image.sh), found in the release cache or built into it; prints
    /// the OCI archive's path. The upgrade tests take it from there; CI builds it this way in
    /// the background, ahead of them.
    PreviousImage(PreviousImageArgs),
}

/// Each `cluster` command to the function that runs it.
pub fn run(command: ClusterCommand) -> anyhow::Result<ExitCode> {
    match command {
        ClusterCommand::Up(args) => up(args),
        ClusterCommand::Demo(args) => demo(args),
        ClusterCommand::Bench(args) => bench(args),
        ClusterCommand::Flood(args) => flood(args),
        ClusterCommand::LogWaits(args) => log_waits(&args),
        ClusterCommand::StorageE2e(args) => storage_e2e(args),
        ClusterCommand::Scale(args) => scale(args),
        ClusterCommand::StopNode(args) => stop_node(&args),
        ClusterCommand::Down(args) => down(&args),
        ClusterCommand::PreviousImage(args) => previous_image(&args),
    }
}

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Where everything lives (certificates, etcd, containerd, logs, cluster.json).
    #[arg(long)]
    state_dir: PathBuf,
    /// Kubernetes alone: stop at a Ready node, without cluster DNS, the dev ZTS and our
    /// release.
    #[arg(long)]
    bare: bool,
    /// The release image's OCI archive (deploy/image.sh writes it); default:
    /// target/image/athenz-k8s-identity-<version>.oci.tar of this workspace.
    #[arg(long, value_name = "FILE", conflicts_with = "bare")]
    image_archive: Option<PathBuf>,
    /// The deploy/ to install (its overlays/local is applied from a copy); default: this
    /// workspace's.
    #[arg(long, value_name = "DIR", conflicts_with = "bare")]
    deploy: Option<PathBuf>,
    /// The longest certificate the dev ZTS issues, in minutes (default: Athenz's 30 days);
    /// a few minutes make the refresh paths run while you watch.
    #[arg(long, value_name = "MINUTES", conflicts_with = "bare", value_parser = clap::value_parser!(u32).range(2..))]
    cert_minutes: Option<u32>,
    /// How the release is installed: docs/operating.md's "Install" steps (kustomize) or its
    /// "Install with Helm" steps (the chart in deploy/helm, with the helm next to kubectl).
    #[arg(long, value_enum, default_value = "kustomize", conflicts_with = "bare")]
    installer: cluster::install::Installer,
    /// The docs/operating.md whose install steps run (another release's, with its
    /// --deploy, to install that release as it was installed); default: the page this
    /// binary was built with.
    #[arg(long, value_name = "FILE", conflicts_with = "bare")]
    steps: Option<PathBuf>,
    /// A deploy/components/<NAME> to add to the overlay before the install, as an operator
    /// adds one (repeatable): legacy-kubelet-authz on Kubernetes before 1.33.
    #[arg(long = "component", value_name = "NAME", conflicts_with = "bare")]
    components: Vec<String>,
    /// Which ZTS issues: the dev ZTS, or Athenz's own built from its source by
    /// harness/peers/athenz/zts/build (docs/real-zts.md), told of each opted-in namespace's
    /// domain and services as they appear.
    #[arg(long, value_enum, default_value_t = ZtsServer::Dev, conflicts_with = "bare")]
    zts: ZtsServer,
    /// The binaries: kube (and its component symlinks), containerd, ctr, the runc shim;
    /// default: target/kube/v1.37.2/bin of this workspace.
    #[arg(long, value_name = "DIR")]
    kube_bin: Option<PathBuf>,
    /// The node's address; default: the source address of the default route.
    #[arg(long)]
    node_ip: Option<std::net::Ipv4Addr>,
    /// The node's name; default: this host's name.
    #[arg(long)]
    node_name: Option<String>,
    /// How many nodes: this host's, and each further one (`<name>-2`, ...) with its own
    /// network and mount namespaces, containerd, kubelet, kube-proxy and cgroup root.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=cluster::nodes::MAX_NODES as i64))]
    nodes: u16,
    /// Authorize with deploy/node-authorizer/authorization-config.yaml (Node, the node
    /// authorizer's webhook, RBAC) instead of --authorization-mode=Node,RBAC, the node authorizer
    /// running on this host on loopback with certificates from the cluster CA: the agents' pod
    /// list and watch are then scoped to their node.
    #[arg(long)]
    node_authorizer: bool,
}

fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let release = (!args.bare).then(|| Release {
        cert_minutes: args.cert_minutes,
        installer: args.installer,
        steps_page: args.steps,
        components: args.components,
        zts: args.zts,
        ..Release::new(args.image_archive, args.deploy)
    });
    if let Some(release) = &release {
        release.check()?;
    }
    let options = ClusterOptions {
        state_dir: args.state_dir,
        kube_bin: args.kube_bin.unwrap_or_else(cluster::default_kube_bin),
        node_ip: args.node_ip,
        node_name: args.node_name,
        nodes: usize::from(args.nodes),
        release,
        node_authorizer: args.node_authorizer,
    };
    runtime()?.block_on(cluster::up(options))?;
    Ok(ExitCode::SUCCESS)
}

/// Where a `cluster` command that installs our release keeps its state, and what it installs
/// and runs (the same options as `cluster up`'s).
#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    /// Where everything lives.
    #[arg(long)]
    state_dir: PathBuf,
    /// The release image's OCI archive (as for `cluster up`).
    #[arg(long, value_name = "FILE")]
    image_archive: Option<PathBuf>,
    /// The binaries (as for `cluster up`).
    #[arg(long, value_name = "DIR")]
    kube_bin: Option<PathBuf>,
    /// How many nodes (as for `cluster up`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=cluster::nodes::MAX_NODES as i64))]
    nodes: u16,
    /// A deploy/components/<NAME> for the overlay (as for `cluster up`; repeatable).
    #[arg(long = "component", value_name = "NAME")]
    components: Vec<String>,
    /// Which ZTS issues (as for `cluster up`).
    #[arg(long, value_enum, default_value_t = ZtsServer::Dev)]
    zts: ZtsServer,
}

impl ReleaseArgs {
    /// The options of a cluster that installs this release (checked, or built, first) from
    /// `deploy`, on a node with the default address and name.
    fn cluster_options(self, deploy: Option<PathBuf>) -> anyhow::Result<ClusterOptions> {
        let release = Release {
            components: self.components,
            zts: self.zts,
            ..Release::new(self.image_archive, deploy)
        };
        release.check()?;
        Ok(ClusterOptions {
            state_dir: self.state_dir,
            kube_bin: self.kube_bin.unwrap_or_else(cluster::default_kube_bin),
            node_ip: None,
            node_name: None,
            nodes: usize::from(self.nodes),
            release: Some(release),
            node_authorizer: false,
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    #[command(flatten)]
    release: ReleaseArgs,
    /// The deploy/ to install (as for `cluster up`).
    #[arg(long, value_name = "DIR")]
    deploy: Option<PathBuf>,
    /// Print the identities as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let options = args.release.cluster_options(args.deploy)?;
    let passed = runtime()?.block_on(cluster::demo(options, args.json))?;
    Ok(passed_or_failed(passed))
}

/// An identity system `cluster bench` can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSystem {
    /// athenz-k8s-identity.
    Athenz,
    /// SPIRE with the SPIFFE CSI driver.
    Spire,
}

/// How SPIRE's registration entries are made in `cluster bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpireEntries {
    /// With spire-server's CLI before the pods, one per namespace and service account.
    Cli,
    /// By spire-controller-manager beside spire-server, one per pod from a ClusterSPIFFEID.
    ControllerManager,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    release: ReleaseArgs,
    /// Pods created one per --interval, per mode.
    #[arg(long, default_value_t = 50)]
    sequential: usize,
    /// The time between two of those pods (each also placed within the kubelet's 100 ms loop
    /// period, spread evenly, so every kind meets the kubelet's phases alike).
    #[arg(long, default_value = "1s", value_parser = parse_arrival)]
    interval: std::time::Duration,
    /// Pods created at once, per mode.
    #[arg(long, default_value_t = 30)]
    burst: usize,
    /// How long the churn phase creates pods (0: no churn).
    #[arg(long, default_value = "120s", value_parser = parse_arrival)]
    churn: std::time::Duration,
    /// One churn pod created this often (placed as --interval's pods are).
    #[arg(long, default_value = "1s", value_parser = parse_arrival)]
    churn_interval: std::time::Duration,
    /// Each churn pod deleted this long after its creation (once it holds its credential).
    #[arg(long, default_value = "10s", value_parser = parse_arrival)]
    churn_lifetime: std::time::Duration,
    /// The identity systems measured on the node, in this run: ours, SPIRE (built by
    /// harness/peers/spire/build.sh), or both.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "athenz")]
    systems: Vec<BenchSystem>,
    /// How SPIRE's registration entries are made, when it is measured.
    #[arg(long, value_enum, default_value = "cli")]
    spire_entries: SpireEntries,
    /// Rotates the kinds' order by this many places before the phases alternate it: give a
    /// series of runs 0, 1, 2, … so each system meets each point of the node's life.
    #[arg(long, default_value_t = 0)]
    order_offset: usize,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

impl BenchArgs {
    /// The bench these ask for: the churn flags as one phase, the systems as a set.
    fn bench_options(&self) -> cluster::bench::BenchOptions {
        cluster::bench::BenchOptions {
            sequential: self.sequential,
            interval: self.interval,
            burst: self.burst,
            churn: cluster::bench::Churn {
                duration: self.churn,
                interval: self.churn_interval,
                lifetime: self.churn_lifetime,
            },
            systems: cluster::bench::Systems {
                athenz: self.systems.contains(&BenchSystem::Athenz),
                spire: self.systems.contains(&BenchSystem::Spire).then_some(
                    match self.spire_entries {
                        SpireEntries::Cli => cluster::spire::Entries::Cli,
                        SpireEntries::ControllerManager => {
                            cluster::spire::Entries::ControllerManager
                        }
                    },
                ),
            },
            order_offset: self.order_offset,
        }
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let bench = args.bench_options();
    let options = args.release.cluster_options(None)?;
    runtime()?.block_on(cluster::bench_command(options, bench, args.json))?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct FloodArgs {
    #[command(flatten)]
    release: ReleaseArgs,
    /// Ordinary files-mode pods per round, one per --interval.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// The time between two ordinary pods.
    #[arg(long, default_value = "1s", value_parser = parse_arrival)]
    interval: std::time::Duration,
    /// Labelled files-mode pods bound to the node per flooded round, deleted at once, in
    /// batches over the round.
    #[arg(long, default_value_t = 500)]
    flood_pods: usize,
    /// Passes over the rounds: no flood, an unlabelled flood, the labelled flood, then with
    /// the agent's early issuance switched off, no flood and the labelled flood.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

fn flood(args: FloodArgs) -> anyhow::Result<ExitCode> {
    let flood = cluster::bench::flood::FloodOptions {
        pods: args.pods,
        interval: args.interval,
        flood_pods: args.flood_pods,
        rounds: args.rounds,
    };
    let options = args.release.cluster_options(None)?;
    runtime()?.block_on(cluster::flood_command(options, flood, args.json))?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct StorageE2eArgs {
    #[command(flatten)]
    release: ReleaseArgs,
    /// The suite; default: target/kube/<version>/e2e/e2e.test of this workspace.
    #[arg(long, value_name = "FILE")]
    e2e_test: Option<PathBuf>,
    /// Where the driver file, junit report and log go; default: STATE_DIR/storage-e2e.
    #[arg(long, value_name = "DIR")]
    report_dir: Option<PathBuf>,
}

fn storage_e2e(args: StorageE2eArgs) -> anyhow::Result<ExitCode> {
    let options = args.release.cluster_options(None)?;
    let e2e_test = args
        .e2e_test
        .unwrap_or_else(cluster::storage_e2e::default_e2e_test);
    let passed = runtime()?.block_on(cluster::storage_e2e::storage_e2e(
        options,
        e2e_test,
        args.report_dir,
    ))?;
    Ok(passed_or_failed(passed))
}

#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// Where etcd's data, the PKI and the logs go (emptied first).
    #[arg(long)]
    state_dir: PathBuf,
    /// The Kubernetes binaries; default: target/kube/<version>/bin of this workspace.
    #[arg(long, value_name = "DIR")]
    kube_bin: Option<PathBuf>,
    /// kwok's binary; default: target/kwok/kwok of this workspace.
    #[arg(long, value_name = "FILE")]
    kwok_bin: Option<PathBuf>,
    /// The release's binaries (the callback's); default: target/image/bin of this workspace
    /// (deploy/image.sh writes them).
    #[arg(long, value_name = "DIR")]
    release_bin: Option<PathBuf>,
    /// The scale points, NODES:PODS, each larger than the one before.
    #[arg(long, value_delimiter = ',', default_value = "1000:30000,5000:150000")]
    points: Vec<cluster::scale::ScalePoint>,
    /// Pods a second in each comparison's windows.
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Pods created in each comparison's control window and in its measured window.
    #[arg(long, default_value_t = 1000)]
    window_pods: usize,
    /// How long the control plane is watched at rest in each comparison, seconds (at least:
    /// each span ends after the API server's next garbage collection).
    #[arg(long, default_value_t = 30)]
    rest_seconds: u64,
    /// Comparisons with our parts and without at each point (their spread is the share's
    /// standard error).
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

fn scale(args: ScaleArgs) -> anyhow::Result<ExitCode> {
    let options = cluster::scale::ScaleOptions {
        state_dir: args.state_dir,
        kube_bin: args.kube_bin.unwrap_or_else(cluster::default_kube_bin),
        kwok_bin: args
            .kwok_bin
            .unwrap_or_else(cluster::scale::kwok::default_binary),
        release_bin: args
            .release_bin
            .unwrap_or_else(cluster::scale::callback::default_release_bin),
        points: args.points,
        rate: args.rate,
        window_pods: args.window_pods,
        rest: std::time::Duration::from_secs(args.rest_seconds),
        repeats: args.repeats,
    };
    let json = args.json;
    // with --json the progress goes to stderr, so a long run still says where it is
    let mut report = |line: String| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let mut points = Vec::new();
    let outcome = runtime()?.block_on(cluster::scale::run(&options, &mut report, &mut points));
    // the points measured are printed even when a later one failed
    if json {
        println!("{}", serde_json::to_string_pretty(&points)?);
    }
    outcome?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct DownArgs {
    /// The state dir `cluster up` was given.
    #[arg(long)]
    state_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct LogWaitsArgs {
    /// The state dir the bench was given (its logs stay after the cluster is taken down).
    #[arg(long)]
    state_dir: PathBuf,
}

fn log_waits(args: &LogWaitsArgs) -> anyhow::Result<ExitCode> {
    let waits = cluster::bench::LogWaits::of_run(&args.state_dir)?;
    println!("{}", serde_json::to_string_pretty(&waits)?);
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct StopNodeArgs {
    /// The state dir `cluster up` was given.
    #[arg(long)]
    state_dir: PathBuf,
    /// The node's name (cluster.json's `nodes`; not the first, which is this host).
    #[arg(long)]
    node: String,
}

fn stop_node(args: &StopNodeArgs) -> anyhow::Result<ExitCode> {
    let layout = cluster::Layout::existing(&args.state_dir)?;
    let stopped = runtime()?.block_on(cluster::node_loss::stop_node(&layout, &args.node))?;
    println!(
        "node {} lost: {} components stopped, {} processes killed in its namespaces",
        args.node, stopped.components, stopped.killed
    );
    Ok(ExitCode::SUCCESS)
}

fn down(args: &DownArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(cluster::down(&args.state_dir))?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct PreviousImageArgs {
    /// The repository whose CHANGELOG.md names the previous release; default: the one this
    /// binary was built from.
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
}

fn previous_image(args: &PreviousImageArgs) -> anyhow::Result<ExitCode> {
    let repo = args
        .repo
        .clone()
        .unwrap_or_else(athenz_testbed::bins::repo_root);
    let (version, commit) = cluster::previous_release::previous_version(&repo)?;
    let archive = cluster::previous_release::image(&repo, &version, &commit)?;
    println!("{}", archive.display());
    Ok(ExitCode::SUCCESS)
}
