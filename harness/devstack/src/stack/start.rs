//! Starting a stack, one phase at a time, in the order the parts depend on each other: the state
//! dir and the binaries, the keys, the dev ZTS, the Kubernetes stand-ins, the control plane
//! (certificates from ZTS through athenz-control-sia, jwt-service, callback, initializer), one
//! agent per node, and last what `stack.json` says. Each phase is a method of [`Start`], which
//! holds what they share; the processes started so far stay with it, so a failed phase drops
//! (and stops) them all.

use super::keys::{ServiceFiles, control_plane_certificates, generate_keys};
use super::launch::{path_arg, run_daemon};
use super::{
    ADMIN_DOMAIN, AGENT_NAMESPACE, AGENT_PRINCIPAL, AGENT_SERVICE_ACCOUNT, AgentInfo, CALLBACK,
    CALLBACK_BASE_PATH, CallbackInfo, Credential, Credentials, DEPLOY_TEMPLATE, DNS_SUFFIX,
    FAULTS_FILE, INITIALIZER, JWT_SERVICE, NODE_TOKEN_AUDIENCE, NodeAgentInfo, NodeAttestation,
    NodeInfo, PROVIDER, STRANGER, Stack, StackInfo, StackOptions, TENANT_DOMAINS, TENANT_SERVICES,
    Url, UrlCa, ZtsServer, choose_runtime, demo_roles, node_name, replicas,
};
use crate::kube::{KubeInfo, KubeNode};
use crate::multicall;
use crate::procs::{Command, Process, free_port};
use anyhow::Context;
use athenz_core::peer::PeerCheck;
use athenz_core::volume_mode::VolumeMode;
use athenz_testbed::zts::registry::{ProviderEntry, ServiceEntry};
use athenz_testbed::zts::{DevZtsConfig, StandaloneInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

impl Stack {
    /// Starts everything and writes `stack.json` once every part is ready.
    pub async fn start(options: &StackOptions) -> anyhow::Result<Self> {
        athenz_core::install_crypto_provider();
        let mut start = Start::prepare(options)?;
        let pod_cgroup_root = athenz_testbed::cgroups::create_root();
        let runtime = choose_runtime(options.runtime, pod_cgroup_root.as_deref(), &start.state)?;
        let peer_check = options.peer_check.unwrap_or(if pod_cgroup_root.is_some() {
            PeerCheck::Enforce
        } else {
            PeerCheck::Off
        });
        // one key per control-plane service (registered in ZTS), and the JWT signing key
        let (services, files) = generate_keys(&start.state)?;
        let ports = Ports::choose()?;
        let zts = start.dev_zts(services, &ports).await?;
        let kube = start.kube_standins().await?;
        let deployments = start.control_plane(&files, &zts, &kube, &ports).await?;
        let nodes = start.agents(&kube, &zts, &ports, peer_check).await?;
        let first = nodes.first().context("no node")?.clone();
        let bin = &start.bin;
        let zts_dir = start.state.join("zts");
        let credential = |cert: PathBuf, key: PathBuf| Credential {
            cert,
            key,
            ca: zts.ca.clone(),
        };
        let info = StackInfo {
            zts: UrlCa {
                url: zts.url.clone(),
                ca: zts.ca.clone(),
            },
            kube_api: Url { url: kube.api },
            kubelet: first.kubelet.clone(),
            jwt_service: Url {
                url: format!("https://127.0.0.1:{}", ports.jwt),
            },
            callback: CallbackInfo {
                url: ports.callback_url(),
                base_path: CALLBACK_BASE_PATH.into(),
            },
            initializer: Url {
                url: format!("https://127.0.0.1:{}", ports.initializer),
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
            jwt_public_keys_dir: start.state.join("jwt-public"),
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
            state_dir: start.state,
            processes: start.processes,
            deployments,
        };
        stack.write_stack_json()?;
        Ok(stack)
    }
}

/// The ports the stack's servers bind, chosen before anything starts: the dev ZTS must know the
/// callback's, the agents the jwt-service's.
struct Ports {
    zts: u16,
    callback: u16,
    callback_ops: u16,
    jwt: u16,
    jwt_ops: u16,
    initializer: u16,
    initializer_ops: u16,
}

impl Ports {
    fn choose() -> anyhow::Result<Self> {
        Ok(Self {
            zts: free_port()?,
            callback: free_port()?,
            callback_ops: free_port()?,
            jwt: free_port()?,
            jwt_ops: free_port()?,
            initializer: free_port()?,
            initializer_ops: free_port()?,
        })
    }

    /// The callback's Service address (ZTS's provider endpoint, without the base path).
    fn callback_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.callback)
    }
}

