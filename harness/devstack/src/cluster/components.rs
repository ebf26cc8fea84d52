//! Starting the components in dependency order, each as its own process with its own log, each
//! waited for before the next: etcd, the API server, the controller-manager and scheduler,
//! containerd (and the pause image), the kubelet, kube-proxy (with `--node-authorizer`, the node
//! authorizer before the API server); then the node must be Ready with a
//! pod range, and the `default` service account must exist (what pods need before they can be
//! created). Each node's own components start in [`super::node_start`].

use super::control_plane::{
    apiserver_args, controller_manager_args, flag, scheduler_args, write_audit_policy,
};
use super::health::{Checker, wait_for};
use super::info::{ApiServer, ClusterInfo, Containerd, NodeInfo};
use super::layout::{pids, write_pids};
use super::node_authorizer::{self, Authorization, NODE_AUTHORIZER};
use super::nodes::{NodeNamespaces, NodeSpec};
use super::pki::ClusterPki;
use super::{ClusterOptions, Layout, host, images};
use crate::procs::{Command, Process, free_port};
use anyhow::{Context, bail};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

// The components' names: their binaries under the build, their processes and their logs
// (`logs/<name>.log`).
pub const ETCD: &str = "etcd";
pub const APISERVER: &str = "kube-apiserver";
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";
pub const SCHEDULER: &str = "kube-scheduler";
pub const CONTAINERD: &str = "containerd";
pub const KUBELET: &str = "kubelet";
pub const KUBE_PROXY: &str = "kube-proxy";
/// The kubelet's API port: Kubernetes' default.
pub const KUBELET_PORT: u16 = 10250;

/// How long each may take to come up, on a busy two-core machine.
const ETCD_UP: Duration = Duration::from_secs(30);
const APISERVER_UP: Duration = Duration::from_secs(120);
const CONTROLLERS_UP: Duration = Duration::from_secs(60);
const NODE_AUTHORIZER_UP: Duration = Duration::from_secs(30);
pub(super) const CONTAINERD_UP: Duration = Duration::from_secs(30);
pub(super) const KUBELET_UP: Duration = Duration::from_secs(60);
pub(super) const PROXY_UP: Duration = Duration::from_secs(60);
pub(super) const NODE_READY: Duration = Duration::from_secs(120);

/// A PATH for components that exec host tools (iptables, mount, conntrack) and for containerd,
/// which finds its shim beside itself only through PATH.
pub(super) fn path_env(layout: &Layout) -> Vec<(String, String)> {
    let inherited = std::env::var("PATH").unwrap_or_default();
    vec![(
        "PATH".to_owned(),
        format!(
            "{}:{inherited}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            layout.kube_bin.display()
        ),
    )]
}

/// Starts every component (see the module docs) and returns what `cluster.json` says.
pub async fn start_all(
    layout: &Layout,
    options: &ClusterOptions,
    processes: &mut Vec<Process>,
    report: &mut dyn FnMut(String),
) -> anyhow::Result<ClusterInfo> {
    host::check_tools(layout)?;
    host::prepare()?;
    let primary = primary_node(options)?;
    let nodes = NodeSpec::all(&primary.name, primary.ip, options.nodes)?;
    let api_port = free_port()?;
    let api_server = format!("https://{}:{api_port}", primary.ip);
    let pki = ClusterPki::create(layout, &nodes, &api_server, options.node_authorizer)?;
    let checker = Checker::new(&pki.ca, &pki.admin.cert, &pki.admin.key, &api_server)?;
    report(format!(
        "node {} ({}){}; state in {}",
        primary.name,
        primary.ip,
        match nodes.len() {
            1 => String::new(),
            n => format!(" and {} more in network namespaces", n - 1),
        },
        layout.dir.display()
    ));
    let pause_archive = images::build_pause(layout)?;
    report(format!("pause image {} built", images::PAUSE_IMAGE));

    let mut up = Starter {
        layout,
        processes,
        checker,
        report,
    };
    let etcd_url = up.etcd().await?;
    let authorization = match options.node_authorizer {
        true => up.node_authorizer(&pki).await?,
        false => Authorization::NodeRbac,
    };
    up.api_server(
        &pki,
        primary.ip,
        api_port,
        &etcd_url,
        &api_server,
        &authorization,
    )
    .await?;
    up.controller_manager_and_scheduler(&pki, true).await?;
    if nodes.len() > 1 {
        super::nodes::create_bridge()?;
    }
    let mut node_infos = Vec::new();
    for node in &nodes {
        node_infos.push(up.node(&pki, node, &pause_archive).await?);
    }
    up.default_service_account().await?;
    Ok(up.cluster_info(api_server, &pki, node_infos).await)
}

