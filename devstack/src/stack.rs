//! The whole system on one machine: the dev ZTS, the Kubernetes stand-ins, and the real
//! jwt-service, callback, initializer and node agent, each a process with the arguments it has in
//! a cluster, their certificates obtained from ZTS with `athenz-control-sia` (and kept fresh by its
//! refresh sidecars). [`StackInfo`] is the `stack.json` contract of DESIGN.md 5.

use crate::kube::KubeInfo;
use crate::multicall;
use crate::procs::{Command, Process, Usage, free_port};
use anyhow::{Context, bail};
use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_testbed::fixtures::{ADMIN_DOMAIN, DNS_SUFFIX, PROVIDER};
use athenz_testbed::zts::DevZtsConfig;
use athenz_testbed::zts::registry::{ProviderEntry, ServiceEntry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The node the stack's agent serves.
pub const NODE_NAME: &str = "node-1";
/// Where the callback serves the provider routes (ZTS appends `/instance` or `/refresh`).
pub const CALLBACK_BASE_PATH: &str = "/athenz/provider";
/// The control-plane services, their Athenz service names under the admin domain.
const JWT_SERVICE: &str = "athenz-jwt-service";
const CALLBACK: &str = "athenz-callback";
const INITIALIZER: &str = "athenz-initializer";
/// The node agents' service (one key for the DaemonSet, as deploy/ does).
const AGENT: &str = "athenz-agent";
/// A principal allowed nowhere, for tests of refusals.
const STRANGER: &str = "stranger";
/// The injection template the initializer serves: the one deploy/ ships.
const DEPLOY_TEMPLATE: &str = include_str!("../../deploy/base/initializer-template.yaml");

/// `{url, ca}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UrlCa {
    /// Base URL.
    pub url: String,
    /// CA bundle that verifies it.
    pub ca: PathBuf,
}

/// `{url}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Url {
    /// Base URL.
    pub url: String,
}

/// The callback: URL without a path, and the path of its routes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallbackInfo {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Starts with `/`.
    pub base_path: String,
}

/// The agent: its socket and metrics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentInfo {
    /// `<agent_dir>/agent.sock`.
    pub socket: PathBuf,
    /// Full `/metrics` URL.
    pub metrics_url: String,
}

/// A certificate, its key and the CA bundle that verifies the stack's servers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credential {
    /// Leaf + chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA bundle.
    pub ca: PathBuf,
}

/// The three principals tests need.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credentials {
    /// `sys.auth.zts`: what the callback accepts.
    pub zts: Credential,
    /// The node agents' principal: what the jwt-service accepts.
    pub node: Credential,
    /// A principal allowed nowhere.
    pub stranger: Credential,
}

/// `<state-dir>/stack.json` (DESIGN.md 5).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackInfo {
    /// Dev ZTS; `url` ends in `/zts/v1`.
    pub zts: UrlCa,
    /// Kubernetes API stand-in (plain http on loopback).
    pub kube_api: Url,
    /// Kubelet stand-in (plain http on loopback).
    pub kubelet: Url,
    /// jwt-service.
    pub jwt_service: Url,
    /// Provider callback.
    pub callback: CallbackInfo,
    /// Admission webhook (`POST <url>/mutate`).
    pub initializer: Url,
    /// Node agent.
    pub agent: AgentInfo,
    /// The agent's and driver's volumes dir.
    pub volumes_dir: PathBuf,
    /// The agent's socket dir.
    pub agent_dir: PathBuf,
    /// The node.
    pub node_name: String,
    /// argv prefix running the real driver (reads ATHENZ_VOLUMES_DIR / ATHENZ_AGENT_DIR).
    pub volume_driver: Vec<String>,
    /// argv prefix running the real pod SIA.
    pub sia: Vec<String>,
    /// Provider name.
    pub provider: String,
    /// DNS suffix, no leading dot.
    pub dns_suffix: String,
    /// Admin domain.
    pub admin_domain: String,
    /// Where the callback reads the JWT public keys (v<N>.pem).
    pub jwt_public_keys_dir: PathBuf,
    /// Client credentials.
    pub credentials: Credentials,
    /// Process ids by component (they change when a component is restarted).
    pub processes: BTreeMap<String, u32>,
}

/// Writes `value` as JSON to `path` atomically (readers never see half), mode 0644 — the shared
/// writer of athenz-core.
pub fn write_json_atomically<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    athenz_core::volume::write_json_file(path, value, 0o644)
        .with_context(|| format!("writing {}", path.display()))
}

/// Choices for a stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where everything lives (created if missing).
    pub state_dir: PathBuf,
    /// The agent's `--key-algorithm`: p256 or rsa2048.
    pub key_algorithm: String,
    /// Run the components from their own binaries in this directory instead of this one.
    pub components: Option<PathBuf>,
}