/// What the phases share.
struct Start<'a> {
    options: &'a StackOptions,
    /// The state dir, absolute.
    state: PathBuf,
    /// The components' binaries (links to this one, or `--components`).
    bin: PathBuf,
    logs: PathBuf,
    /// `--faults-file=…` for the stand-ins, with `--fault-injection`.
    faults_arg: Option<String>,
    /// Started so far, in order.
    processes: Vec<Process>,
}

impl<'a> Start<'a> {
    /// The state dir and its layout (a `stack.json` or faults file of an earlier run removed),
    /// and the components' binaries.
    fn prepare(options: &'a StackOptions) -> anyhow::Result<Self> {
        let state = &options.state_dir;
        std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
        let state = std::fs::canonicalize(state).context("resolving the state dir")?;
        let _ = std::fs::remove_file(state.join("stack.json"));
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
        let faults_file = state.join(FAULTS_FILE);
        let _ = std::fs::remove_file(&faults_file);
        let faults_arg = options
            .fault_injection
            .then(|| path_arg("faults-file", &faults_file));
        Ok(Self {
            options,
            logs: state.join("logs"),
            state,
            bin,
            faults_arg,
            processes: Vec::new(),
        })
    }

    fn exe(&self) -> PathBuf {
        self.bin.join("athenz-devstack")
    }

    /// The dev ZTS, knowing the services' keys and the provider (the callback's address).
    async fn dev_zts(
        &mut self,
        services: Vec<ServiceEntry>,
        ports: &Ports,
    ) -> anyhow::Result<StandaloneInfo> {
        let athenz = self.options.zts == ZtsServer::Athenz;
        let mut config = DevZtsConfig {
            listen: ([127, 0, 0, 1], ports.zts).into(),
            services,
            providers: vec![ProviderEntry {
                name: PROVIDER.into(),
                endpoint: format!("{}{CALLBACK_BASE_PATH}", ports.callback_url()),
                dns_suffixes: vec![DNS_SUFFIX.into()],
                launch: vec!["*".into()],
            }],
            service_dns_suffixes: vec![DNS_SUFFIX.into()],
            roles: demo_roles(),
            ..DevZtsConfig::default()
        };
        if athenz {
            // what a ZMS administrator registers for Athenz's own ZTS: each tenant domain's
            // launch grant and its services (ZTS refuses an instance of an unlisted service)
            config.providers[0].launch = TENANT_DOMAINS
                .iter()
                .map(|d| format!("{d}.*"))
                .chain([AGENT_PRINCIPAL.to_owned()])
                .collect();
            config.services.extend(
                TENANT_SERVICES
                    .iter()
                    .map(|s| (*s).to_owned())
                    .chain([AGENT_PRINCIPAL.to_owned()])
                    .map(|name| ServiceEntry {
                        name,
                        public_keys: Default::default(),
                    }),
            );
        }
        let dir = self.state.join("zts");
        crate::json_file::write_atomically(&dir.join("config.json"), &config)?;
        let _ = std::fs::remove_file(dir.join("zts.json"));
        let mut args = vec![
            "zts".into(),
            path_arg("state-dir", &dir),
            path_arg("config", &dir.join("config.json")),
        ];
        if athenz {
            args.push("--server=athenz".into());
        }
        args.extend(self.faults_arg.clone());
        let mut command = Command::new("zts", &self.exe(), args);
        // Athenz's ZTS is a Java process under the command: its CPU and memory are that child's
        command.with_descendants = athenz;
        let mut zts = Process::start(command, &self.logs)?;
        zts.wait_file(&dir.join("zts.json")).await?;
        self.processes.push(zts);
        crate::json_file::read(&dir.join("zts.json")).context("reading zts.json")
    }

    /// The Kubernetes API and one kubelet stand-in per node.
    async fn kube_standins(&mut self) -> anyhow::Result<KubeInfo> {
        let dir = self.state.join("kube");
        let _ = std::fs::remove_file(dir.join("kube.json"));
        let mut args = vec!["kube-standins".to_owned(), path_arg("state-dir", &dir)];
        args.extend((0..self.options.nodes.max(1)).map(|i| format!("--node={}", node_name(i))));
        args.extend(self.faults_arg.clone());
        let mut kube = Process::start(Command::new("kube", &self.exe(), args), &self.logs)?;
        kube.wait_file(&dir.join("kube.json")).await?;
        self.processes.push(kube);
        crate::json_file::read(&dir.join("kube.json"))
    }

