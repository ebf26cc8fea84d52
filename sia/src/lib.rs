//! `athenz-sia`: runs in the pod (docs/design.md §4.6). `init` (an init container) asks the node
//! agent for the pod's identity and writes key, certificate, CA and ntoken as one atomic set;
//! `refresh` (a sidecar) keeps them fresh until SIGTERM. It talks to the agent over the socket the
//! flex volume brings into the pod, presenting the volume's opaque id.

pub mod authz;
pub mod client;
pub mod pod_key;
pub mod pod_refresh;
pub mod run;
pub mod sds;
pub mod sds_probe;
pub mod status;

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
    /// Where the pod's key is made, given before the verb (`athenz-sia --key-source agent
    /// init`): as `init`'s and `refresh`'s own --key-source (KEY_SOURCE), which this overrides.
    /// It lets an argv prefix that names the SIA (`athenz-devstack up`'s `stack.json`) carry
    /// the setting its agent needs.
    #[arg(long = "key-source", value_enum)]
    pub key_source: Option<athenz_core::agent_api::KeySource>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `init`, `refresh` or `status`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Get the identity, write the files, exit.
    Init(Settings),
    /// Keep the files fresh until SIGTERM.
    Refresh(Settings),
    /// Show what the identity files hold (principal, SANs, expiry, chain, key); exit 1 if they
    /// are not usable. Usable as an exec probe.
    Status(status::StatusArgs),
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
    /// Where the key is made: `pod` (here: only a CSR goes to the agent, and refreshes go to ZTS
    /// from this process, through the agent's tunnel or to --zts-url) or `agent` (the agent
    /// makes it and is shown it at every refresh). Must match the agent's --key-source.
    #[arg(long, env = "KEY_SOURCE", value_enum, default_value_t = athenz_core::agent_api::KeySource::Pod)]
    pub key_source: athenz_core::agent_api::KeySource,
    /// With --key-source pod, how refreshes reach ZTS: `tunnel` (through the agent's CONNECT
    /// tunnel to the ZTS the agent names, verified by the CA bundle the agent names; the pod
    /// needs no route to ZTS) or `direct` (to --zts-url, verified by --zts-ca).
    #[arg(long, env = "REFRESH_ROUTE", value_enum, default_value_t = RefreshRoute::Tunnel)]
    pub refresh_route: RefreshRoute,
    /// Time allowed for one ZTS call (refresh, role certificate, token).
    #[arg(long, env = "ZTS_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub zts_timeout: Duration,
    /// Key type made with --key-source pod: p256 or rsa2048.
    #[arg(long, env = "KEY_ALGORITHM", default_value = "p256")]
    pub key_algorithm: athenz_core::crypto::KeyAlgorithm,
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
    /// Athenz roles to get role certificates and tokens for, `<domain>:role.<role>,…`: written
    /// with the identity (`rolecerts/<target>.cert.pem`, `tokens/<target>.<type>`) and renewed.
    #[arg(long, env = "TARGET_DOMAIN_ROLES", default_value = "")]
    pub target_domain_roles: String,
    /// Tokens made for the targets and served: accesstoken, roletoken or roletoken+accesstoken.
    #[arg(long, env = "TOKEN_TYPE", default_value = "accesstoken")]
    pub token_type: String,
    /// The longest a token is kept before it is fetched again.
    #[arg(long, env = "TOKEN_REFRESH_INTERVAL", default_value = "30m", value_parser = parse_duration)]
    pub token_refresh_interval: Duration,
    /// Token lifetime asked of ZTS (0: ZTS's default).
    #[arg(long, env = "TOKEN_EXPIRY", default_value = "0", value_parser = parse_optional_duration)]
    pub token_expiry: Duration,
    /// ZTS base URL (`https://<host>:<port>/zts/v1`), for role certificates and tokens and, with
    /// --refresh-route direct, the identity's refreshes; called with the pod's own certificate. (k8s-athenz-sia's ENDPOINT is the agent socket here.)
    #[arg(long, env = "ZTS_URL")]
    pub zts_url: Option<String>,
    /// CA certificates (PEM) that verify ZTS (k8s-athenz-sia's SERVER_CA_CERT; ZTS_CA_FILE also
    /// read). Default: the bundle the agent publishes beside its socket (`zts-ca.pem` in the
    /// --endpoint's directory), the install's own, so a pod needs no CA of its own.
    #[arg(long, env = "SERVER_CA_CERT")]
    pub zts_ca: Option<PathBuf>,
    /// Same as `--zts-ca`.
    #[arg(long, env = "ZTS_CA_FILE", hide = true)]
    pub zts_ca_file: Option<PathBuf>,
    /// `refresh` only: serve tokens over HTTP here (`host:port`; `:port` is loopback).
    #[arg(long, env = "TOKEN_SERVER_ADDR")]
    pub token_server_addr: Option<String>,
    /// Serve k8s-athenz-sia's REST API (`POST /accesstoken`, `POST /roletoken`).
    #[arg(long, env = "TOKEN_SERVER_REST_API", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub token_server_rest_api: bool,
    /// Serve header mode (`X-Athenz-Domain`, `X-Athenz-Role` → the target's tokens in headers).
    #[arg(long, env = "USE_TOKEN_SERVER", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub use_token_server: bool,
    /// Time allowed for one token server answer.
    #[arg(long, env = "TOKEN_SERVER_TIMEOUT", default_value = "3s", value_parser = parse_duration)]
    pub token_server_timeout: Duration,
    /// Response header carrying the role token in header mode.
    #[arg(long, env = "ROLE_AUTH_HEADER", default_value = "Athenz-Role-Auth")]
    pub role_auth_header: String,
    /// `refresh` only: serve `/metrics` and `/healthz` here (`host:port`; `:port` is loopback).
    #[arg(long, env = "METRICS_SERVER_ADDR")]
    pub metrics_server_addr: Option<String>,
    /// Log format: human or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "human")]
    pub log_format: LogFormat,
}

