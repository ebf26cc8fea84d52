//! Our release on the real node, installed as an operator installs it (docs/design.md §5.1):
//! cluster DNS, the Athenz side (the dev ZTS, or Athenz's own with `--zts athenz`, beside the
//! cluster, knowing the control plane's registered keys and the provider), the release image imported into containerd, and then the
//! shell steps of docs/operating.md's "Install", verbatim ([`runbook`]), in a copy of `deploy/`,
//! with this Athenz's URL, CA and keys as the operator's `ZTS_URL`, `ATHENZ_CA` and `KEYS`. Nothing
//! of `deploy/base` is changed here: what the real cluster proves wrong there is fixed in the base
//! itself, and what it proves wrong in the steps is fixed in the page.

use super::dns;
use super::images;
use super::info::NodeInfo;
use super::kubectl::Kubectl;
use super::layout::write_pids;
use super::runbook;
use super::{CLUSTER_DNS, Layout};
use crate::json_file;
use crate::procs::{Command, Process, free_port};
use crate::stack::keys::generate_keys;
use crate::stack::{UrlCa, ZtsServer, demo_roles};
use anyhow::Context;
use athenz_testbed::fixtures::{AGENT_PRINCIPAL, DNS_SUFFIX, PROVIDER};
use athenz_testbed::zts::registry::{ProviderEntry, ServiceEntry};
use athenz_testbed::zts::{DevZtsConfig, StandaloneInfo};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The agent DaemonSet's namespace (Pod Security `privileged`; nothing else runs there).
pub const NODE_NAMESPACE: &str = "athenz-system";
/// The control plane's namespace (`restricted`): the admin domain with dashes, so its Services'
/// names are DNS names ZTS issues (deploy/base/namespace.yaml).
pub const CONTROL_NAMESPACE: &str = "k8s-admin";
/// The workloads `deploy/` runs, each of which must roll out: (namespace, workload).
pub const WORKLOADS: [(&str, &str); 4] = [
    (CONTROL_NAMESPACE, "deployment/athenz-jwt-service"),
    (CONTROL_NAMESPACE, "deployment/athenz-callback"),
    (CONTROL_NAMESPACE, "deployment/athenz-initializer"),
    (NODE_NAMESPACE, "daemonset/athenz-agent"),
];
/// The callback's endpoint as an operator registers it in Athenz (docs/operating.md): its
/// Service, by its in-cluster name, which either ZTS resolves through the cluster's DNS.
pub const PROVIDER_ENDPOINT: &str = "https://athenz-callback.k8s-admin.svc.cluster.local:443";
/// How long each workload may take to roll out (images are local; the control plane's init
/// containers each get a certificate from ZTS first).
const ROLLOUT: Duration = Duration::from_secs(180);
/// The ZTS's process name (in `processes.json` and the logs).
pub const ZTS: &str = "zts";

/// Which of docs/operating.md's install steps `cluster up` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Installer {
    /// "Install": the overlay `deploy/overlays/local`, `kubectl apply -k`.
    Kustomize,
    /// "Install with Helm": the chart `deploy/helm/athenz-k8s-identity`, `helm upgrade --install`.
    Helm,
}

impl Installer {
    /// The page's section whose steps install this way.
    pub fn section(self) -> &'static str {
        match self {
            Self::Kustomize => "Install",
            Self::Helm => "Install with Helm",
        }
    }

    /// The tag of the page's blocks for this installer alone (```` ```sh helm ````).
    pub fn variant(self) -> &'static str {
        match self {
            Self::Kustomize => "kustomize",
            Self::Helm => "helm",
        }
    }

    /// What is installed, relative to the checkout: the overlay or the chart.
    pub fn source(self) -> &'static str {
        match self {
            Self::Kustomize => LOCAL_OVERLAY,
            Self::Helm => "deploy/helm/athenz-k8s-identity",
        }
    }
}

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
    /// Which of docs/operating.md's install steps run.
    pub installer: Installer,
    /// The docs/operating.md whose steps run (another release's, to install it as it was
    /// installed); `None`: the page this binary was built with.
    pub steps_page: Option<PathBuf>,
    /// `deploy/components/<name>` added to the overlay first, as an operator adds one
    /// (`kustomize edit add component`): `legacy-kubelet-authz` on a cluster before 1.33, say.
    /// The chart needs none of them for that: it reads the cluster's version itself.
    pub components: Vec<String>,
    /// Which ZTS issues: the dev ZTS, or Athenz's own (built by harness/peers/athenz/zts/build)
    /// with the cluster's tenants registered as they appear ([`super::tenant_domains`]).
    pub zts: ZtsServer,
}

