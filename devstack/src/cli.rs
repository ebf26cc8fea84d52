//! The command line of `athenz-devstack`: its commands and their options (what `--help` shows).

use athenz_core::agent_api::KeySource;
use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::{chaos, kube};
use athenz_testbed::runtime::RuntimeKind;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "athenz-devstack",
    version,
    about = "athenz-k8s-identity on one machine"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole system once through for three pods, print what happened, stop.
    Demo {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Keep state here instead of a temporary directory (kept afterwards).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Which volume the pods get: flex (with the in-pod SIA), csi-socket (the same through
        /// the agent's CSI driver) or csi-files (nothing in the pod).
        #[arg(long, value_enum, default_value_t = VolumeMode::Flex)]
        volume: VolumeMode,
        /// Where socket-mode pods' keys are made (the agents' and SIAs' --key-source).
        #[arg(long, value_enum, default_value_t = KeySource::Pod)]
        key_source: KeySource,
        /// How pods' processes start: runc or crun (a sandbox and containers, as kubelet has a
        /// CRI runtime make them) or process (a plain process in a kubelet-shaped cgroup);
        /// default: runc when it is installed and this runs as root, else process.
        #[arg(long)]
        runtime: Option<RuntimeKind>,
    },
    /// Start the stack and keep it running until Ctrl-C or SIGTERM; writes DIR/stack.json.
    Up {
        /// Where everything lives; stack.json appears here once every part is ready.
        #[arg(long)]
        state_dir: PathBuf,
        /// Pod key type the agent generates.
        #[arg(long, default_value = "p256")]
        key: String,
        /// Run each component from its own binary in DIR (e.g. target/release) instead of this one.
        #[arg(long, value_name = "DIR")]
        components: Option<PathBuf>,
        /// Nodes, each with its own kubelet stand-in, agent and node identity.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// The agents' peer check; default enforce where pod cgroups can be made, else off.
        #[arg(long, value_enum)]
        peer_check: Option<athenz_core::peer::PeerCheck>,
        /// Which volume pods get; with csi-socket or csi-files every agent also serves the CSI
        /// driver at nodes[].agent.csi_socket.
        #[arg(long, value_enum, default_value_t = VolumeMode::Flex)]
        volume: VolumeMode,
        /// The dev ZTS and the Kubernetes stand-ins follow DIR/faults.json, so a script or test
        /// can inject faults into the running stack (the fields of `chaos`'s faults file).
        #[arg(long)]
        fault_injection: bool,
        /// Where socket-mode pods' keys are made (the agents' and SIAs' --key-source).
        #[arg(long, value_enum, default_value_t = KeySource::Pod)]
        key_source: KeySource,
        /// How pods' processes start: runc or crun (a sandbox and containers, as kubelet has a
        /// CRI runtime make them) or process (a plain process in a kubelet-shaped cgroup);
        /// default: runc when it is installed and this runs as root, else process.
        #[arg(long)]
        runtime: Option<RuntimeKind>,
    },
    /// Measure the full path for many pods.
    Bench {
        /// Pods to give identities.
        #[arg(long, default_value_t = 110)]
        pods: usize,
        /// Pods in flight at once (when all exist first, i.e. `--arrival 0`).
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Pods arrive one by one this far apart (e.g. 20ms), each created and mounted at once,
        /// as during a rollout; 0: every pod exists before the first mount.
        #[arg(long, default_value = "0", value_parser = parse_arrival)]
        arrival: std::time::Duration,
        /// Pods as the kubelet lists them: real (8–15 KB each: containers, probes, status,
        /// managed fields) or minimal (a few fields).
        #[arg(long, value_enum, default_value_t = kube::PodSize::Real)]
        pod_size: kube::PodSize,
        /// Pod key type: p256 or rsa2048.
        #[arg(long, default_value = "p256")]
        key: String,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Run each component from its own binary in DIR (e.g. the static driver and SIA a
        /// cluster ships) instead of this one.
        #[arg(long, value_name = "DIR")]
        components: Option<PathBuf>,
        /// The agents' peer check; default enforce where pod cgroups can be made, else off.
        #[arg(long, value_enum)]
        peer_check: Option<athenz_core::peer::PeerCheck>,
        /// The pods' volume; several (comma-separated) are measured one after the other, each
        /// on a fresh stack, and compared.
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [VolumeMode::Flex])]
        volume: Vec<VolumeMode>,
        /// Where socket-mode pods' keys are made; several (e.g. pod,agent) are measured one
        /// after the other, each on a fresh stack, and compared.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "pod")]
        key_source: Vec<KeySource>,
        /// How pods' processes start: runc or crun (a sandbox and containers, as kubelet has a
        /// CRI runtime make them) or process (a plain process in a kubelet-shaped cgroup);
        /// default: runc when it is installed and this runs as root, else process.
        #[arg(long)]
        runtime: Option<RuntimeKind>,
    },
    /// What the shared parts cost at size: drives the jwt-service (each node's agent identity)
    /// and the callback (a new mutual-TLS connection per confirmation, as ZTS) at a rate, and
    /// reports throughput per core, latency, memory and the Kubernetes API requests per
    /// identity, per refresh and per node renewal.
    Load {
        /// Nodes, each with its own agent.
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        /// Real-size pods on each node.
        #[arg(long, default_value_t = 20)]
        pods_per_node: usize,
        /// Identities a second (three quarters launches, then a quarter refreshes).
        #[arg(long, default_value_t = 300.0)]
        rate: f64,
        /// How long to drive, seconds.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Certificate lifetime in minutes, pods' and nodes' (the stack's default otherwise);
        /// with 1 and `--seconds 60` the agents refresh their node identities during the run.
        #[arg(long)]
        lifetime_minutes: Option<u32>,
        /// Run each component from its own binary in DIR instead of this one.
        #[arg(long, value_name = "DIR")]
        components: Option<PathBuf>,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Run the stack for a long time with short certificate lifetimes; sample every daemon's
    /// RSS, fds and threads and every pod's files; fail on growth past the bound after warm-up,
    /// an expired or torn set, or a process that exits.
    Soak {
        /// How long to run once every pod has its identity (e.g. 30m).
        #[arg(long, default_value = "30m", value_parser = athenz_core::refresh::parse_duration)]
        duration: std::time::Duration,
        /// Pods (each with a refresh sidecar unless the volume is csi-files).
        #[arg(long, default_value_t = 110)]
        pods: usize,
        /// Certificate lifetime in minutes (the pods refresh at about 70 % of it).
        #[arg(long, default_value_t = 1)]
        lifetime_minutes: u32,
        /// Time between samples.
        #[arg(long, default_value = "60s", value_parser = athenz_core::refresh::parse_duration)]
        sample: std::time::Duration,
        /// Samples before this are warm-up; the baseline is the highest sample up to the first after it.
        #[arg(long, default_value = "5m", value_parser = athenz_core::refresh::parse_duration)]
        warmup: std::time::Duration,
        /// Growth allowed over the baseline, percent (plus 1 MiB, 4 fds, 2 threads).
        #[arg(long, default_value_t = 10.0)]
        growth_percent: f64,
        /// The pods' volume.
        #[arg(long, value_enum, default_value_t = VolumeMode::Flex)]
        volume: VolumeMode,
        /// Run each component from its own binary in DIR instead of this one.
        #[arg(long, value_name = "DIR")]
        components: Option<PathBuf>,
        /// Write the series here as CSV (process,at_seconds,rss_kib,fds,threads).
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Inject one fault at a time into a stack whose pods renew short-lived certificates and
    /// print, per fault, the pods affected, files expired, torn sets and recovery time against
    /// the bound; exit 1 if a bound broke.
    Chaos {
        /// Pods with the flex volume (each with its refresh sidecar).
        #[arg(long, default_value_t = 20)]
        pods: usize,
        /// Pods with the CSI files-mode volume (the agent rotates their files); at least 1
        /// for `disk-full`.
        #[arg(long, default_value_t = 4)]
        files_pods: usize,
        /// Certificate lifetime in minutes.
        #[arg(long, default_value_t = 1)]
        lifetime_minutes: u32,
        /// The faults to inject, in order (comma-separated); all by default.
        #[arg(long, value_enum, value_delimiter = ',')]
        faults: Vec<chaos::Fault>,
        /// How many times `sia-killed-mid-write` kills the SIA.
        #[arg(long, default_value_t = 1000)]
        sia_kills: usize,
        /// Where the flex pods' keys are made (the agents' and SIAs' --key-source).
        #[arg(long, value_enum, default_value_t = KeySource::Pod)]
        key_source: KeySource,
        /// How pods' processes start: runc or crun (a sandbox and containers, as kubelet has a
        /// CRI runtime make them) or process (a plain process in a kubelet-shaped cgroup);
        /// default: runc when it is installed and this runs as root, else process.
        #[arg(long)]
        runtime: Option<RuntimeKind>,
        /// Run each component from its own binary in DIR instead of this one.
        #[arg(long, value_name = "DIR")]
        components: Option<PathBuf>,
        /// `agent-upgraded`'s new build: a directory holding `athenz-identity-agent` (e.g. the
        /// image's `target/image/bin`); default: a copy of the running agent's binary.
        #[arg(long, value_name = "DIR")]
        upgrade_to: Option<PathBuf>,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// A real single-node Kubernetes cluster on this machine, from the binaries
    /// harness/real-node/kube/build.sh builds (root).
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Run the development ZTS alone until Ctrl-C; writes DIR/zts.json {url, ca}.
    Zts {
        /// Where its CA, its own certificate and zts.json are written.
        #[arg(long)]
        state_dir: PathBuf,
        /// Its configuration (JSON: services, providers, lifetimes); defaults otherwise.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Follow this faults file (`chaos` injects ZTS errors through it).
        #[arg(long, hide = true)]
        faults_file: Option<PathBuf>,
    },
    /// One refresh request from a pod's process (started by the stack inside the pod's cgroup).
    #[command(hide = true)]
    PodRefreshOnce {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        volume_dir: PathBuf,
        #[arg(long)]
        credentials_dir: PathBuf,
        #[arg(long, value_enum, default_value_t = athenz_core::agent_api::KeySource::Pod)]
        key_source: athenz_core::agent_api::KeySource,
    },
    /// A pod's application stand-in (a container of the pod): reads its credential set as an
    /// application would and prints the identity it holds, as JSON.
    #[command(hide = true)]
    PodApp {
        #[arg(long)]
        credentials_dir: PathBuf,
    },
    /// The Kubernetes API and kubelet stand-ins (started by the stack).
    #[command(hide = true)]
    KubeStandins {
        #[arg(long)]
        state_dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:0")]
        api_listen: std::net::SocketAddr,
        /// One per node.
        #[arg(long, required = true)]
        node: Vec<String>,
        /// Follow this faults file (`chaos` injects API and kubelet faults through it).
        #[arg(long)]
        faults_file: Option<PathBuf>,
    },
}

/// An identity system `cluster bench` can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSystem {
    /// athenz-k8s-identity.
    Athenz,
    /// SPIRE with the SPIFFE CSI driver.
    Spire,
}

/// `cluster up|down`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Start etcd, the control plane, containerd, the kubelet and kube-proxy; wait until the
    /// node is Ready; add cluster DNS, the dev ZTS and our release (deploy/overlays/local);
    /// write DIR/kubeconfig and DIR/cluster.json; keep running until Ctrl-C or SIGTERM, then
    /// take everything down.
    Up {
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
        installer: crate::cluster::install::Installer,
        /// The docs/operating.md whose install steps run (another release's, with its
        /// --deploy, to install that release as it was installed); default: the page this
        /// binary was built with.
        #[arg(long, value_name = "FILE", conflicts_with = "bare")]
        steps: Option<PathBuf>,
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
    },
    /// `cluster up`, then the end-to-end: pods in flex, csi-socket and csi-files mode get
    /// their identity through the real kubelet and API server; prints what each app container
    /// read (checked against its pod); takes the cluster down. Exits 1 if any check fails.
    Demo {
        #[command(flatten)]
        release: ReleaseArgs,
        /// The deploy/ to install (as for `cluster up`).
        #[arg(long, value_name = "DIR")]
        deploy: Option<PathBuf>,
        /// Print the identities as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// `cluster up`, then what an identity adds to a pod's start on the real node: created →
    /// app container holding its certificate, per mode and for the same pod without identity,
    /// pods one per interval then a burst; the agent's RSS and CPU. Takes the cluster down.
    Bench {
        #[command(flatten)]
        release: ReleaseArgs,
        /// Pods created one per --interval, per mode.
        #[arg(long, default_value_t = 50)]
        sequential: usize,
        /// The time between two of those pods.
        #[arg(long, default_value = "1s", value_parser = parse_arrival)]
        interval: std::time::Duration,
        /// Pods created at once, per mode.
        #[arg(long, default_value_t = 30)]
        burst: usize,
        /// How long the churn phase creates pods (0: no churn).
        #[arg(long, default_value = "120s", value_parser = parse_arrival)]
        churn: std::time::Duration,
        /// One churn pod created this often.
        #[arg(long, default_value = "1s", value_parser = parse_arrival)]
        churn_interval: std::time::Duration,
        /// Each churn pod deleted this long after its creation (once it holds its credential).
        #[arg(long, default_value = "10s", value_parser = parse_arrival)]
        churn_lifetime: std::time::Duration,
        /// The identity systems measured on the node, in this run: ours, SPIRE (built by
        /// harness/peers/spire/build.sh), or both.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "athenz")]
        systems: Vec<BenchSystem>,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// `cluster up`, then Kubernetes' own storage e2e suite (`e2e.test`, built by
    /// `harness/real-node/kube/build.sh --e2e`) against csi.athenz.io: "External Storage [Driver:
    /// csi.athenz.io]", the specs that apply to an inline ephemeral driver. Takes the cluster
    /// down. Exits 1 if a spec failed or none passed.
    StorageE2e {
        #[command(flatten)]
        release: ReleaseArgs,
        /// The suite; default: target/kube/<version>/e2e/e2e.test of this workspace.
        #[arg(long, value_name = "FILE")]
        e2e_test: Option<PathBuf>,
        /// Where the driver file, junit report and log go; default: STATE_DIR/storage-e2e.
        #[arg(long, value_name = "DIR")]
        report_dir: Option<PathBuf>,
    },
    /// Take the cluster in DIR down: its processes, containers, mounts, cgroups, iptables
    /// chains, bridge and IPAM state. Safe to run again.
    Down {
        /// The state dir `cluster up` was given.
        #[arg(long)]
        state_dir: PathBuf,
    },
}

/// `--arrival`: a duration like 20ms, or 0.
fn parse_arrival(text: &str) -> Result<std::time::Duration, String> {
    if text.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    athenz_core::refresh::parse_duration(text)
}

/// Where a `cluster` command that installs our release keeps its state, and what it installs
/// and runs (the same options as `cluster up`'s).
#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    /// Where everything lives.
    #[arg(long)]
    pub state_dir: PathBuf,
    /// The release image's OCI archive (as for `cluster up`).
    #[arg(long, value_name = "FILE")]
    pub image_archive: Option<PathBuf>,
    /// The binaries (as for `cluster up`).
    #[arg(long, value_name = "DIR")]
    pub kube_bin: Option<PathBuf>,
}