/// How a pod-made key's refreshes reach ZTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RefreshRoute {
    /// Through the agent's `CONNECT` tunnel.
    Tunnel,
    /// To `--zts-url` directly.
    Direct,
}

/// A duration setting that may be zero (`0`: not set).
pub fn parse_optional_duration(text: &str) -> Result<Duration, String> {
    match text.trim() {
        "0" | "0s" | "" => Ok(Duration::ZERO),
        other => parse_duration(other),
    }
}

/// A listen address: `host:port` with an IP or `localhost`, or `:port` for loopback (where
/// k8s-athenz-sia's `:port` means every interface, a pod's token server here stays private
/// unless an address says otherwise).
pub fn parse_listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    let text = text.trim();
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not host:port or :port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{text:?}: the port is not a number up to 65535"))?;
    let ip: std::net::IpAddr = match host.trim_start_matches('[').trim_end_matches(']') {
        "" | "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        ip => ip
            .parse()
            .map_err(|_| format!("{text:?}: {host:?} is not an IP address or localhost"))?,
    };
    Ok(std::net::SocketAddr::new(ip, port))
}

/// The `athenz-sia` command: parses `args` (the program name first), runs `init`, `refresh` or
/// `status` and says how it ended: 0 done (or SIGTERM during refresh; healthy files for
/// `status`), 1 failed (unhealthy files), 2 bad settings. `main`
/// runs it, and so does `athenz-devstack` when it re-executes itself under this name.
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let started = std::time::Instant::now();
    // TLS configs here name their crypto provider (athenz_core::tls::provider), so none is
    // installed process-wide:
    // it would only add memory to a process that runs in every pod.
    let cli = Cli::parse_from(args);
    let (mut settings, refresh) = match cli.command {
        Command::Init(s) => (s, false),
        Command::Refresh(s) => (s, true),
        Command::Status(args) => {
            // certificate chain checks use the TLS stack's verifier
            athenz_core::install_crypto_provider();
            return status::run(&args);
        }
    };
    if let Some(key_source) = cli.key_source {
        settings.key_source = key_source;
    }
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
            sia.init(started).await
        }
    })
}

/// The name of the ZTS CA bundle the agent publishes beside its socket.
pub const AGENT_ZTS_CA_NAME: &str = "zts-ca.pem";

impl Settings {
    /// The CA bundle that verifies ZTS: --zts-ca, else ZTS_CA_FILE, else the agent's published
    /// copy beside the --endpoint socket.
    pub fn zts_ca_path(&self) -> PathBuf {
        self.zts_ca
            .clone()
            .or_else(|| self.zts_ca_file.clone())
            .unwrap_or_else(|| {
                self.endpoint
                    .parent()
                    .unwrap_or_else(|| std::path::Path::new("/"))
                    .join(AGENT_ZTS_CA_NAME)
            })
    }
}
