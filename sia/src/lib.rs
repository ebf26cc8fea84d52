//! `athenz-sia`: runs in the pod (DESIGN.md 4.6). `init` (an init container) asks the node agent
//! for the pod's identity and writes key, certificate, CA and ntoken as one atomic set; `refresh`
//! (a sidecar) keeps them fresh until SIGTERM. It talks to the agent over the socket the flex
//! volume brings into the pod, presenting the volume's opaque id.

pub mod client;
pub mod run;

use athenz_core::refresh::parse_duration;
use athenz_core::telemetry::LogFormat;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// Command line of `athenz-sia`.
#[derive(Debug, Parser)]
#[command(
    name = "athenz-sia",
    version,
    about = "Gets and refreshes this pod's Athenz identity"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `init` or `refresh`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Get the identity, write the files, exit.
    Init(Settings),
    /// Keep the files fresh until SIGTERM.
    Refresh(Settings),
}

/// Every setting; each a flag with an environment fallback.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// The volume id file.
    #[arg(long, env = "ID_FILE", default_value = "/var/athenz/identity/id")]
    pub id_file: PathBuf,
    /// The agent socket.
    #[arg(
        long,
        env = "ENDPOINT",
        default_value = "/var/athenz/identity/connect/agent.sock"
    )]
    pub endpoint: PathBuf,
    /// Where the files go (created if missing).
    #[arg(long, env = "OUT_DIR", default_value = "/var/run/athenz")]
    pub out_dir: PathBuf,
    /// The latest a refresh may come.
    #[arg(long, env = "REFRESH_INTERVAL", default_value = "24h", value_parser = parse_duration)]
    pub refresh_interval: Duration,
    /// Group (name or gid) that may read the key and ntoken (they become 0640).
    #[arg(long, env = "GROUP")]
    pub group: Option<String>,
    /// Owner (uid) of the files.
    #[arg(long, env = "OWNER_UID")]
    pub owner_uid: Option<u32>,
    /// How long `init` retries a busy or not-yet-ready agent.
    #[arg(long, env = "INIT_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub init_timeout: Duration,
    /// Time allowed for one call to the agent.
    #[arg(long, env = "REQUEST_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Log format: human or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "human")]
    pub log_format: LogFormat,
}
