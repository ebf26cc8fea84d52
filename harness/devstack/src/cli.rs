//! The command line of `athenz-devstack`: its commands (what `--help` lists). Each command's
//! options are its arguments struct, beside the code that runs it in [`crate::commands`].

use crate::commands::{bench, chaos, cluster, demo, load, pod, soak, stand_ins, up};
use clap::{Parser, Subcommand};

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
    Demo(demo::DemoArgs),
    /// Start the stack and keep it running until Ctrl-C or SIGTERM; writes DIR/stack.json.
    Up(up::UpArgs),
    /// Measure the full path for many pods.
    Bench(bench::BenchArgs),
    /// What the shared parts cost at size: drives the jwt-service (each node's agent identity)
    /// and the callback (a new mutual-TLS connection per confirmation, as ZTS) at a rate, and
    /// reports throughput per core, latency, memory and the Kubernetes API requests per
    /// identity, per refresh and per node renewal.
    Load(load::LoadArgs),
    /// Run the stack for a long time with short certificate lifetimes; sample every daemon's
    /// RSS, fds and threads and every pod's files; fail on growth past the bound after warm-up,
    /// an expired or torn set, or a process that exits.
    Soak(soak::SoakArgs),
    /// Inject one fault at a time into a stack whose pods renew short-lived certificates and
    /// print, per fault, the pods affected, files expired, torn sets and recovery time against
    /// the bound; exit 1 if a bound broke.
    Chaos(chaos::ChaosArgs),
    /// A real single-node Kubernetes cluster on this machine, from the binaries
    /// harness/real-node/kube/build.sh builds (root).
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Run the development ZTS alone until Ctrl-C; writes DIR/zts.json {url, ca}.
    Zts(stand_ins::ZtsArgs),
    /// One refresh request from a pod's process (started by the stack inside the pod's cgroup).
    #[command(hide = true)]
    PodRefreshOnce(pod::RefreshOnceArgs),
    /// A pod's application stand-in (a container of the pod): reads its credential set as an
    /// application would and prints the identity it holds, as JSON.
    #[command(hide = true)]
    PodApp(pod::AppArgs),
    /// The Kubernetes API and kubelet stand-ins (started by the stack).
    #[command(hide = true)]
    KubeStandins(stand_ins::KubeStandinsArgs),
}
