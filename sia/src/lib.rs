//! `athenz-sia`: runs in the pod (DESIGN.md 4.6). `init` (an init container) asks the node agent
//! for the pod's identity and writes key, certificate, CA and ntoken as one atomic set; `refresh`
//! (a sidecar) keeps them fresh until SIGTERM. It talks to the agent over the socket the flex
//! volume brings into the pod, presenting the volume's opaque id.

pub mod client;
pub mod run;
pub mod sds;

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
    /// `refresh` only: serve Envoy's Secret Discovery Service (v3) on this Unix socket, the
    /// secrets `default` (certificate chain and key) and `ROOTCA` (CA bundle), every rotation
    /// pushed. The socket is 0600, or 0660 with `--group` as its group.
    #[arg(long, env = "SDS_SOCKET")]
    pub sds_socket: Option<PathBuf>,
    /// Log format: human or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "human")]
    pub log_format: LogFormat,
}

/// The `athenz-sia` command: parses `args` (the program name first), runs `init` or `refresh`
/// and says how it ended: 0 done (or SIGTERM during refresh), 1 failed, 2 bad settings. `main`
/// runs it, and so does `athenz-devstack` when it re-executes itself under this name.
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    // No TLS here (the agent is reached over a Unix socket), so no crypto provider is installed:
    // it would only add memory to a process that runs in every pod.
    let cli = Cli::parse_from(args);
    let (settings, refresh) = match cli.command {
        Command::Init(s) => (s, false),
        Command::Refresh(s) => (s, true),
    };
    let _ = athenz_core::telemetry::init_logging(settings.log_format);
    let sia = match run::Sia::load(settings) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    // A single-threaded runtime: the SIA runs in every pod and must stay small.
    athenz_core::daemon::run_to_completion(|| async {
        if refresh {
            sia.refresh(athenz_core::http::termination_signal()).await
        } else {
            sia.init().await
        }
    })
}
