//! Our release on the real node, installed as an operator installs it (DESIGN.md 5.1): cluster
//! DNS, the Athenz side (the dev ZTS beside the cluster, knowing the control plane's registered
//! keys and the provider), the release image imported into containerd, and `kubectl apply -k` of
//! `deploy/overlays/local` from a copy of `deploy/` whose `generated/` holds this Athenz's URL,
//! CA and keys. Nothing of `deploy/base` is changed here: what the real cluster proves wrong
//! there is fixed in the base itself.

use super::components;
use super::dns;
use super::images;
use super::kubectl::Kubectl;
use super::{CLUSTER_DNS, Layout};
use crate::json_file;
use crate::procs::{Command, Process, free_port};
use crate::stack::keys::generate_keys;
use crate::stack::{UrlCa, demo_roles};
use anyhow::Context;
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZtsConfig, StandaloneInfo};
use base64::Engine as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The namespace `deploy/` installs into.
pub const NAMESPACE: &str = "athenz-system";
/// The workloads `deploy/` runs, each of which must roll out.
pub const WORKLOADS: [&str; 4] = [
    "deployment/athenz-jwt-service",
    "deployment/athenz-callback",
    "deployment/athenz-initializer",
    "daemonset/athenz-agent",
];
/// The callback's endpoint as an operator registers it in Athenz (docs/operating.md): its
/// Service, by its in-cluster name, which the dev ZTS resolves through the cluster's DNS.
pub const PROVIDER_ENDPOINT: &str = "https://athenz-callback.athenz-system.svc.cluster.local:443";
/// How long each workload may take to roll out (images are local; the control plane's init
/// containers each get a certificate from ZTS first).
const ROLLOUT: Duration = Duration::from_secs(180);
/// The dev ZTS's process name (in `processes.json` and the logs).
const ZTS: &str = "zts";

/// What is installed: the release image and the overlay.
#[derive(Debug, Clone)]
pub struct Release {
    /// The OCI archive `deploy/image.sh` writes.
    pub image_archive: PathBuf,
    /// The repository's `deploy/` (copied; the copy's `overlays/local` is applied).
    pub deploy_dir: PathBuf,
    /// Whether the archive is this workspace's default, which [`Release::check`] builds with
    /// `deploy/image.sh` when it is missing (a given one must exist).
    pub build_if_missing: bool,
    /// The longest certificate the dev ZTS issues, minutes (every certificate: the pods', the
    /// nodes', the control plane's); Athenz's 30 days when `None`. Short ones make the refresh
    /// paths run within a test.
    pub cert_minutes: Option<u32>,
}

impl Release {
    /// The given archive and `deploy/`, or this workspace's.
    pub fn new(image_archive: Option<PathBuf>, deploy_dir: Option<PathBuf>) -> Self {
        Self {
            build_if_missing: image_archive.is_none(),
            image_archive: image_archive.unwrap_or_else(super::default_image_archive),
            deploy_dir: deploy_dir.unwrap_or_else(super::default_deploy_dir),
            cert_minutes: None,
        }
    }

    /// Fails, naming what to run, when the archive or the overlay is missing (before any of the
    /// cluster is started); the default archive is built first with the workspace's
    /// `deploy/image.sh` (minutes the first time: release builds of every binary).
    pub fn check(&self) -> anyhow::Result<()> {
        let image_sh = self.deploy_dir.join("image.sh");
        if !self.image_archive.is_file() && self.build_if_missing && image_sh.is_file() {
            eprintln!(
                "{} is missing: building it with {}",
                self.image_archive.display(),
                image_sh.display()
            );
            let workspace = self
                .deploy_dir
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let status = std::process::Command::new(&image_sh)
                .current_dir(workspace)
                .status()
                .with_context(|| format!("running {}", image_sh.display()))?;
            if !status.success() {
                anyhow::bail!("{} failed ({status})", image_sh.display());
            }
        }
        if !self.image_archive.is_file() {
            anyhow::bail!(
                "the release image {} is missing: build it with deploy/image.sh, or pass \
                 --image-archive FILE (or --bare for Kubernetes alone)",
                self.image_archive.display()
            );
        }
        let overlay = self.deploy_dir.join("overlays/local/kustomization.yaml");
        if !overlay.is_file() {
            anyhow::bail!(
                "{} is missing: pass --deploy with the repository's deploy/",
                overlay.display()
            );
        }
        Ok(())
    }
}

/// What the install adds to `cluster.json`.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The dev ZTS.
    pub zts: UrlCa,
    /// The image reference the workloads run.
    pub image: String,
    /// The overlay that was applied.
    pub overlay: PathBuf,
}

