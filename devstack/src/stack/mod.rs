//! The whole system on one machine: the dev ZTS, the Kubernetes stand-ins, and the real
//! jwt-service, callback, initializer and node agent, each a process with the arguments it has in
//! a cluster, their certificates obtained from ZTS with `athenz-control-sia` (and kept fresh by its
//! refresh sidecars). [`StackInfo`] is the `stack.json` contract of DESIGN.md 5.

use crate::kube::KubeInfo;
use crate::multicall;
use crate::procs::{Command, Process, Usage, free_port};
use anyhow::{Context, bail};
use athenz_core::agent_api::KeySource;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_core::peer::PeerCheck;
use athenz_testbed::fixtures::{
    ADMIN_DOMAIN, AGENT_NAMESPACE, AGENT_PRINCIPAL, AGENT_SERVICE_ACCOUNT, DNS_SUFFIX,
    NODE_TOKEN_AUDIENCE, PROVIDER,
};
use athenz_testbed::zts::DevZtsConfig;
use athenz_testbed::zts::registry::{ProviderEntry, ServiceEntry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod control;
mod info;
pub mod replicas;
mod runtime;
pub use info::{
    AgentInfo, CallbackInfo, Credential, Credentials, NodeAgentInfo, NodeAttestation, NodeInfo,
    RuntimeInfo, StackInfo, Url, UrlCa,
};
use runtime::{choose_runtime, remove_containers};

/// The node the stack's agent serves.
pub const NODE_NAME: &str = "node-1";
/// Where the callback serves the provider routes (ZTS appends `/instance` or `/refresh`).
pub const CALLBACK_BASE_PATH: &str = "/athenz/provider";
/// The control-plane services, their Athenz service names under the admin domain.
const JWT_SERVICE: &str = "athenz-jwt-service";
const CALLBACK: &str = "athenz-callback";
const INITIALIZER: &str = "athenz-initializer";
/// A principal allowed nowhere, for tests of refusals.
const STRANGER: &str = "stranger";
/// The injection template the initializer serves: the one deploy/ ships.
const DEPLOY_TEMPLATE: &str = include_str!("../../../deploy/base/initializer-template.yaml");

/// Writes `value` as JSON to `path` atomically (readers never see half), mode 0644 — the shared
/// writer of athenz-core.
pub fn write_json_atomically<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    athenz_core::volume::write_json_file(path, value, 0o644)
        .with_context(|| format!("writing {}", path.display()))
}

/// The roles the dev ZTS knows (DESIGN.md 4.11): every service of `media.sports` reads it, only
/// `media.sports.api` writes it; what the demo and scripts use to show authorization.
pub fn demo_roles() -> Vec<athenz_testbed::zts::authz::RoleEntry> {
    let role = |role: &str, members: &[&str]| athenz_testbed::zts::authz::RoleEntry {
        domain: "media.sports".into(),
        role: role.into(),
        members: members.iter().map(|m| (*m).to_owned()).collect(),
    };
    vec![
        role("readers", &["media.sports.*"]),
        role("writers", &["media.sports.api"]),
    ]
}

/// The faults file under the state dir, when the stack runs with fault injection.
pub const FAULTS_FILE: &str = "faults.json";

/// Choices for a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where everything lives (created if missing).
    pub state_dir: PathBuf,
    /// The agent's `--key-algorithm`: p256 or rsa2048.
    pub key_algorithm: String,
    /// The agents' and SIAs' `--key-source`.
    pub key_source: KeySource,
    /// Run the components from their own binaries in this directory instead of this one.
    pub components: Option<PathBuf>,
    /// How pods' processes are started; default: runc where it is installed and this is
    /// root, else plain processes.
    pub runtime: Option<athenz_testbed::runtime::RuntimeKind>,
    /// How many nodes (each its own kubelet, agent and node identity); at least 1.
    pub nodes: usize,
    /// The agents' `--peer-check`; default `enforce` where pod cgroups can be made, else `off`.
    pub peer_check: Option<PeerCheck>,
    /// Which volume pods get; with either CSI kind every agent also serves CSI.
    pub volume: VolumeKind,
    /// The agents' `--csi-refresh-interval` (files-mode rotation); their default when none.
    pub csi_refresh_interval: Option<std::time::Duration>,
    /// The callback's `--cert-expiry-minutes`: the lifetime ZTS gives pod and node certificates
    /// (its default, a day, when none; `soak` and `chaos` shorten it to see many refreshes).
    pub cert_expiry_minutes: Option<u32>,
    /// ZTS and the Kubernetes stand-ins follow `<state>/faults.json` (`chaos` injects its faults
    /// through it, [`athenz_testbed::faults`]).
    pub fault_injection: bool,
    /// Replicas of the jwt-service and of the callback, each Deployment behind one Service
    /// address when more than one ([`replicas`]).
    pub control_plane_replicas: usize,
}

