//! The control plane's keys and certificates: each service's registered key (its public half
//! goes to the dev ZTS), the JWT signing key, and the certificates athenz-control-sia gets from
//! ZTS for them, as the Deployments' init containers and sidecars do.

use super::launch::path_arg;
use super::{ADMIN_DOMAIN, CALLBACK, DNS_SUFFIX, INITIALIZER, JWT_SERVICE, STRANGER};
use crate::procs::{Command, Process};
use anyhow::{Context, bail};
use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_testbed::zts::registry::ServiceEntry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Paths of one control-plane service's key and credentials.
pub(crate) struct ServiceFiles {
    key_dir: PathBuf,
    out_dir: PathBuf,
}

impl ServiceFiles {
    pub(crate) fn key(&self) -> PathBuf {
        self.key_dir.join("service.key")
    }
    pub(super) fn cert(&self) -> PathBuf {
        self.out_dir.join("service.cert.pem")
    }
}

/// Generates a service's key (its "registered" key) and returns the public half for ZTS.
fn service_key(state: &Path, service: &str) -> anyhow::Result<(ServiceFiles, String)> {
    let files = ServiceFiles {
        key_dir: state.join("keys").join(service),
        out_dir: state.join("certs").join(service),
    };
    std::fs::create_dir_all(&files.key_dir)
        .with_context(|| format!("creating {}", files.key_dir.display()))?;
    let key = PrivateKey::generate(KeyAlgorithm::P256).context("generating a service key")?;
    athenz_testbed::pki::write_file(
        &files.key(),
        key.to_pkcs8_pem()
            .context("encoding a service key")?
            .expose()
            .as_bytes(),
        0o600,
    )?;
    athenz_testbed::pki::write_file(&files.key_dir.join("service.version"), b"0\n", 0o644)?;
    Ok((files, key.key_pair().public_key_pem()))
}

/// Generates every control-plane service's key (the ZTS registrations returned) and the JWT
/// signing key (`jwt-keys/v1.pem`, its public half in `jwt-public/v1.pem`).
pub(crate) fn generate_keys(
    state: &Path,
) -> anyhow::Result<(Vec<ServiceEntry>, BTreeMap<&'static str, ServiceFiles>)> {
    let mut services = Vec::new();
    let mut files = BTreeMap::new();
    for service in [JWT_SERVICE, CALLBACK, INITIALIZER, STRANGER] {
        let (f, public) = service_key(state, service)?;
        services.push(ServiceEntry {
            name: format!("{ADMIN_DOMAIN}.{service}"),
            public_keys: BTreeMap::from([("0".to_owned(), public)]),
        });
        files.insert(service, f);
    }
    let signing = PrivateKey::generate(KeyAlgorithm::P256).context("generating the JWT key")?;
    athenz_testbed::pki::write_file(
        &state.join("jwt-keys/v1.pem"),
        signing
            .to_pkcs8_pem()
            .context("encoding the JWT key")?
            .expose()
            .as_bytes(),
        0o600,
    )?;
    athenz_testbed::pki::write_file(
        &state.join("jwt-public/v1.pem"),
        signing.key_pair().public_key_pem().as_bytes(),
        0o644,
    )?;
    Ok((services, files))
}

/// Runs `athenz-control-sia init` for every service (all at once, each must succeed), then
/// starts a `refresh` sidecar for each that serves (not the stranger); returns the sidecars.
pub(super) async fn control_plane_certificates(
    control_sia: &Path,
    files: &BTreeMap<&'static str, ServiceFiles>,
    zts_url: &str,
    ca: &Path,
    logs: &Path,
) -> anyhow::Result<Vec<Process>> {
    let control_args = |service: &str, f: &ServiceFiles| {
        vec![
            path_arg("key-dir", &f.key_dir),
            format!("--domain={ADMIN_DOMAIN}"),
            format!("--service={service}"),
            format!("--zts-url={zts_url}"),
            path_arg("zts-ca", ca),
            format!("--dns-suffix={DNS_SUFFIX}"),
            path_arg("out-dir", &f.out_dir),
            "--ip-address=127.0.0.1".into(),
        ]
    };
    let mut inits = Vec::new();
    for (service, f) in files {
        let mut args = vec!["init".to_owned()];
        args.extend(control_args(service, f));
        inits.push(Process::start(
            Command::new(&format!("control-sia-init-{service}"), control_sia, args),
            logs,
        )?);
    }
    for init in &mut inits {
        if !init.wait_exit(Duration::from_secs(60)).await? {
            bail!(
                "{} failed; its log:\n{}",
                init.command.name,
                init.log_tail()
            );
        }
    }
    let mut sidecars = Vec::new();
    for (service, f) in files.iter().filter(|(s, _)| **s != STRANGER) {
        let mut args = vec!["refresh".to_owned()];
        args.extend(control_args(service, f));
        sidecars.push(Process::start(
            Command::new(&format!("control-sia-{service}"), control_sia, args),
            logs,
        )?);
    }
    Ok(sidecars)
}