    /// Every control-plane certificate from ZTS (as the control-sia init containers get them)
    /// with their refresh sidecars; then the jwt-service, the callback and the initializer.
    async fn control_plane(
        &mut self,
        files: &BTreeMap<&'static str, ServiceFiles>,
        zts: &StandaloneInfo,
        kube: &KubeInfo,
        ports: &Ports,
    ) -> anyhow::Result<Vec<replicas::Deployment>> {
        let sidecars = control_plane_certificates(
            &self.bin.join("athenz-control-sia"),
            files,
            &zts.url,
            &zts.ca,
            &self.logs,
        )
        .await?;
        self.processes.extend(sidecars);
        let mut deployments = Vec::new();
        deployments.extend(self.jwt_service(&files[JWT_SERVICE], zts, ports).await?);
        deployments.extend(self.callback(&files[CALLBACK], zts, kube, ports).await?);
        self.initializer(&files[INITIALIZER], zts, ports).await?;
        Ok(deployments)
    }

    /// The jwt-service: only node agents may ask, each for its own node. Its Deployment when
    /// it runs more than one replica.
    async fn jwt_service(
        &mut self,
        files: &ServiceFiles,
        zts: &StandaloneInfo,
        ports: &Ports,
    ) -> anyhow::Result<Option<replicas::Deployment>> {
        let keys_dir = self.state.join("jwt-keys");
        let jwt_args = |port, ops| {
            let mut args = tls_args(port, ops, files);
            args.extend([
                path_arg("client-ca", &zts.ca),
                format!("--allowed-principals={AGENT_PRINCIPAL}"),
                path_arg("keys-dir", &keys_dir),
                format!("--provider={PROVIDER}"),
            ]);
            args
        };
        let jwt = replicas::ReplicaSet {
            deployment: "jwt-service",
            binary: "athenz-jwt-service",
            count: self.options.control_plane_replicas,
            service_port: ports.jwt,
            ops_port: ports.jwt_ops,
        };
        jwt.start(&self.bin, &self.logs, &mut self.processes, jwt_args)
            .await
    }

    /// The callback: only ZTS may ask. Its Deployment when it runs more than one replica.
    async fn callback(
        &mut self,
        files: &ServiceFiles,
        zts: &StandaloneInfo,
        kube: &KubeInfo,
        ports: &Ports,
    ) -> anyhow::Result<Option<replicas::Deployment>> {
        let options = self.options;
        let public_keys = self.state.join("jwt-public");
        let callback_args = |port, ops| {
            let mut args = tls_args(port, ops, files);
            args.extend([
                path_arg("client-ca", &zts.ca),
                "--allowed-principals=sys.auth.zts".into(),
                format!("--base-path={CALLBACK_BASE_PATH}"),
                path_arg("public-keys-dir", &public_keys),
                "--keys-reload-interval=1s".into(),
                format!("--kube-api-url={}", kube.api),
                // the API stand-in serves no watch (harness/testbed kube_api)
                "--pod-cache=false".into(),
            ]);
            if let Some(minutes) = options.cert_expiry_minutes {
                args.push(format!("--cert-expiry-minutes={minutes}"));
            }
            args.extend(identity_args());
            args
        };
        let callback = replicas::ReplicaSet {
            deployment: "callback",
            binary: "athenz-callback",
            count: options.control_plane_replicas,
            service_port: ports.callback,
            ops_port: ports.callback_ops,
        };
        callback
            .start(&self.bin, &self.logs, &mut self.processes, callback_args)
            .await
    }

    /// The initializer, with deploy/'s template, flex allowed as an operator would for nodes that
    /// run the flex driver (this stack's kubelet stand-ins do).
    async fn initializer(
        &mut self,
        files: &ServiceFiles,
        zts: &StandaloneInfo,
        ports: &Ports,
    ) -> anyhow::Result<()> {
        let template = self.state.join("initializer-template.yaml");
        let text = crate::initializer_template::with_allowed_volumes(
            &deploy_template()?,
            &[
                VolumeMode::CsiSocket,
                VolumeMode::CsiFiles,
                VolumeMode::Flex,
            ],
        );
        std::fs::write(&template, text)
            .with_context(|| format!("writing {}", template.display()))?;
        let mut args = tls_args(ports.initializer, ports.initializer_ops, files);
        args.push(path_arg("template", &template));
        // what deploy/'s athenz-cluster ConfigMap gives it: the release's image, ZTS's URL
        args.push(format!(
            "--sia-image=ghcr.io/athenz-k8s-identity/athenz-k8s-identity:{}",
            env!("CARGO_PKG_VERSION")
        ));
        args.push(format!("--zts-url={}", zts.url));
        let initializer = run_daemon(
            &self.bin,
            "initializer",
            "athenz-initializer",
            args,
            ports.initializer_ops,
            &self.logs,
        )
        .await?;
        self.processes.push(initializer);
        Ok(())
    }

