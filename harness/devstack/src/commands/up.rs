//! `up`: the stack until Ctrl-C or SIGTERM, described on the terminal and in `DIR/stack.json`,
//! its components restarted when one exits (as kubelet restarts a crashed container).

use super::runtime;
use athenz_core::agent_api::KeySource;
use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::stack::{Stack, StackOptions, ZtsServer};
use athenz_devstack::userns;
use athenz_testbed::runtime::RuntimeKind;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct UpArgs {
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
    /// Which ZTS: the development ZTS (dev) or Athenz's own, built from its source by
    /// harness/peers/athenz/zts/build (athenz; docs/real-zts.md).
    #[arg(long, value_enum, default_value_t = ZtsServer::Dev)]
    zts: ZtsServer,
}

impl UpArgs {
    /// The stack these ask for: the command line's choices over the defaults of every other
    /// (what tests and the other commands tune).
    fn stack_options(self) -> StackOptions {
        StackOptions {
            components: self.components,
            nodes: self.nodes,
            peer_check: self.peer_check,
            volume: self.volume,
            fault_injection: self.fault_injection,
            key_source: self.key_source,
            runtime: self.runtime,
            zts: self.zts,
            ..StackOptions::new(self.state_dir, &self.key)
        }
    }
}

pub fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    if let Some(code) = userns::ensure_privileged()? {
        return Ok(code);
    }
    if args.nodes == 0 {
        anyhow::bail!("--nodes must be at least 1");
    }
    runtime()?.block_on(up(args.stack_options()))?;
    Ok(ExitCode::SUCCESS)
}

/// Start, describe, supervise until Ctrl-C or SIGTERM, stop.
async fn up(options: StackOptions) -> anyhow::Result<()> {
    let mut stack = Stack::start(&options).await?;
    describe(&stack);
    println!("Ctrl-C to stop.");
    let stop = athenz_core::http::termination_signal();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = tick.tick() => {
                for name in stack.restart_exited()? {
                    eprintln!("{name} exited; restarted it");
                }
            }
        }
    }
    println!("stopping");
    stack.stop().await;
    Ok(())
}

/// Prints where each part of the running stack is, one part a line.
fn describe(stack: &Stack) {
    let info = &stack.info;
    let state = |path: &str| stack.state_dir.join(path).display().to_string();
    println!("athenz-devstack is up; stack.json: {}", state("stack.json"));
    let zts = &info.zts;
    part("dev ZTS", format!("{}  (CA {})", zts.url, zts.ca.display()));
    part("Kubernetes API", &info.kube_api.url);
    part("kubelet", &info.kubelet.url);
    part("jwt-service", &info.jwt_service.url);
    let callback = &info.callback;
    part(
        "callback",
        format!("{}{}", callback.url, callback.base_path),
    );
    part("initializer", format!("{}/mutate", info.initializer.url));
    let agent = &info.agent;
    let metrics = &agent.metrics_url;
    part(
        "agent",
        format!("{}  (metrics {metrics})", agent.socket.display()),
    );
    part(
        "volume driver",
        format!(
            "ATHENZ_VOLUMES_DIR={} ATHENZ_AGENT_DIR={} {}",
            info.volumes_dir.display(),
            info.agent_dir.display(),
            info.volume_driver.join(" ")
        ),
    );
    part("pod SIA", info.sia.join(" "));
    let runtime = &info.runtime;
    part(
        "pods run by",
        format!("{} ({})", runtime.kind, runtime.reason),
    );
    for node in &info.nodes {
        let agent = node.agent.socket.display();
        part(
            &format!("node {:<11}", node.name),
            format!("kubelet {}  agent {agent}", node.kubelet.url),
        );
    }
    let cgroups = info
        .pod_cgroup_root
        .as_ref()
        .map_or_else(|| "none".to_owned(), |p| p.display().to_string());
    let peer_check = format!("{} (pod cgroups under {cgroups})", info.peer_check);
    part("peer check", peer_check);
    part("logs", state("logs"));
}

/// One line of [`describe`]: the part's name in a column, then where it is.
fn part(name: &str, place: impl std::fmt::Display) {
    println!("  {name:<16} {place}");
}