/// The volume the demo and bench give their pods (DESIGN.md 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeKind {
    /// The flex driver and the in-pod SIA.
    #[default]
    Flex,
    /// The CSI driver's socket mode and the in-pod SIA.
    CsiSocket,
    /// The CSI driver's files mode: no process in the pod.
    CsiFiles,
}

impl VolumeKind {
    /// Whether the agents serve CSI.
    pub fn is_csi(self) -> bool {
        self != Self::Flex
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::CsiSocket => "csi-socket",
            Self::CsiFiles => "csi-files",
        }
    }
}

impl StackOptions {
    /// One node, the peer check as the host allows.
    pub fn new(state_dir: PathBuf, key_algorithm: &str) -> Self {
        Self {
            state_dir,
            key_algorithm: key_algorithm.to_owned(),
            key_source: KeySource::Pod,
            components: None,
            runtime: None,
            nodes: 1,
            peer_check: None,
            volume: VolumeKind::Flex,
            csi_refresh_interval: None,
            cert_expiry_minutes: None,
            fault_injection: false,
            control_plane_replicas: 1,
        }
    }
}

/// The name of node `i` (0-based): `node-1`, `node-2`, …
pub fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

/// A running stack.
pub struct Stack {
    /// What stack.json says.
    pub info: StackInfo,
    /// The state dir.
    pub state_dir: PathBuf,
    processes: Vec<Process>,
    /// Deployments of more than one replica, behind their Services.
    deployments: Vec<replicas::Deployment>,
}

/// Node `i`'s directories: the first node keeps the single-node layout (`<state>/agent`,
/// `<state>/volumes`); the others live under `<state>/nodes/<name>/`.
fn node_dirs(state: &Path, i: usize) -> (PathBuf, PathBuf, PathBuf) {
    let name = node_name(i);
    let base = state.join("nodes").join(&name);
    if i == 0 {
        (
            state.join("agent"),
            state.join("volumes"),
            base.join("identity"),
        )
    } else {
        (
            base.join("agent"),
            base.join("volumes"),
            base.join("identity"),
        )
    }
}

/// Paths of one control-plane service's key and credentials.
struct ServiceFiles {
    key_dir: PathBuf,
    out_dir: PathBuf,
}

impl ServiceFiles {
    fn key(&self) -> PathBuf {
        self.key_dir.join("service.key")
    }
    fn cert(&self) -> PathBuf {
        self.out_dir.join("service.cert.pem")
    }
}

fn path_arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
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

/// The initializer's template from deploy/'s ConfigMap (the `template.yaml` key).
fn deploy_template() -> anyhow::Result<String> {
    let config_map: k8s_openapi::api::core::v1::ConfigMap =
        serde_saphyr::from_str(DEPLOY_TEMPLATE).context("parsing deploy's template ConfigMap")?;
    config_map
        .data
        .and_then(|mut d| d.remove("template.yaml"))
        .context("deploy's template ConfigMap has no template.yaml")
}

