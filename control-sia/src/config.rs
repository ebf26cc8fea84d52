//! Settings: every one a flag with an environment fallback, checked at start with errors that name
//! the setting (docs/design.md §4.8).

use athenz_core::crypto::PrivateKey;
use athenz_core::names;
use athenz_core::refresh::parse_duration;
use athenz_core::telemetry::LogFormat;
use athenz_core::tls::ServerCaBundle;
use athenz_core::zts::PRINCIPAL_AUTH_HEADER;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Command line of `athenz-control-sia`.
#[derive(Debug, Parser)]
#[command(
    name = "athenz-control-sia",
    version,
    about = "Athenz identity for control-plane services from a service key on disk"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `init` or `refresh`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Get a certificate and ntoken, write them, exit (an init container).
    Init(Settings),
    /// Keep the certificate and ntoken fresh until SIGTERM (a sidecar).
    Refresh(RefreshSettings),
}

/// The setting named in errors about the operations address.
pub const OPS_SETTING: &str = "--ops-listen (OPS_LISTEN)";

/// `refresh`'s settings: those of `init`, and the operations endpoint only a long-running
/// process has.
#[derive(Debug, Clone, Args)]
pub struct RefreshSettings {
    /// Everything `init` takes too.
    #[command(flatten)]
    pub settings: Settings,
    /// Address of /healthz, /readyz and /metrics (the manifests: 0.0.0.0:9091); unset, none is
    /// served.
    ///
    /// No default, unlike the daemons' 0.0.0.0:9090: this sidecar shares its pod's network
    /// namespace with the daemon already listening there, and several run side by side on one
    /// host in the devstack, so each is given an address of its own.
    #[arg(long, env = "OPS_LISTEN")]
    pub ops_listen: Option<SocketAddr>,
}

/// Binds the operations address of `refresh`, if one is set. Done before anything else runs,
/// so an address that is taken is a start-up error naming the setting, like any bad setting.
pub fn bind_ops(addr: Option<SocketAddr>) -> Result<Option<std::net::TcpListener>, SettingError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| bad(OPS_SETTING, format!("{addr}: {e}")))?;
    Ok(Some(listener))
}

/// Every setting.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// Directory holding `service.key` (PEM: PKCS#8, SEC1 or PKCS#1; RSA or EC P-256) and
    /// `service.version` (the key's version in Athenz).
    #[arg(long, env = "KEY_DIR")]
    pub key_dir: PathBuf,
    /// Athenz domain of the service.
    #[arg(long, env = "DOMAIN")]
    pub domain: String,
    /// Athenz service name.
    #[arg(long, env = "SERVICE")]
    pub service: String,
    /// ZTS base URL, ending in /zts/v1.
    #[arg(long, env = "ZTS_URL")]
    pub zts_url: String,
    /// CA bundle (PEM) that verifies ZTS; the system roots are never used.
    #[arg(long, env = "ZTS_CA_FILE")]
    pub zts_ca: PathBuf,
    /// DNS suffix of the certificate's SAN `<service>.<domain-with-dashes>.<suffix>`.
    #[arg(long, env = "DNS_SUFFIX")]
    pub dns_suffix: String,
    /// More DNS SANs, for the names clients reach this service by (e.g. its Kubernetes Service,
    /// `athenz-initializer.athenz-system.svc`, which kube-apiserver verifies). Comma-separated.
    /// ZTS decides whether they are allowed (its configured DNS suffixes).
    #[arg(long = "dns-name", env = "DNS_NAMES", value_delimiter = ',')]
    pub dns_names: Vec<String>,
    /// IP SANs (e.g. 127.0.0.1 for a service reached on loopback). Comma-separated. ZTS accepts
    /// only the address it sees the request come from.
    #[arg(long = "ip-address", env = "IP_ADDRESSES", value_delimiter = ',')]
    pub ip_addresses: Vec<std::net::IpAddr>,
    /// Header carrying the ntoken to ZTS.
    #[arg(long, env = "AUTH_HEADER", default_value = PRINCIPAL_AUTH_HEADER)]
    pub auth_header: String,
    /// Certificate lifetime to ask for, minutes (ZTS may grant less).
    #[arg(long, env = "CERT_LIFETIME_MINUTES")]
    pub lifetime_minutes: Option<u32>,
    /// Directory of the credential set: service.cert.pem (leaf + chain), ca.cert.pem, ntoken.
    #[arg(long, env = "OUT_DIR", default_value = "/var/run/athenz")]
    pub out_dir: PathBuf,
    /// Group (name or gid) given read access to the ntoken (files become 0640).
    #[arg(long, env = "GROUP")]
    pub group: Option<String>,
    /// Lifetime of the ntokens written; they are rewritten at half of it.
    #[arg(long, env = "NTOKEN_LIFETIME", default_value = "2h", value_parser = parse_duration)]
    pub ntoken_lifetime: Duration,
    /// The latest a certificate refresh may come, whatever the certificate's lifetime.
    #[arg(long, env = "REFRESH_INTERVAL", default_value = "24h", value_parser = parse_duration)]
    pub refresh_interval: Duration,
    /// Host name recorded in the ntoken (`h=`).
    #[arg(long, env = "NTOKEN_HOST")]
    pub host: Option<String>,
    /// How long `init` keeps retrying ZTS when it is unreachable or busy.
    #[arg(long, env = "INIT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub init_timeout: Duration,
    /// Time allowed for one ZTS call.
    #[arg(long, env = "ZTS_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub zts_timeout: Duration,
    /// Log format: human or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "human")]
    pub log_format: LogFormat,
}

