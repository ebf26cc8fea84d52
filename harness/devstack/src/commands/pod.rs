//! What runs inside a pod the stack starts (hidden commands): a refresh request from the pod's
//! process, and the application stand-in that reads the pod's credentials.

use super::runtime;
use athenz_core::agent_api::KeySource;
use athenz_devstack::{identity, node};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct RefreshOnceArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    volume_dir: PathBuf,
    #[arg(long)]
    credentials_dir: PathBuf,
    #[arg(long, value_enum, default_value_t = KeySource::Pod)]
    key_source: KeySource,
}

pub fn refresh_once(args: RefreshOnceArgs) -> anyhow::Result<ExitCode> {
    let answer = runtime()?.block_on(node::pod_refresh_once(
        &args.socket,
        &args.volume_dir,
        &args.credentials_dir,
        args.key_source,
    ))?;
    println!("{}", serde_json::to_string(&answer)?);
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
pub struct AppArgs {
    #[arg(long)]
    credentials_dir: PathBuf,
}

pub fn app(args: AppArgs) -> anyhow::Result<ExitCode> {
    let report = identity::check(&args.credentials_dir)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}