impl Stack {
    /// Starts everything and writes `stack.json` once every part is ready.
    pub async fn start(options: &StackOptions) -> anyhow::Result<Self> {
        athenz_core::install_crypto_provider();
        let state = &options.state_dir;
        std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
        let state = std::fs::canonicalize(state).context("resolving the state dir")?;
        let stack_json = state.join("stack.json");
        let _ = std::fs::remove_file(&stack_json);
        let node_count = options.nodes.max(1);
        let pod_cgroup_root = athenz_testbed::cgroups::create_root();
        let runtime = choose_runtime(options.runtime, pod_cgroup_root.as_deref(), &state)?;
        let peer_check = options.peer_check.unwrap_or(if pod_cgroup_root.is_some() {
            PeerCheck::Enforce
        } else {
            PeerCheck::Off
        });
        let logs = state.join("logs");
        for dir in [
            "logs",
            "nodes",
            "zts",
            "kube",
            "volumes",
            "agent",
            "jwt-keys",
            "jwt-public",
        ] {
            std::fs::create_dir_all(state.join(dir))
                .with_context(|| format!("creating {}/{dir}", state.display()))?;
        }
        let bin = multicall::install_bin_dir(&state.join("bin"), options.components.as_deref())?;
        let exe = bin.join("athenz-devstack");
        let mut processes = Vec::new();

        // Keys: one per control-plane service (registered in ZTS), and the JWT signing key.
        let (services, files) = generate_keys(&state)?;

        // Ports the stack's servers will bind.
        let zts_port = free_port()?;
        let callback_port = free_port()?;
        let [jwt_port, jwt_ops, callback_ops, init_port, init_ops] = [
            free_port()?,
            free_port()?,
            free_port()?,
            free_port()?,
            free_port()?,
        ];
        let callback_url = format!("https://127.0.0.1:{callback_port}");

        // Dev ZTS, knowing the services' keys and the provider.
        let zts_config = DevZtsConfig {
            listen: ([127, 0, 0, 1], zts_port).into(),
            services,
            providers: vec![ProviderEntry {
                name: PROVIDER.into(),
                endpoint: format!("{callback_url}{CALLBACK_BASE_PATH}"),
                dns_suffixes: vec![DNS_SUFFIX.into()],
                launch: vec!["*".into()],
            }],
            service_dns_suffixes: vec![DNS_SUFFIX.into()],
            roles: demo_roles(),
            ..DevZtsConfig::default()
        };
        let zts_dir = state.join("zts");
        write_json_atomically(&zts_dir.join("config.json"), &zts_config)?;
        let _ = std::fs::remove_file(zts_dir.join("zts.json"));
        let faults_file = state.join(FAULTS_FILE);
        let _ = std::fs::remove_file(&faults_file);
        let faults_arg = options
            .fault_injection
            .then(|| path_arg("faults-file", &faults_file));
        let mut zts_args = vec![
            "zts".into(),
            path_arg("state-dir", &zts_dir),
            path_arg("config", &zts_dir.join("config.json")),
        ];
        zts_args.extend(faults_arg.clone());
        let mut zts = Process::start(Command::new("zts", &exe, zts_args), &logs)?;
        zts.wait_file(&zts_dir.join("zts.json")).await?;
        processes.push(zts);
        let zts_info: athenz_testbed::zts::StandaloneInfo =
            read_json(&zts_dir.join("zts.json")).context("reading zts.json")?;
        let ca = zts_info.ca.clone();

        // Kubernetes API and kubelet stand-ins.
        let kube_dir = state.join("kube");
        let _ = std::fs::remove_file(kube_dir.join("kube.json"));
        let mut kube_args = vec!["kube-standins".to_owned(), path_arg("state-dir", &kube_dir)];
        kube_args.extend((0..node_count).map(|i| format!("--node={}", node_name(i))));
        kube_args.extend(faults_arg);
        let mut kube = Process::start(Command::new("kube", &exe, kube_args), &logs)?;
        kube.wait_file(&kube_dir.join("kube.json")).await?;
        processes.push(kube);
        let kube_info: KubeInfo = read_json(&kube_dir.join("kube.json"))?;

        // Every control-plane certificate from ZTS, as the control-sia init containers do, and
        // their refresh sidecars.
        let sidecars = control_plane_certificates(
            &bin.join("athenz-control-sia"),
            &files,
            &zts_info.url,
            &ca,
            &logs,
        )
        .await?;
        processes.extend(sidecars);

        let tls_args = |port: u16, ops: u16, f: &ServiceFiles| {
            vec![
                format!("--listen=127.0.0.1:{port}"),
                format!("--ops-listen=127.0.0.1:{ops}"),
                path_arg("tls-cert", &f.cert()),
                path_arg("tls-key", &f.key()),
            ]
        };
        let identity_args = [
            format!("--provider={PROVIDER}"),
            format!("--dns-suffix={DNS_SUFFIX}"),
            format!("--admin-domain={ADMIN_DOMAIN}"),
        ];

        // jwt-service: only node agents may ask, each for its own node.
        let mut deployments = Vec::new();
        let jwt_args = |port, ops| {
            let mut args = tls_args(port, ops, &files[JWT_SERVICE]);
            args.extend([
                path_arg("client-ca", &ca),
                format!("--allowed-principals={AGENT_PRINCIPAL}"),
                path_arg("keys-dir", &state.join("jwt-keys")),
                format!("--provider={PROVIDER}"),
            ]);
            args
        };
        let jwt = replicas::ReplicaSet {
            deployment: "jwt-service",
            binary: "athenz-jwt-service",
            count: options.control_plane_replicas,
            service_port: jwt_port,
            ops_port: jwt_ops,
        };
        deployments.extend(jwt.start(&bin, &logs, &mut processes, jwt_args).await?);

        // callback: only ZTS may ask.
        let callback_args = |port, ops| {
            let mut args = tls_args(port, ops, &files[CALLBACK]);
            args.extend([
                path_arg("client-ca", &ca),
                "--allowed-principals=sys.auth.zts".into(),
                format!("--base-path={CALLBACK_BASE_PATH}"),
                path_arg("public-keys-dir", &state.join("jwt-public")),
                "--keys-reload-interval=1s".into(),
                format!("--kube-api-url={}", kube_info.api),
            ]);
            if let Some(minutes) = options.cert_expiry_minutes {
                args.push(format!("--cert-expiry-minutes={minutes}"));
            }
            args.extend(identity_args.iter().cloned());
            args
        };
        let callback = replicas::ReplicaSet {
            deployment: "callback",
            binary: "athenz-callback",
            count: options.control_plane_replicas,
            service_port: callback_port,
            ops_port: callback_ops,
        };
        deployments.extend(
            callback
                .start(&bin, &logs, &mut processes, callback_args)
                .await?,
        );

        // initializer, with deploy/'s template.
        let template = state.join("initializer-template.yaml");
        std::fs::write(&template, deploy_template()?)
            .with_context(|| format!("writing {}", template.display()))?;
        let mut args = tls_args(init_port, init_ops, &files[INITIALIZER]);
        args.push(path_arg("template", &template));
        processes.push(
            run_daemon(
                &bin,
                "initializer",
                "athenz-initializer",
                args,
                init_ops,
                &logs,
            )
            .await?,
        );

        // One agent per node, each attested by its own pod's token (no shared key).
        let credential = |cert: PathBuf, key: PathBuf| Credential {
            cert,
            key,
            ca: ca.clone(),
        };
        let mut nodes = Vec::new();
        for (i, kube_node) in kube_info.nodes.iter().enumerate() {
            let (agent_dir, volumes_dir, identity_dir) = node_dirs(&state, i);
            let agent_ops = free_port()?;
            let mut args = vec![
                path_arg("agent-dir", &agent_dir),
                path_arg("volumes-dir", &volumes_dir),
                format!("--kubelet-url={}", kube_node.kubelet),
                format!("--jwt-service-url=https://127.0.0.1:{jwt_port}"),
                format!("--node-name={}", kube_node.name),
                path_arg("node-token-file", &kube_node.token_file),
                path_arg("node-identity-dir", &identity_dir),
                format!("--peer-check={peer_check}"),
                path_arg("jwt-service-ca", &ca),
                format!("--zts-url={}", zts_info.url),
                path_arg("zts-ca", &ca),
                format!("--key-algorithm={}", options.key_algorithm),
                format!("--key-source={}", options.key_source),
                format!("--ops-listen=127.0.0.1:{agent_ops}"),
                "--upstream-timeout=5s".into(),
            ];
            args.extend(identity_args.iter().cloned());
            // kubelet's plugin dir for the node: <node dir>/plugins/csi.athenz.io/csi.sock
            let csi_socket = options.volume.is_csi().then(|| {
                agent_dir
                    .parent()
                    .unwrap_or(&state)
                    .join(format!("plugins-{}", kube_node.name))
                    .join("csi.athenz.io")
                    .join("csi.sock")
            });
            if let Some(socket) = &csi_socket {
                args.push(path_arg("csi-socket", socket));
                if let Some(interval) = options.csi_refresh_interval {
                    args.push(format!("--csi-refresh-interval={}ms", interval.as_millis()));
                }
            }
            let process_name = if i == 0 {
                "agent".to_owned()
            } else {
                format!("agent-{}", kube_node.name)
            };
            processes.push(
                run_daemon(
                    &bin,
                    &process_name,
                    "athenz-identity-agent",
                    args,
                    agent_ops,
                    &logs,
                )
                .await?,
            );
            nodes.push(NodeInfo {
                name: kube_node.name.clone(),
                kubelet: Url {
                    url: kube_node.kubelet.clone(),
                },
                agent: NodeAgentInfo {
                    socket: agent_dir.join(athenz_core::volume::AGENT_SOCKET_NAME),
                    metrics_url: format!("http://127.0.0.1:{agent_ops}/metrics"),
                    csi_socket,
                    pod: kube_node.agent_pod.clone(),
                },
                volumes_dir,
                agent_dir,
                credentials: credential(
                    identity_dir.join("node.cert.pem"),
                    identity_dir.join("node.key.pem"),
                ),
            });
        }
        let first = nodes.first().context("no node")?.clone();
        let info = StackInfo {
            zts: UrlCa {
                url: zts_info.url.clone(),
                ca: ca.clone(),
            },
            kube_api: Url { url: kube_info.api },
            kubelet: first.kubelet.clone(),
            jwt_service: Url {
                url: format!("https://127.0.0.1:{jwt_port}"),
            },
            callback: CallbackInfo {
                url: callback_url,
                base_path: CALLBACK_BASE_PATH.into(),
            },
            initializer: Url {
                url: format!("https://127.0.0.1:{init_port}"),
            },
            agent: AgentInfo {
                socket: first.agent.socket.clone(),
                metrics_url: first.agent.metrics_url.clone(),
            },
            volumes_dir: first.volumes_dir.clone(),
            agent_dir: first.agent_dir.clone(),
            node_name: first.name.clone(),
            volume_driver: vec![bin.join("athenz-volume-driver").display().to_string()],
            // the prefix runs a SIA that works with this stack's agents: their key source
            sia: vec![
                bin.join("athenz-sia").display().to_string(),
                format!("--key-source={}", options.key_source),
            ],
            provider: PROVIDER.into(),
            dns_suffix: DNS_SUFFIX.into(),
            admin_domain: ADMIN_DOMAIN.into(),
            jwt_public_keys_dir: state.join("jwt-public"),
            credentials: Credentials {
                zts: credential(zts_dir.join("zts.cert.pem"), zts_dir.join("zts.key.pem")),
                node: first.credentials.clone(),
                stranger: credential(files[STRANGER].cert(), files[STRANGER].key()),
            },
            nodes,
            node_attestation: NodeAttestation {
                audience: NODE_TOKEN_AUDIENCE.into(),
                namespace: AGENT_NAMESPACE.into(),
                service_account: AGENT_SERVICE_ACCOUNT.into(),
                principal: AGENT_PRINCIPAL.into(),
            },
            peer_check,
            key_source: options.key_source,
            key_algorithm: options.key_algorithm.clone(),
            runtime,
            pod_cgroup_root,
            processes: BTreeMap::new(),
        };
        let mut stack = Self {
            info,
            state_dir: state.clone(),
            processes,
            deployments,
        };
        stack.write_stack_json()?;
        Ok(stack)
    }

