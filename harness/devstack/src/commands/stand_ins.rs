//! The servers the stack stands in for, each run as a process of its own: `zts` (also a
//! command of its own: the development ZTS alone) and the hidden `kube-standins`, the
//! Kubernetes API and the kubelets the stack starts.

use super::stand_in_runtime;
use athenz_devstack::cluster::kubectl::Kubectl;
use athenz_devstack::cluster::tenant_domains;
use athenz_devstack::kube;
use athenz_devstack::stack::ZtsServer;
use athenz_testbed::real_zts;
use athenz_testbed::zts::{self, DevZtsConfig};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ZtsArgs {
    /// Where its CA, its own certificate and zts.json are written.
    #[arg(long)]
    state_dir: PathBuf,
    /// Its configuration (JSON: services, providers, lifetimes); defaults otherwise.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Follow this faults file (`chaos` injects ZTS errors through it).
    #[arg(long, hide = true)]
    faults_file: Option<PathBuf>,
    /// Which ZTS: the development ZTS (dev), or Athenz's own built from its source by
    /// harness/peers/athenz/zts/build (athenz; $ATHENZ_ZTS_HOME, else under target/), from the
    /// same configuration.
    #[arg(long, value_enum, default_value_t = ZtsServer::Dev)]
    server: ZtsServer,
    /// With Athenz's ZTS: register the cluster's tenants as they appear (each opted-in
    /// namespace a domain, its service accounts its services), asking the API with this
    /// kubectl and --tenants-kubeconfig, as a ZMS administrator would register them.
    #[arg(long, hide = true, requires = "tenants_kubeconfig")]
    tenants_kubectl: Option<PathBuf>,
    /// The kubeconfig for --tenants-kubectl.
    #[arg(long, hide = true, requires = "tenants_kubectl")]
    tenants_kubeconfig: Option<PathBuf>,
}

pub fn zts(args: ZtsArgs) -> anyhow::Result<ExitCode> {
    let _ = athenz_core::telemetry::init_logging(athenz_core::telemetry::LogFormat::Human);
    let config = match args.config {
        Some(path) => DevZtsConfig::from_file(&path)?,
        None => DevZtsConfig::default(),
    };
    let tenants = args.tenants_kubectl.zip(args.tenants_kubeconfig);
    if tenants.is_some() && args.server == ZtsServer::Dev {
        anyhow::bail!(
            "--tenants-kubectl: the dev ZTS's provider launches any tenant; only Athenz's ZTS needs them registered"
        );
    }
    match args.server {
        ZtsServer::Dev => stand_in_runtime()?.block_on(zts::run_standalone(
            config,
            &args.state_dir,
            args.faults_file,
            athenz_core::http::termination_signal(),
        ))?,
        ZtsServer::Athenz => {
            if args.faults_file.is_some() {
                anyhow::bail!(
                    "--faults-file: faults are injected into the dev ZTS only; Athenz's ZTS runs as built"
                );
            }
            let runtime = stand_in_runtime()?;
            let updates = match tenants {
                Some((kubectl, kubeconfig)) => {
                    let (sender, receiver) = tokio::sync::mpsc::channel(1);
                    let mapper = athenz_core::names::DomainMapper::new(
                        athenz_testbed::fixtures::ADMIN_DOMAIN,
                        [athenz_devstack::cluster::install::NODE_NAMESPACE],
                    )?;
                    runtime.spawn(tenant_domains::follow(
                        Kubectl::from_parts(kubectl, kubeconfig),
                        mapper,
                        config.clone(),
                        sender,
                        args.state_dir.join(tenant_domains::SEEN_FILE),
                    ));
                    Some(receiver)
                }
                None => None,
            };
            runtime.block_on(real_zts::run_standalone(
                config,
                real_zts::default_home(),
                &args.state_dir,
                updates,
                athenz_core::http::termination_signal(),
            ))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct KubeStandinsArgs {
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
}

pub fn kube(args: KubeStandinsArgs) -> anyhow::Result<ExitCode> {
    stand_in_runtime()?.block_on(kube::run_standins(
        &args.state_dir,
        args.api_listen,
        &args.node,
        args.faults_file,
    ))?;
    Ok(ExitCode::SUCCESS)
}