/// The primary node: `--node-ip` or the default route's source address; `--node-name` or the
/// host's name, which must be a name Kubernetes accepts for a node.
fn primary_node(options: &ClusterOptions) -> anyhow::Result<NodeSpec> {
    let ip = match options.node_ip {
        Some(ip) => ip,
        None => host::default_ipv4()?,
    };
    let name = options
        .node_name
        .clone()
        .unwrap_or_else(host::default_node_name);
    if !host::is_dns_subdomain(&name) {
        bail!("--node-name {name}: a node name must be a lowercase RFC 1123 subdomain");
    }
    Ok(NodeSpec { index: 0, name, ip })
}

/// The number of the further node a process runs on (`kubelet-2` → 2); `None` for the
/// primary's and the control plane's.
pub fn node_of(process: &str) -> Option<usize> {
    [CONTAINERD, KUBELET, KUBE_PROXY]
        .iter()
        .find_map(|c| process.strip_prefix(c)?.strip_prefix('-')?.parse().ok())
}

/// Whether the process named `process` is `component` on some node: `kubelet` (the primary's)
/// or `kubelet-<n>` (a further node's).
pub fn is_component(process: &str, component: &str) -> bool {
    process == component
        || process
            .strip_prefix(component)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| n.parse::<usize>().is_ok())
}

/// One component to start from the build (`<kube_bin>/<name>`), and how long it may take to
/// come up.
pub(super) struct Component {
    /// Its binary.
    pub(super) name: &'static str,
    /// Its process and log name (the binary's, or `<name>-<n>` on a further node).
    pub(super) process: String,
    /// The further node's namespaces it runs in (`None`: the host's).
    pub(super) namespaces: Option<NodeNamespaces>,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    /// What is waited for, as an error names it (`"etcd /health"`).
    pub(super) awaited: &'static str,
    pub(super) limit: Duration,
}

/// What starting the components shares: where they live, the processes started so far (each
/// recorded in `processes.json` as it starts, so `cluster down` finds it even if this fails),
/// the client that asks whether they are up, and where progress goes.
pub(super) struct Starter<'a> {
    pub(super) layout: &'a Layout,
    pub(super) processes: &'a mut Vec<Process>,
    pub(super) checker: Checker,
    pub(super) report: &'a mut dyn FnMut(String),
}