    /// Writes stack.json with the current process ids.
    pub fn write_stack_json(&mut self) -> anyhow::Result<()> {
        self.info.processes = self
            .processes
            .iter()
            .map(|p| (p.command.name.clone(), p.pid()))
            .collect();
        write_json_atomically(&self.state_dir.join("stack.json"), &self.info)
    }

    /// Fails, naming it with its log's tail, if any component has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        self.processes.iter_mut().try_for_each(Process::check_alive)
    }

    /// Restarts any component that has exited (as kubelet restarts a crashed container); returns
    /// the names restarted.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<String>> {
        let mut restarted = Vec::new();
        for process in &mut self.processes {
            if process.restart_if_exited()? {
                restarted.push(process.command.name.clone());
            }
        }
        if !restarted.is_empty() {
            self.write_stack_json()?;
        }
        Ok(restarted)
    }

    /// Each long-running process's CPU and memory now.
    pub fn usage(&self) -> Vec<(String, Usage)> {
        self.processes
            .iter()
            .map(|p| (p.command.name.clone(), p.usage()))
            .collect()
    }

    /// Stops every process, the last started first, and removes the pod cgroups.
    pub async fn stop(mut self) {
        let _ = std::fs::remove_file(self.state_dir.join("stack.json"));
        while let Some(mut p) = self.processes.pop() {
            p.stop().await;
        }
        remove_containers(&self.info.runtime).await;
        crate::pods::PodRuntime::forget(&self.info);
        if let Some(root) = &self.info.pod_cgroup_root {
            athenz_testbed::cgroups::remove_tree(root);
        }
    }
}

/// Generates every control-plane service's key (the ZTS registrations returned) and the JWT
/// signing key (`jwt-keys/v1.pem`, its public half in `jwt-public/v1.pem`).
fn generate_keys(
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
async fn control_plane_certificates(
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

/// Starts a daemon component from `bin` and waits for its `/readyz`.
pub(super) async fn run_daemon(
    bin: &Path,
    name: &str,
    binary: &str,
    args: Vec<String>,
    ops_port: u16,
    logs: &Path,
) -> anyhow::Result<Process> {
    let mut process = Process::start(Command::new(name, &bin.join(binary), args), logs)?;
    process
        .wait_http_ok(&format!("http://127.0.0.1:{ops_port}/readyz"))
        .await?;
    Ok(process)
}

/// Reads a JSON file into `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}