/// A setting that cannot be used; says which and why.
#[derive(Debug, Error)]
#[error("setting {setting}: {reason}")]
pub struct SettingError {
    /// The flag (and its environment variable).
    pub setting: &'static str,
    pub reason: String,
}

fn bad(setting: &'static str, reason: impl Into<String>) -> SettingError {
    SettingError {
        setting,
        reason: reason.into(),
    }
}

/// Settings after validation, with the files they name read.
pub struct Loaded {
    /// The raw settings.
    pub settings: Settings,
    /// The service key.
    pub key: PrivateKey,
    /// Its version (`k=` and `keyId`).
    pub key_version: String,
    /// The CA bundle that verifies ZTS, followed as its file changes.
    pub zts_cas: std::sync::Arc<ServerCaBundle>,
    /// Resolved group id.
    pub gid: Option<u32>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("settings", &self.settings)
            .field("key_version", &self.key_version)
            .finish_non_exhaustive()
    }
}

fn read_text(path: &Path, setting: &'static str, what: &str) -> Result<String, SettingError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        bad(
            setting,
            format!("cannot read {what} {}: {e}", path.display()),
        )
    })?;
    if meta.len() > 256 * 1024 {
        return Err(bad(
            setting,
            format!("{what} {} is too large", path.display()),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| {
        bad(
            setting,
            format!("cannot read {what} {}: {e}", path.display()),
        )
    })
}

impl Settings {
    /// Validates every setting and reads the key, its version and the CA bundle.
    pub fn load(self) -> Result<Loaded, SettingError> {
        names::validate_domain("domain", &self.domain)
            .map_err(|e| bad("--domain (DOMAIN)", e.to_string()))?;
        names::validate_service("service", &self.service)
            .map_err(|e| bad("--service (SERVICE)", e.to_string()))?;
        names::validate_dns_name("dns suffix", &self.dns_suffix)
            .map_err(|e| bad("--dns-suffix (DNS_SUFFIX)", e.to_string()))?;
        for name in &self.dns_names {
            names::validate_dns_name("dns name", name)
                .map_err(|e| bad("--dns-name (DNS_NAMES)", e.to_string()))?;
        }
        if !self.zts_url.starts_with("https://") {
            return Err(bad(
                "--zts-url (ZTS_URL)",
                "must be an https:// URL ending in /zts/v1",
            ));
        }
        let header_ok = !self.auth_header.is_empty()
            && self
                .auth_header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !header_ok {
            return Err(bad(
                "--auth-header (AUTH_HEADER)",
                "must be an HTTP header name",
            ));
        }
        if let Some(host) = &self.host {
            names::validate_dns_name("host", host)
                .map_err(|e| bad("--host (NTOKEN_HOST)", e.to_string()))?;
        }
        if self.lifetime_minutes == Some(0) {
            return Err(bad(
                "--lifetime-minutes (CERT_LIFETIME_MINUTES)",
                "must be above zero",
            ));
        }

        let key_setting = "--key-dir (KEY_DIR)";
        let key_pem = read_text(
            &self.key_dir.join("service.key"),
            key_setting,
            "service key",
        )?;
        let key = PrivateKey::from_pem(&key_pem).map_err(|e| {
            bad(
                key_setting,
                format!("{}: {e}", self.key_dir.join("service.key").display()),
            )
        })?;
        let key_version = read_text(
            &self.key_dir.join("service.version"),
            key_setting,
            "key version",
        )?
        .trim()
        .to_owned();
        names::validate_simple_name("key version", &key_version)
            .map_err(|e| bad(key_setting, format!("service.version: {e}")))?;

        let ca_setting = "--zts-ca (ZTS_CA_FILE)";
        // followed as the file changes: a ZTS CA rotation reaches control SIA with no restart
        let zts_cas =
            ServerCaBundle::from_file(&self.zts_ca).map_err(|e| bad(ca_setting, e.to_string()))?;
        let gid = match &self.group {
            Some(g) => {
                Some(athenz_core::files::resolve_group(g).map_err(|e| bad("--group (GROUP)", e))?)
            }
            None => None,
        };
        Ok(Loaded {
            settings: self,
            key,
            key_version,
            zts_cas,
            gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `verb` with every required setting as a flag (so the environment cannot supply them).
    fn parse(verb: &str, extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut args = vec![
            "athenz-control-sia",
            verb,
            "--key-dir=/k",
            "--domain=k8s.admin",
            "--service=athenz-callback",
            "--zts-url=https://zts/zts/v1",
            "--zts-ca=/ca.pem",
            "--dns-suffix=athenz.cloud",
        ];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args)
    }

    fn refresh(extra: &[&str]) -> RefreshSettings {
        match parse("refresh", extra).unwrap().command {
            Command::Refresh(r) => r,
            Command::Init(_) => panic!("parsed as init"),
        }
    }

    #[test]
    fn ops_listen_is_refresh_only_and_checked_as_an_address() {
        assert_eq!(
            refresh(&["--ops-listen=0.0.0.0:9091"]).ops_listen,
            Some("0.0.0.0:9091".parse().unwrap())
        );
        assert_eq!(
            refresh(&["--ops-listen=[::1]:9091"]).ops_listen,
            Some("[::1]:9091".parse().unwrap())
        );

        for bad in ["9091", "localhost:9091", "0.0.0.0", "0.0.0.0:99999", ""] {
            let err = parse("refresh", &[&format!("--ops-listen={bad}")]).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad:?}: {err}"
            );
            assert!(err.to_string().contains("--ops-listen"), "{bad:?}: {err}");
        }

        // init exits at once: it has no endpoint to serve
        let err = parse("init", &["--ops-listen=0.0.0.0:9091"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument, "{err}");
    }

    #[test]
    fn an_address_already_taken_is_a_setting_error_naming_ops_listen() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind_ops(refresh(&[&format!("--ops-listen={addr}")]).ops_listen).unwrap_err();
        assert_eq!(err.setting, OPS_SETTING);
        assert!(err.to_string().contains(&addr.to_string()), "{err}");

        drop(taken);
        let listener = bind_ops(refresh(&[&format!("--ops-listen={addr}")]).ops_listen)
            .unwrap()
            .expect("a listener when the address is set");
        assert_eq!(listener.local_addr().unwrap(), addr);
        // no address, no endpoint
        assert!(bind_ops(None).unwrap().is_none());
    }
}