    /// One agent per node, each attested by its own pod's token (no shared key).
    async fn agents(
        &mut self,
        kube: &KubeInfo,
        zts: &StandaloneInfo,
        ports: &Ports,
        peer_check: PeerCheck,
    ) -> anyhow::Result<Vec<NodeInfo>> {
        let mut nodes = Vec::new();
        for (i, kube_node) in kube.nodes.iter().enumerate() {
            nodes.push(self.agent(i, kube_node, zts, ports, peer_check).await?);
        }
        Ok(nodes)
    }

    /// The agent of node `i` (the first's process is `agent`, the others' `agent-<node>`),
    /// serving CSI too when the stack's volume is a CSI one; what `stack.json` says of the node.
    async fn agent(
        &mut self,
        i: usize,
        kube_node: &KubeNode,
        zts: &StandaloneInfo,
        ports: &Ports,
        peer_check: PeerCheck,
    ) -> anyhow::Result<NodeInfo> {
        let options = self.options;
        let ca = &zts.ca;
        let (agent_dir, volumes_dir, identity_dir) = node_dirs(&self.state, i);
        let agent_ops = free_port()?;
        let mut args = vec![
            path_arg("agent-dir", &agent_dir),
            path_arg("volumes-dir", &volumes_dir),
            format!("--kubelet-url={}", kube_node.kubelet),
            format!("--jwt-service-url=https://127.0.0.1:{}", ports.jwt),
            format!("--node-name={}", kube_node.name),
            path_arg("node-token-file", &kube_node.token_file),
            path_arg("node-identity-dir", &identity_dir),
            format!("--peer-check={peer_check}"),
            path_arg("jwt-service-ca", ca),
            format!("--zts-url={}", zts.url),
            path_arg("zts-ca", ca),
            format!("--key-algorithm={}", options.key_algorithm),
            format!("--key-source={}", options.key_source),
            format!("--ops-listen=127.0.0.1:{agent_ops}"),
            "--upstream-timeout=5s".into(),
        ];
        args.extend(identity_args());
        // kubelet's plugin dir for the node: <node dir>/plugins/csi.athenz.io/csi.sock
        let csi_socket = options.volume.is_csi().then(|| {
            agent_dir
                .parent()
                .unwrap_or(&self.state)
                .join(format!("plugins-{}", kube_node.name))
                .join("csi.athenz.io")
                .join("csi.sock")
        });
        if let Some(socket) = &csi_socket {
            args.push(format!("--csi-socket={}", socket.display()));
            if let Some(interval) = options.csi_refresh_interval {
                args.push(format!("--csi-refresh-interval={}ms", interval.as_millis()));
            }
        }
        let process_name = if i == 0 {
            "agent".to_owned()
        } else {
            format!("agent-{}", kube_node.name)
        };
        let agent = run_daemon(
            &self.bin,
            &process_name,
            "athenz-identity-agent",
            args,
            agent_ops,
            &self.logs,
        )
        .await?;
        self.processes.push(agent);
        Ok(NodeInfo {
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
            credentials: Credential {
                cert: identity_dir.join("node.cert.pem"),
                key: identity_dir.join("node.key.pem"),
                ca: ca.clone(),
            },
        })
    }
}

/// The settings every daemon that names identities shares.
fn identity_args() -> [String; 3] {
    [
        format!("--provider={PROVIDER}"),
        format!("--dns-suffix={DNS_SUFFIX}"),
        format!("--admin-domain={ADMIN_DOMAIN}"),
    ]
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

/// What every control-plane daemon listens with: its service port and ops port on loopback,
/// and its certificate and key from `files`.
fn tls_args(port: u16, ops: u16, files: &ServiceFiles) -> Vec<String> {
    vec![
        format!("--listen=127.0.0.1:{port}"),
        format!("--ops-listen=127.0.0.1:{ops}"),
        path_arg("tls-cert", &files.cert()),
        path_arg("tls-key", &files.key()),
    ]
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