/// Installs everything (see the module docs); the dev ZTS joins `processes`.
pub async fn install(
    layout: &Layout,
    node_ip: Ipv4Addr,
    release: &Release,
    processes: &mut Vec<Process>,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<Installed> {
    let kubectl = Kubectl::new(layout);
    let started = std::time::Instant::now();
    dns::deploy(layout, &kubectl)?;
    report(format!(
        "cluster DNS (CoreDNS) Ready at {CLUSTER_DNS} in {:.1} s",
        started.elapsed().as_secs_f64()
    ));

    let athenz = layout.athenz.clone();
    let zts = start_dev_zts(layout, &athenz, node_ip, release.cert_minutes, processes).await?;
    report(format!(
        "dev ZTS at {} (provider endpoint {PROVIDER_ENDPOINT})",
        zts.url
    ));

    let image = images::archive_reference(&release.image_archive)?;
    images::import(layout, &release.image_archive)?;
    report(format!("image {image} imported"));

    let overlay = write_overlay(&athenz, &release.deploy_dir, &zts)?;
    let started = std::time::Instant::now();
    kubectl.apply_kustomization(&overlay)?;
    for workload in WORKLOADS {
        kubectl.wait_rolled_out(NAMESPACE, workload, ROLLOUT)?;
    }
    report(format!(
        "kubectl apply -k {}: {} Ready in {:.1} s",
        overlay.display(),
        WORKLOADS.join(", "),
        started.elapsed().as_secs_f64()
    ));
    Ok(Installed {
        zts: UrlCa {
            url: zts.url,
            ca: zts.ca,
        },
        image,
        overlay,
    })
}

/// Starts the dev ZTS on the node's address (pods reach it there; the agent on the host network
/// too), knowing the control plane's registered keys and the provider; the keys stay in
/// `athenz/keys` for the overlay's Secrets.
async fn start_dev_zts(
    layout: &Layout,
    athenz: &Path,
    node_ip: Ipv4Addr,
    cert_minutes: Option<u32>,
    processes: &mut Vec<Process>,
) -> anyhow::Result<StandaloneInfo> {
    for dir in ["jwt-keys", "jwt-public", "zts"] {
        let dir = athenz.join(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let (services, _) = generate_keys(athenz)?;
    let config = DevZtsConfig {
        listen: SocketAddr::from((node_ip, free_port()?)),
        services,
        providers: vec![ProviderEntry {
            name: PROVIDER.into(),
            endpoint: PROVIDER_ENDPOINT.into(),
            dns_suffixes: vec![DNS_SUFFIX.into()],
            launch: vec!["*".into()],
        }],
        // the control plane's certificates name their Services (`<name>.athenz-system.svc`)
        service_dns_suffixes: vec![DNS_SUFFIX.into(), "svc".into()],
        roles: demo_roles(),
        max_cert_lifetime_minutes: cert_minutes
            .unwrap_or(DevZtsConfig::default().max_cert_lifetime_minutes),
        provider_dns_server: Some(SocketAddr::from((
            CLUSTER_DNS
                .parse::<Ipv4Addr>()
                .context("the cluster DNS address")?,
            53,
        ))),
        ..DevZtsConfig::default()
    };
    let dir = athenz.join("zts");
    json_file::write_atomically(&dir.join("config.json"), &config)?;
    let exe = std::env::current_exe().context("finding athenz-devstack itself")?;
    let args = vec![
        "zts".to_owned(),
        format!("--state-dir={}", dir.display()),
        format!("--config={}", dir.join("config.json").display()),
    ];
    let mut zts = Process::start(Command::new(ZTS, &exe, args), &layout.logs)?;
    zts.wait_file(&dir.join("zts.json")).await?;
    processes.push(zts);
    components::write_pids(layout, processes)?;
    json_file::read(&dir.join("zts.json")).context("reading the dev ZTS's zts.json")
}

/// Copies `deploy/` into `athenz/deploy` and writes its `overlays/local/generated/`: the ZTS URL,
/// the CA, each control-plane service's key, the JWT signing key and its public half, and the
/// webhook's caBundle. Returns the overlay's directory.
fn write_overlay(
    athenz: &Path,
    deploy_dir: &Path,
    zts: &StandaloneInfo,
) -> anyhow::Result<PathBuf> {
    let copy = athenz.join("deploy");
    if copy.exists() {
        std::fs::remove_dir_all(&copy).with_context(|| format!("removing {}", copy.display()))?;
    }
    images::run(
        std::process::Command::new("cp")
            .arg("-r")
            .arg(deploy_dir)
            .arg(&copy),
        &format!("copying {} to {}", deploy_dir.display(), copy.display()),
    )?;
    let overlay = copy.join("overlays/local");
    let generated = overlay.join("generated");
    std::fs::create_dir_all(&generated)
        .with_context(|| format!("creating {}", generated.display()))?;
    let ca = std::fs::read_to_string(&zts.ca)
        .with_context(|| format!("reading the ZTS CA {}", zts.ca.display()))?;
    let write = |name: &str, text: &str, mode: u32| {
        athenz_testbed::pki::write_file(&generated.join(name), text.as_bytes(), mode)
    };
    let copy_key = |from: PathBuf, name: &str| -> anyhow::Result<()> {
        let text = std::fs::read_to_string(&from)
            .with_context(|| format!("reading {}", from.display()))?;
        write(name, &text, 0o600)?;
        Ok(())
    };
    write(
        "cluster.env",
        &format!(
            "ZTS_URL={}\nADMIN_DOMAIN={ADMIN_DOMAIN}\nPROVIDER={PROVIDER}\nDNS_SUFFIX={DNS_SUFFIX}\n",
            zts.url
        ),
        0o644,
    )?;
    write("zts-ca.pem", &ca, 0o644)?;
    for service in [
        "athenz-jwt-service",
        "athenz-callback",
        "athenz-initializer",
    ] {
        copy_key(
            athenz.join("keys").join(service).join("service.key"),
            &format!("{service}.key"),
        )?;
    }
    copy_key(athenz.join("jwt-keys/v1.pem"), "jwt-signing-v1.pem")?;
    copy_key(athenz.join("jwt-public/v1.pem"), "jwt-public-v1.pem")?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca.as_bytes());
    write(
        "webhook-ca.yaml",
        &format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\n\
             metadata:\n  name: athenz-initializer\nwebhooks:\n  - name: initializer.athenz.io\n\
             \x20   clientConfig:\n      caBundle: {bundle}\n"
        ),
        0o644,
    )?;
    Ok(overlay)
}
