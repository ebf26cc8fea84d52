//! `demo`: the whole system once through for three pods, told as it happens (or as one JSON
//! document at the end), on a stack in a temporary state dir unless `--state-dir` keeps it.

use super::{privileged_in_temp_dir, runtime};
use athenz_core::agent_api::KeySource;
use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::demo;
use athenz_devstack::stack::ZtsServer;
use athenz_testbed::runtime::RuntimeKind;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
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
    /// Which ZTS: the development ZTS (dev) or Athenz's own, built from its source by
    /// harness/peers/athenz/zts/build (athenz; docs/real-zts.md).
    #[arg(long, value_enum, default_value_t = ZtsServer::Dev)]
    zts: ZtsServer,
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    privileged_in_temp_dir("athenz-devstack-", |temp| {
        let dir = args.state_dir.clone().unwrap_or_else(|| temp.to_owned());
        let mut print = |line: String| {
            if !args.json {
                println!("{line}");
            }
        };
        let report = runtime()?.block_on(demo::run(
            &dir,
            args.volume,
            args.key_source,
            args.runtime,
            args.zts,
            &mut print,
        ))?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!(
                "\ndemo complete in {:.1} s: 3 identities issued and verified, 1 refreshed, \
                 1 refused after delete, 1 refused across nodes, 3 volumes unmounted",
                report.seconds
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}