impl Release {
    /// The given archive and `deploy/`, or this workspace's.
    pub fn new(image_archive: Option<PathBuf>, deploy_dir: Option<PathBuf>) -> Self {
        Self {
            build_if_missing: image_archive.is_none(),
            image_archive: image_archive.unwrap_or_else(super::default_image_archive),
            deploy_dir: deploy_dir.unwrap_or_else(super::default_deploy_dir),
            cert_minutes: None,
            installer: Installer::Kustomize,
            steps_page: None,
            components: Vec::new(),
            zts: ZtsServer::Dev,
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
    let zts = start_zts(layout, &athenz, node_ip, release, processes).await?;
    report(format!(
        "{} at {} (provider endpoint {PROVIDER_ENDPOINT})",
        release.zts.describe(),
        zts.url
    ));

    let image = images::archive_reference(&release.image_archive)?;
    images::import(layout, &release.image_archive)?;
    report(format!("image {image} imported"));

    let checkout = copy_deploy(&athenz, &release.deploy_dir)?;
    add_components(layout, &checkout, release, report)?;
    let keys = operator_keys(&athenz)?;
    let started = std::time::Instant::now();
    let page = match &release.steps_page {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the steps' page {}", path.display()))?,
        None => runbook::OPERATING.to_owned(),
    };
    run_install_steps(
        release.installer,
        &page,
        &kubectl,
        &checkout,
        &zts.url,
        &zts.ca,
        &keys,
    )?;
    for (namespace, workload) in WORKLOADS {
        kubectl.wait_rolled_out(namespace, workload, ROLLOUT)?;
    }
    let overlay = checkout.join(release.installer.source());
    report(format!(
        "docs/operating.md \"{}\" ({}): {} Ready in {:.1} s",
        release.installer.section(),
        overlay.display(),
        WORKLOADS.map(|(_, workload)| workload).join(", "),
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

/// Starts the release's ZTS on the node's address (pods reach it there; the agent on the host
/// network too), knowing the control plane's registered keys and the provider; the keys stay in
/// `athenz/keys` for the overlay's Secrets. The dev ZTS's provider launches any tenant; Athenz's
/// own is told the agents' service and, as they appear, each opted-in namespace's domain and
/// services, as a ZMS administrator registers them.
async fn start_zts(
    layout: &Layout,
    athenz: &Path,
    node_ip: Ipv4Addr,
    release: &Release,
    processes: &mut Vec<Process>,
) -> anyhow::Result<StandaloneInfo> {
    let cert_minutes = release.cert_minutes;
    for dir in ["jwt-keys", "jwt-public", "zts"] {
        let dir = athenz.join(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let (services, _) = generate_keys(athenz)?;
    let mut config = DevZtsConfig {
        listen: SocketAddr::from((node_ip, free_port()?)),
        services,
        providers: vec![ProviderEntry {
            name: PROVIDER.into(),
            endpoint: PROVIDER_ENDPOINT.into(),
            dns_suffixes: vec![DNS_SUFFIX.into()],
            launch: vec!["*".into()],
        }],
        // the control plane's certificates name their Services (`<name>.k8s-admin.svc`): as a
        // real ZTS would be told with `athenz.zts.cert_dns_suffix=.athenz.cloud,.svc`
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
    let mut server_args = Vec::new();
    if release.zts == ZtsServer::Athenz {
        // the agents' node identity: launched by the provider, a service of the admin domain
        config.providers[0].launch = vec![AGENT_PRINCIPAL.to_owned()];
        config.services.push(ServiceEntry {
            name: AGENT_PRINCIPAL.to_owned(),
            public_keys: Default::default(),
        });
        server_args = vec![
            "--server=athenz".to_owned(),
            format!("--tenants-kubectl={}", layout.bin("kubectl").display()),
            format!("--tenants-kubeconfig={}", layout.kubeconfig.display()),
        ];
    }
    let dir = athenz.join("zts");
    json_file::write_atomically(&dir.join("config.json"), &config)?;
    let exe = std::env::current_exe().context("finding athenz-devstack itself")?;
    let mut args = vec![
        "zts".to_owned(),
        format!("--state-dir={}", dir.display()),
        format!("--config={}", dir.join("config.json").display()),
    ];
    if release.zts == ZtsServer::Dev {
        // what a test moves the dev ZTS with (its CA rotation: `zts_next_ca`)
        args.push(format!(
            "--faults-file={}",
            dir.join(ZTS_FAULTS_FILE).display()
        ));
    }
    args.extend(server_args);
    let mut zts = Process::start(Command::new(ZTS, &exe, args), &layout.logs)?;
    zts.wait_file(&dir.join("zts.json")).await?;
    processes.push(zts);
    write_pids(layout, processes)?;
    json_file::read(&dir.join("zts.json")).context("reading the ZTS's zts.json")
}

/// The dev ZTS's faults file in its state directory (`<athenz>/zts/`): a test writes
/// [`athenz_testbed::faults::Faults`] there, e.g. to move it to its next CA.
pub const ZTS_FAULTS_FILE: &str = "faults.json";

/// The overlay the page's steps fill and apply, relative to the checkout.
pub const LOCAL_OVERLAY: &str = "deploy/overlays/local";

/// Copies the directory `from` to `to` (which must not exist yet), as `cp -r` does.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    images::run(
        std::process::Command::new("cp").arg("-r").arg(from).arg(to),
        &format!("copying {} to {}", from.display(), to.display()),
    )?;
    Ok(())
}

/// Where the install keeps its copy of the repository's `deploy/` (the page's steps run there).
pub fn checkout_dir(athenz: &Path) -> PathBuf {
    athenz.join("checkout")
}

/// Where the install keeps the control plane's keys as an operator gets them (`KEYS`).
pub fn operator_keys_dir(athenz: &Path) -> PathBuf {
    athenz.join("operator-keys")
}

/// Copies `deploy/` to `athenz/checkout/deploy`, as an operator's checkout of the repository
/// holds it; returns the checkout (where the page's steps run).
fn copy_deploy(athenz: &Path, deploy_dir: &Path) -> anyhow::Result<PathBuf> {
    let checkout = checkout_dir(athenz);
    if checkout.exists() {
        std::fs::remove_dir_all(&checkout)
            .with_context(|| format!("removing {}", checkout.display()))?;
    }
    std::fs::create_dir_all(&checkout)
        .with_context(|| format!("creating {}", checkout.display()))?;
    copy_tree(deploy_dir, &checkout.join("deploy"))?;
    Ok(checkout)
}

/// Adds `release.components` to the copy's `overlays/local` with the kustomize CLI, as an
/// operator adds a component to their overlay. Only the kustomize install takes components.
fn add_components(
    layout: &Layout,
    checkout: &Path,
    release: &Release,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<()> {
    if release.components.is_empty() {
        return Ok(());
    }
    if release.installer != Installer::Kustomize {
        anyhow::bail!(
            "--component applies to the kustomize install; the chart sets its components with \
             values (components.*), and picks the kubelet authorization from the cluster's version"
        );
    }
    let overlay = checkout.join("deploy/overlays/local");
    for name in &release.components {
        let component = checkout.join("deploy/components").join(name);
        if athenz_core::names::validate_dns_label("component", name).is_err()
            || !component.join("kustomization.yaml").is_file()
        {
            anyhow::bail!(
                "--component {name}: no such component in {}",
                checkout.join("deploy/components").display()
            );
        }
        let output = std::process::Command::new(layout.bin("kustomize"))
            .args(["edit", "add", "component"])
            .arg(format!("../../components/{name}"))
            .current_dir(&overlay)
            .output()
            .context("running kustomize edit add component")?;
        if !output.status.success() {
            anyhow::bail!(
                "kustomize edit add component {name}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        report(format!("component {name} added to the overlay"));
    }
    Ok(())
}

/// The control plane's private keys as the Athenz side hands them to an operator
/// (`KEYS/<service>.key`, 0600), from the keys [`generate_keys`] registered with the dev ZTS.
fn operator_keys(athenz: &Path) -> anyhow::Result<PathBuf> {
    let dir = operator_keys_dir(athenz);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // athenz-initializer's only for a release before this one (the upgrade test installs one
    // first): its initializer served a certificate from ZTS; this release's steps do not read it
    for service in [
        "athenz-jwt-service",
        "athenz-callback",
        "athenz-initializer",
    ] {
        let from = athenz.join("keys").join(service).join("service.key");
        let text = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        athenz_testbed::pki::write_file(&dir.join(format!("{service}.key")), &text, 0o600)?;
    }
    Ok(dir)
}

/// Runs the steps of `installer` in `page` (a docs/operating.md) in `checkout` with this
/// Athenz's `ZTS_URL`, `ATHENZ_CA` and `KEYS`: what an operator runs, so a step that does not
/// work fails here.
pub fn run_install_steps(
    installer: Installer,
    page: &str,
    kubectl: &Kubectl,
    checkout: &Path,
    zts_url: &str,
    zts_ca: &Path,
    keys: &Path,
) -> anyhow::Result<()> {
    let section = installer.section();
    let steps = runbook::shell_blocks(page, section, installer.variant()).join("\n");
    if steps.is_empty() {
        anyhow::bail!("docs/operating.md has no \"{section}\" steps to run");
    }
    kubectl.run_script(
        &steps,
        checkout,
        &[
            ("ZTS_URL", std::ffi::OsStr::new(zts_url)),
            ("ATHENZ_CA", zts_ca.as_os_str()),
            ("KEYS", keys.as_os_str()),
        ],
        &format!("docs/operating.md \"{section}\""),
    )?;
    Ok(())
}

/// An upgrade as docs/operating.md describes it: the new release's `deploy/` (`new_deploy`)
/// under the operator's unchanged overlay (its `generated/` files are kept, the JWT signing key
/// among them), then this binary's page's install steps for `installer`.
pub fn upgrade(
    installer: Installer,
    kubectl: &Kubectl,
    checkout: &Path,
    new_deploy: &Path,
    zts_url: &str,
    zts_ca: &Path,
    keys: &Path,
) -> anyhow::Result<()> {
    let kept = checkout.join("kept-generated");
    let generated = [
        ("overlays/local/generated", "overlay"),
        ("helm/generated", "helm"),
    ];
    for (dir, name) in generated {
        let from = checkout.join("deploy").join(dir);
        if from.is_dir() {
            std::fs::create_dir_all(&kept)
                .with_context(|| format!("creating {}", kept.display()))?;
            std::fs::rename(&from, kept.join(name))
                .with_context(|| format!("keeping {}", from.display()))?;
        }
    }
    let deploy = checkout.join("deploy");
    std::fs::remove_dir_all(&deploy).with_context(|| format!("removing {}", deploy.display()))?;
    copy_tree(new_deploy, &deploy)?;
    for (dir, name) in generated {
        let from = kept.join(name);
        if from.is_dir() {
            let to = deploy.join(dir);
            if to.exists() {
                std::fs::remove_dir_all(&to)
                    .with_context(|| format!("removing {}", to.display()))?;
            }
            std::fs::rename(&from, &to).with_context(|| format!("restoring {}", to.display()))?;
        }
    }
    run_install_steps(
        installer,
        runbook::OPERATING,
        kubectl,
        checkout,
        zts_url,
        zts_ca,
        keys,
    )
}

/// Runs docs/operating.md's "Uninstall" steps for `installer` in `checkout`: the cluster's
/// objects from here, then the section's last block (what the agents leave on a node) as root
/// on every one of `nodes`, inside a further node's namespaces as its own root would run it.
pub fn run_uninstall_steps(
    installer: Installer,
    kubectl: &Kubectl,
    checkout: &Path,
    nodes: &[NodeInfo],
) -> anyhow::Result<()> {
    let mut steps = runbook::shell_blocks(runbook::OPERATING, "Uninstall", installer.variant());
    let node_steps = steps
        .pop()
        .context("docs/operating.md has no \"Uninstall\" steps to run")?;
    if !node_steps.contains(super::nodes::AGENT_HOST_DIR) {
        anyhow::bail!(
            "docs/operating.md's last \"Uninstall\" block is not the node's files: {node_steps}"
        );
    }
    kubectl.run_script(
        &steps.join("\n"),
        checkout,
        &[],
        "docs/operating.md \"Uninstall\"",
    )?;
    for node in nodes {
        let mut command = node.command("bash");
        command.args(["-euo", "pipefail", "-c", &node_steps]);
        images::run(
            &mut command,
            &format!("docs/operating.md \"Uninstall\" on node {}", node.name),
        )?;
    }
    Ok(())
}