/// A running stack.
pub struct Stack {
    /// What stack.json says.
    pub info: StackInfo,
    /// The state dir.
    pub state_dir: PathBuf,
    processes: Vec<Process>,
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
        let logs = state.join("logs");
        for dir in [
            "logs",
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
        let [
            jwt_port,
            jwt_ops,
            callback_ops,
            init_port,
            init_ops,
            agent_ops,
        ] = [
            free_port()?,
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
            ..DevZtsConfig::default()
        };
        let zts_dir = state.join("zts");
        write_json_atomically(&zts_dir.join("config.json"), &zts_config)?;
        let _ = std::fs::remove_file(zts_dir.join("zts.json"));
        let mut zts = Process::start(
            Command::new(
                "zts",
                &exe,
                vec![
                    "zts".into(),
                    path_arg("state-dir", &zts_dir),
                    path_arg("config", &zts_dir.join("config.json")),
                ],
            ),
            &logs,
        )?;
        zts.wait_file(&zts_dir.join("zts.json")).await?;
        processes.push(zts);
        let zts_info: athenz_testbed::zts::StandaloneInfo =
            read_json(&zts_dir.join("zts.json")).context("reading zts.json")?;
        let ca = zts_info.ca.clone();

        // Kubernetes API and kubelet stand-ins.
        let kube_dir = state.join("kube");
        let _ = std::fs::remove_file(kube_dir.join("kube.json"));
        let mut kube = Process::start(
            Command::new(
                "kube",
                &exe,
                vec![
                    "kube-standins".into(),
                    path_arg("state-dir", &kube_dir),
                    format!("--node={NODE_NAME}"),
                ],
            ),
            &logs,
        )?;
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

        // jwt-service: only node agents may ask.
        let mut args = tls_args(jwt_port, jwt_ops, &files[JWT_SERVICE]);
        args.extend([
            path_arg("client-ca", &ca),
            format!("--allowed-principals={ADMIN_DOMAIN}.{AGENT}"),
            path_arg("keys-dir", &state.join("jwt-keys")),
        ]);
        processes.push(
            run_daemon(
                &bin,
                "jwt-service",
                "athenz-jwt-service",
                args,
                jwt_ops,
                &logs,
            )
            .await?,
        );

        // callback: only ZTS may ask.
        let mut args = tls_args(callback_port, callback_ops, &files[CALLBACK]);
        args.extend([
            path_arg("client-ca", &ca),
            "--allowed-principals=sys.auth.zts".into(),
            format!("--base-path={CALLBACK_BASE_PATH}"),
            path_arg("public-keys-dir", &state.join("jwt-public")),
            "--keys-reload-interval=1s".into(),
            format!("--kube-api-url={}", kube_info.api),
        ]);
        args.extend(identity_args.iter().cloned());
        processes.push(
            run_daemon(
                &bin,
                "callback",
                "athenz-callback",
                args,
                callback_ops,
                &logs,
            )
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

        // The node agent.
        let agent_dir = state.join("agent");
        let volumes_dir = state.join("volumes");
        let mut args = vec![
            path_arg("agent-dir", &agent_dir),
            path_arg("volumes-dir", &volumes_dir),
            format!("--kubelet-url={}", kube_info.kubelet),
            format!("--jwt-service-url=https://127.0.0.1:{jwt_port}"),
            path_arg("node-cert", &files[AGENT].cert()),
            path_arg("node-key", &files[AGENT].key()),
            path_arg("jwt-service-ca", &ca),
            format!("--zts-url={}", zts_info.url),
            path_arg("zts-ca", &ca),
            format!("--key-algorithm={}", options.key_algorithm),
            format!("--ops-listen=127.0.0.1:{agent_ops}"),
            "--upstream-timeout=5s".into(),
        ];
        args.extend(identity_args.iter().cloned());
        processes.push(
            run_daemon(
                &bin,
                "agent",
                "athenz-identity-agent",
                args,
                agent_ops,
                &logs,
            )
            .await?,
        );

        let credential = |cert: PathBuf, key: PathBuf| Credential {
            cert,
            key,
            ca: ca.clone(),
        };
        let info = StackInfo {
            zts: UrlCa {
                url: zts_info.url.clone(),
                ca: ca.clone(),
            },
            kube_api: Url { url: kube_info.api },
            kubelet: Url {
                url: kube_info.kubelet,
            },
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
                socket: agent_dir.join(athenz_core::volume::AGENT_SOCKET_NAME),
                metrics_url: format!("http://127.0.0.1:{agent_ops}/metrics"),
            },
            volumes_dir,
            agent_dir,
            node_name: NODE_NAME.into(),
            volume_driver: vec![bin.join("athenz-volume-driver").display().to_string()],
            sia: vec![bin.join("athenz-sia").display().to_string()],
            provider: PROVIDER.into(),
            dns_suffix: DNS_SUFFIX.into(),
            admin_domain: ADMIN_DOMAIN.into(),
            jwt_public_keys_dir: state.join("jwt-public"),
            credentials: Credentials {
                zts: credential(zts_dir.join("zts.cert.pem"), zts_dir.join("zts.key.pem")),
                node: credential(files[AGENT].cert(), files[AGENT].key()),
                stranger: credential(files[STRANGER].cert(), files[STRANGER].key()),
            },
            processes: BTreeMap::new(),
        };
        let mut stack = Self {
            info,
            state_dir: state.clone(),
            processes,
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

    /// Stops every process, the last started first.
    pub async fn stop(mut self) {
        let _ = std::fs::remove_file(self.state_dir.join("stack.json"));
        while let Some(mut p) = self.processes.pop() {
            p.stop().await;
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
    for service in [JWT_SERVICE, CALLBACK, INITIALIZER, AGENT, STRANGER] {
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
async fn run_daemon(
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
