//! `athenz-sia status`: what the identity files in a directory hold and whether a program can use
//! them, as an exec probe asks (exit 0 healthy, 1 not) and an operator reads (`--json` for
//! scripts). It reads the files only — the agent is not asked — so it answers the question "what
//! does my application see right now", whoever wrote the files (this SIA or the CSI driver's
//! files mode).

use athenz_core::crypto::{CertInfo, PrivateKey, key_matches_cert, pem_certificates};
use athenz_core::files::{CA_FILE, CERT_FILE, FileSet, KEY_FILE};
use athenz_core::refresh::parse_duration;
use athenz_core::tls::IssuerCheck;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Settings of `athenz-sia status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The directory the identity files are in.
    #[arg(long, env = "OUT_DIR", default_value = "/var/run/athenz")]
    pub out_dir: PathBuf,
    /// Unhealthy when the certificate expires within this time (e.g. `10m`): a probe can fail
    /// before the application's connections do. Unset, only expiry itself is unhealthy.
    #[arg(long, value_parser = parse_duration)]
    pub min_remaining: Option<Duration>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Check what the refresher's SDS socket serves (`default` and `ROOTCA`, as a proxy gets
    /// them) instead of the files.
    #[arg(long)]
    pub sds_socket: Option<PathBuf>,
    /// How long the SDS socket may take to answer.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub sds_timeout: Duration,
    /// Check again every half second until healthy, for at most this long (e.g. `60s`): an init
    /// container placed after the refresher waits for its files or its SDS socket this way.
    /// Unset: check once.
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
}

/// What the files hold.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FilesStatus {
    /// The directory read.
    pub out_dir: String,
    /// Every check passed.
    pub healthy: bool,
    /// Why not, one line each (empty when healthy).
    pub problems: Vec<String>,
    /// The certificate's subject CN: the Athenz principal.
    pub principal: Option<String>,
    /// DNS SANs.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<String>,
    /// URI SANs (instance id, SPIFFE id).
    pub uris: Vec<String>,
    /// Serial, lowercase hex.
    pub serial: Option<String>,
    /// Start of validity, RFC 3339.
    pub not_before: Option<String>,
    /// End of validity, RFC 3339.
    pub not_after: Option<String>,
    /// Seconds until `not_after` (negative once expired).
    pub expires_in_seconds: Option<i64>,
    /// The certificate chains to `ca.cert.pem` and is valid now.
    pub chain_verified: bool,
    /// `service.key.pem` is the certificate's private key.
    pub key_matches: bool,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// An empty report about `source`.
fn empty(source: String) -> FilesStatus {
    FilesStatus {
        out_dir: source,
        healthy: false,
        problems: Vec::new(),
        principal: None,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        uris: Vec::new(),
        serial: None,
        not_before: None,
        not_after: None,
        expires_in_seconds: None,
        chain_verified: false,
        key_matches: false,
    }
}

/// Reads and checks the set in `args.out_dir` at `now`.
pub fn check(args: &StatusArgs, now: OffsetDateTime) -> FilesStatus {
    let mut status = empty(args.out_dir.display().to_string());
    // one read of one set: a rotation in between cannot pair a new key with an old certificate
    let files = match FileSet::new(&args.out_dir).read(&[KEY_FILE, CERT_FILE, CA_FILE]) {
        Ok(files) => files,
        Err(e) => {
            status
                .problems
                .push(format!("cannot read the identity files: {e}"));
            return status;
        }
    };
    let [key, cert, ca] = [&files[0], &files[1], &files[2]].map(|b| String::from_utf8_lossy(b));
    assess(status, &key, &cert, &ca, args, now)
}

/// Checks what the SDS socket `socket` served (or why it served nothing) at `now`.
pub fn check_served(
    served: Result<crate::sds_probe::Served, String>,
    socket: &std::path::Path,
    args: &StatusArgs,
    now: OffsetDateTime,
) -> FilesStatus {
    let mut status = empty(format!("sds:{}", socket.display()));
    match served {
        Ok(served) => assess(status, &served.key, &served.chain, &served.ca, args, now),
        Err(e) => {
            status.problems.push(format!("SDS: {e}"));
            status
        }
    }
}

/// The checks of a set: the certificate readable, valid (for at least --min-remaining), its key,
/// its chain to the CA bundle.
fn assess(
    mut status: FilesStatus,
    key: &str,
    cert: &str,
    ca: &str,
    args: &StatusArgs,
    now: OffsetDateTime,
) -> FilesStatus {
    match CertInfo::from_pem(cert) {
        Ok(info) => {
            status.principal = Some(info.common_name.clone());
            status.dns_names = info.dns_names.clone();
            status.ip_addresses = info.ip_addresses.iter().map(ToString::to_string).collect();
            status.uris = info.uris.clone();
            status.serial = Some(info.serial_hex.clone());
            status.not_before = Some(rfc3339(info.not_before));
            status.not_after = Some(rfc3339(info.not_after));
            let remaining = (info.not_after - now).whole_seconds();
            status.expires_in_seconds = Some(remaining);
            if info.not_after <= now {
                status.problems.push(format!(
                    "{CERT_FILE} expired at {}",
                    rfc3339(info.not_after)
                ));
            } else if let Some(min) = args.min_remaining
                && remaining.unsigned_abs() < min.as_secs()
            {
                status.problems.push(format!(
                    "{CERT_FILE} expires in {remaining} s, less than --min-remaining {} s",
                    min.as_secs()
                ));
            }
            match PrivateKey::from_pem(key) {
                Ok(key) => {
                    status.key_matches = key_matches_cert(&key, &info);
                    if !status.key_matches {
                        status
                            .problems
                            .push(format!("{KEY_FILE} is not the private key of {CERT_FILE}"));
                    }
                }
                Err(e) => status.problems.push(format!("{KEY_FILE}: {e}")),
            }
            status.chain_verified = verify_chain(cert, ca)
                .map_err(|e| status.problems.push(e))
                .is_ok();
        }
        Err(e) => status.problems.push(format!("{CERT_FILE}: {e}")),
    }
    status.healthy = status.problems.is_empty();
    status
}

/// The certificate file (leaf, then any intermediates) chains to the CA file and is valid now.
fn verify_chain(cert_pem: &str, ca_pem: &str) -> Result<(), String> {
    let cas = pem_certificates(ca_pem).map_err(|e| format!("{CA_FILE}: {e}"))?;
    if cas.is_empty() {
        return Err(format!("{CA_FILE} holds no certificate"));
    }
    let chain = pem_certificates(cert_pem).map_err(|e| format!("{CERT_FILE}: {e}"))?;
    IssuerCheck::new(&cas)
        .map_err(|e| format!("{CA_FILE}: {e}"))?
        .check(&chain)
        .map_err(|e| format!("{CERT_FILE} does not verify against {CA_FILE}: {e}"))
}

/// The human form: one `field: value` per line, problems last.
pub fn to_text(status: &FilesStatus) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(", ")
        }
    };
    let mut out = format!(
        "out dir:     {}\nhealthy:     {}\nprincipal:   {}\nDNS SANs:    {}\nIP SANs:     {}\nURI SANs:    {}\nserial:      {}\nvalid:       {} .. {}\nexpires in:  {}\nchain:       {}\nkey matches: {}\n",
        status.out_dir,
        if status.healthy { "yes" } else { "NO" },
        opt(&status.principal),
        list(&status.dns_names),
        list(&status.ip_addresses),
        list(&status.uris),
        opt(&status.serial),
        opt(&status.not_before),
        opt(&status.not_after),
        status
            .expires_in_seconds
            .map(|s| format!("{s} s"))
            .unwrap_or_else(|| "-".into()),
        if status.chain_verified {
            "verified against ca.cert.pem"
        } else {
            "NOT verified"
        },
        if status.key_matches { "yes" } else { "no" },
    );
    for problem in &status.problems {
        out.push_str(&format!("problem:     {problem}\n"));
    }
    out
}

/// One check of the files, or of the SDS socket when one is given.
fn check_once(args: &StatusArgs) -> FilesStatus {
    match &args.sds_socket {
        Some(socket) => {
            let served = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting the runtime: {e}"))
                .and_then(|rt| rt.block_on(crate::sds_probe::fetch(socket, args.sds_timeout)));
            check_served(served, socket, args, OffsetDateTime::now_utc())
        }
        None => check(args, OffsetDateTime::now_utc()),
    }
}

/// Runs `status`: prints the report on stdout (the command's output, not a log line); 0 if
/// healthy, 1 if not.
pub fn run(args: &StatusArgs) -> std::process::ExitCode {
    use std::io::Write;
    let deadline = args.wait.map(|wait| std::time::Instant::now() + wait);
    let status = loop {
        let status = check_once(args);
        match deadline {
            Some(deadline) if !status.healthy && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500));
            }
            _ => break status,
        }
    };
    let report = if args.json {
        serde_json::to_string_pretty(&status)
            .map(|json| json + "\n")
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot print the status: {e}\"}}\n"))
    } else {
        to_text(&status)
    };
    let printed = std::io::stdout().lock().write_all(report.as_bytes());
    if status.healthy && printed.is_ok() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}