impl Starter<'_> {
    /// Starts `component`, records it, and waits until `check` passes (failing at once if the
    /// process exits); returns how long it took.
    pub(super) async fn start_until<F, Fut>(
        &mut self,
        component: Component,
        check: F,
    ) -> anyhow::Result<Duration>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let binary = self.layout.bin(component.name);
        let mut command = match &component.namespaces {
            None => Command::new(&component.process, &binary, component.args),
            Some(namespaces) => {
                let (program, args) = namespaces.wrap(&binary, component.args);
                Command::new(&component.process, &program, args)
            }
        };
        command.env = component.env;
        command.cwd = Some(self.layout.dir.clone());
        self.processes
            .push(Process::start(command, &self.layout.logs)?);
        write_pids(self.layout, self.processes)?;
        let process = self
            .processes
            .last_mut()
            .context("no process was started")?;
        wait_for(process, component.awaited, component.limit, check).await
    }

    /// Starts `component`, waits until `GET health` answers 2xx and reports it up as `label`.
    pub(super) async fn start_healthy(
        &mut self,
        component: Component,
        health: String,
        label: &str,
    ) -> anyhow::Result<()> {
        let checker = self.checker.clone();
        let took = self
            .start_until(component, || ok_or(&checker, &health))
            .await?;
        (self.report)(format!("{label} up in {:.1} s", took.as_secs_f64()));
        Ok(())
    }

    /// Waits, on the running component `name` (described as `what` if it is not running), until
    /// `check` passes; returns how long it took.
    pub(super) async fn wait_on<F, Fut>(
        &mut self,
        name: &str,
        what: &str,
        awaited: &str,
        limit: Duration,
        check: F,
    ) -> anyhow::Result<Duration>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let process = self
            .processes
            .iter_mut()
            .find(|p| p.command.name == name)
            .with_context(|| format!("{what} is not running"))?;
        wait_for(process, awaited, limit, check).await
    }

    /// etcd on loopback ports, its data unsynced; returns its client URL.
    async fn etcd(&mut self) -> anyhow::Result<String> {
        self.etcd_with_quota(2 << 30).await
    }

    /// [`Self::etcd`] with a backend quota of `quota_bytes` (`cluster scale`'s is larger).
    pub(super) async fn etcd_with_quota(&mut self, quota_bytes: u64) -> anyhow::Result<String> {
        let (client, peer) = (free_port()?, free_port()?);
        let url = format!("http://127.0.0.1:{client}");
        let args = vec![
            "--name=default".to_owned(),
            flag("data-dir", &self.layout.etcd_data),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--quota-backend-bytes={quota_bytes}"),
            "--log-level=warn".to_owned(),
            // a development cluster's data dies with it; fsyncs would only slow the machine
            "--unsafe-no-fsync".to_owned(),
        ];
        let etcd = Component {
            name: ETCD,
            process: ETCD.to_owned(),
            namespaces: None,
            args,
            env: Vec::new(),
            awaited: "etcd /health",
            limit: ETCD_UP,
        };
        self.start_healthy(etcd, format!("{url}/health"), "etcd")
            .await?;
        Ok(url)
    }

    /// The API server ([`apiserver_args`]) at `url`, on `port` of `node_ip`, authorizing as
    /// `authorization` says.
    pub(super) async fn api_server(
        &mut self,
        pki: &ClusterPki,
        node_ip: Ipv4Addr,
        port: u16,
        etcd_url: &str,
        url: &str,
        authorization: &Authorization,
    ) -> anyhow::Result<()> {
        let audit = write_audit_policy(self.layout)?;
        let api_server = Component {
            name: APISERVER,
            process: APISERVER.to_owned(),
            namespaces: None,
            args: apiserver_args(pki, node_ip, port, etcd_url, &audit, authorization),
            env: Vec::new(),
            awaited: "the API server's /readyz",
            limit: APISERVER_UP,
        };
        self.start_healthy(api_server, format!("{url}/readyz"), "API server")
            .await
    }

    /// The node authorizer ([`super::node_authorizer`]) on loopback ports of its own, recorded
    /// as the cluster's, up once its /readyz answers; then the API server's
    /// AuthorizationConfiguration and webhook kubeconfig under `<state>/node-authorizer/`.
    /// Returns how the API server authorizes.
    async fn node_authorizer(&mut self, pki: &ClusterPki) -> anyhow::Result<Authorization> {
        let certs = pki
            .node_authorizer
            .as_ref()
            .context("the cluster PKI has no node authorizer certificates")?;
        let (port, ops) = (free_port()?, free_port()?);
        let dir = self.layout.dir.join("node-authorizer");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // this executable under the daemon's name runs it (crate::multicall)
        let link = dir.join(NODE_AUTHORIZER);
        let exe = std::env::current_exe().context("finding athenz-devstack itself")?;
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&exe, &link)
            .with_context(|| format!("linking {}", link.display()))?;
        let args = node_authorizer::args(
            port,
            ops,
            (&certs.serving.cert, &certs.serving.key),
            &pki.ca,
            super::install::NODE_NAMESPACE,
        );
        let mut command = Command::new(NODE_AUTHORIZER, &link, args);
        command.cwd = Some(self.layout.dir.clone());
        self.processes
            .push(Process::start(command, &self.layout.logs)?);
        write_pids(self.layout, self.processes)?;
        let checker = self.checker.clone();
        let ready = format!("http://127.0.0.1:{ops}/readyz");
        let took = self
            .wait_on(
                NODE_AUTHORIZER,
                "the node authorizer",
                "the node authorizer's /readyz",
                NODE_AUTHORIZER_UP,
                || ok_or(&checker, &ready),
            )
            .await?;
        (self.report)(format!("node authorizer up in {:.1} s", took.as_secs_f64()));
        let kubeconfig = dir.join("kubeconfig.yaml");
        let client = &certs.apiserver_client;
        let text = node_authorizer::webhook_kubeconfig(port, &pki.ca, &client.cert, &client.key);
        athenz_testbed::pki::write_file(&kubeconfig, text.as_bytes(), 0o600)?;
        let config = dir.join("authorization-config.yaml");
        write(
            &config,
            &node_authorizer::authorization_config(&kubeconfig)?,
        )?;
        Ok(Authorization::Config(config))
    }

    /// The controller-manager (allocating pod ranges to nodes when `node_cidrs`), then the
    /// scheduler, each on a loopback port of its own.
    pub(super) async fn controller_manager_and_scheduler(
        &mut self,
        pki: &ClusterPki,
        node_cidrs: bool,
    ) -> anyhow::Result<()> {
        let (cm_port, scheduler_port) = (free_port()?, free_port()?);
        let controller_manager = Component {
            name: CONTROLLER_MANAGER,
            process: CONTROLLER_MANAGER.to_owned(),
            namespaces: None,
            args: controller_manager_args(pki, cm_port, node_cidrs)?,
            env: Vec::new(),
            awaited: "the controller-manager's /healthz",
            limit: CONTROLLERS_UP,
        };
        let health = format!("https://127.0.0.1:{cm_port}/healthz");
        self.start_healthy(controller_manager, health, "controller-manager")
            .await?;
        let scheduler = Component {
            name: SCHEDULER,
            process: SCHEDULER.to_owned(),
            namespaces: None,
            args: scheduler_args(pki, scheduler_port)?,
            env: Vec::new(),
            awaited: "the scheduler's /healthz",
            limit: CONTROLLERS_UP,
        };
        let health = format!("https://127.0.0.1:{scheduler_port}/healthz");
        self.start_healthy(scheduler, health, "scheduler").await
    }

    /// Waits until the controller-manager has made the `default` service account, which pods
    /// need before they can be created.
    async fn default_service_account(&mut self) -> anyhow::Result<()> {
        let checker = self.checker.clone();
        let created = || {
            let checker = checker.clone();
            async move {
                checker
                    .api_json("/api/v1/namespaces/default/serviceaccounts/default")
                    .await
                    .map(|_| ())
                    .ok_or_else(|| "not created yet".to_owned())
            }
        };
        self.wait_on(
            CONTROLLER_MANAGER,
            "the controller-manager",
            "the default service account",
            CONTROLLERS_UP,
            created,
        )
        .await?;
        Ok(())
    }

    /// What `cluster.json` says of the cluster now up (no release yet).
    async fn cluster_info(
        &self,
        api_server: String,
        pki: &ClusterPki,
        nodes: Vec<NodeInfo>,
    ) -> ClusterInfo {
        let layout = self.layout;
        let version = self
            .checker
            .api_json("/version")
            .await
            .and_then(|v| v["gitVersion"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let primary = nodes.first().cloned().unwrap_or_else(|| NodeInfo {
            name: String::new(),
            ip: String::new(),
            pod_cidr: String::new(),
            containerd: Containerd {
                socket: layout.containerd_socket(),
                namespace: super::CONTAINERD_NAMESPACE.to_owned(),
            },
            namespaces: None,
        });
        ClusterInfo {
            api_server: ApiServer {
                url: api_server,
                ca: pki.ca.clone(),
            },
            node_name: primary.name,
            node_ip: primary.ip,
            kubernetes_version: version,
            containerd: primary.containerd,
            kube_bin: layout.kube_bin.clone(),
            kubeconfig: layout.kubeconfig.clone(),
            pause_image: images::PAUSE_IMAGE.to_owned(),
            pod_cidr: primary.pod_cidr,
            service_cidr: super::SERVICE_CIDR.to_owned(),
            logs: layout.logs.clone(),
            pids: pids(self.processes),
            nodes,
            zts: None,
            image: None,
            overlay: None,
        }
    }
}

/// `Ok` when `GET url` answers 2xx, else what was asked (for the error).
async fn ok_or(checker: &Checker, url: &str) -> Result<(), String> {
    if checker.ok(url).await {
        Ok(())
    } else {
        Err(format!("GET {url} not 2xx"))
    }
}

/// `Ok` when `ctr version` reaches containerd through `socket`, else why not.
pub(super) async fn ctr_version(layout: Layout, socket: std::path::PathBuf) -> Result<(), String> {
    let mut ctr = std::process::Command::new(layout.bin("ctr"));
    ctr.arg("--address").arg(socket).arg("version");
    images::run(&mut ctr, "ctr version")
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

/// Writes `text` to `path`, naming the path on failure.
pub(super) fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_name_their_component_and_node() {
        assert!(is_component("kubelet", KUBELET));
        assert!(is_component("kubelet-3", KUBELET));
        assert!(!is_component("kubelet-x", KUBELET));
        assert!(!is_component("kube-proxy", KUBELET));
        assert_eq!(node_of("kube-proxy-2"), Some(2));
        assert_eq!(node_of("kubelet"), None);
        assert_eq!(node_of("kube-apiserver"), None);
    }
}
