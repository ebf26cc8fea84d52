//! Starting the components in dependency order, each as its own process with its own log, each
//! waited for before the next: etcd, the API server, the controller-manager and scheduler,
//! containerd (and the pause image), the kubelet, kube-proxy; then the node must be Ready with a
//! pod range, and the `default` service account must exist (what pods need before they can be
//! created).

use super::config::{self, KubeletInputs, NodePorts};
use super::control_plane::{
    apiserver_args, controller_manager_args, flag, scheduler_args, write_audit_policy,
};
use super::health::{Checker, wait_for};
use super::info::{ApiServer, ClusterInfo, Containerd};
use super::layout::{pids, write_pids};
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
const CONTAINERD_UP: Duration = Duration::from_secs(30);
const KUBELET_UP: Duration = Duration::from_secs(60);
const PROXY_UP: Duration = Duration::from_secs(60);
const NODE_READY: Duration = Duration::from_secs(120);

/// A PATH for components that exec host tools (iptables, mount, conntrack) and for containerd,
/// which finds its shim beside itself only through PATH.
fn path_env(layout: &Layout) -> Vec<(String, String)> {
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
    let node = Node::of(options)?;
    let api_port = free_port()?;
    let api_server = format!("https://{}:{api_port}", node.ip);
    let pki = ClusterPki::create(layout, &node.name, node.ip, &api_server)?;
    let checker = Checker::new(&pki.ca, &pki.admin.cert, &pki.admin.key, &api_server)?;
    report(format!(
        "node {} ({}); state in {}",
        node.name,
        node.ip,
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
    up.api_server(&pki, node.ip, api_port, &etcd_url, &api_server)
        .await?;
    up.controller_manager_and_scheduler(&pki).await?;
    let lower_oom_score = up.containerd(&pause_archive).await?;
    let ports = up.kubelet(&pki, &node, lower_oom_score).await?;
    up.kube_proxy(&pki, &node, ports, lower_oom_score).await?;
    up.node_ready(&node.name).await?;
    up.default_service_account().await?;
    Ok(up.cluster_info(api_server, &pki, node).await)
}

/// The node this cluster is: its address and name, from the options or this host.
struct Node {
    ip: Ipv4Addr,
    name: String,
}

impl Node {
    /// `--node-ip` or the default route's source address; `--node-name` or the host's name,
    /// which must be a name Kubernetes accepts for a node.
    fn of(options: &ClusterOptions) -> anyhow::Result<Self> {
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
        Ok(Self { ip, name })
    }
}

/// One component to start from the build (`<kube_bin>/<name>`), and how long it may take to
/// come up.
struct Component {
    /// Its binary, process and log name.
    name: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// What is waited for, as an error names it (`"etcd /health"`).
    awaited: &'static str,
    limit: Duration,
}

/// What starting the components shares: where they live, the processes started so far (each
/// recorded in `processes.json` as it starts, so `cluster down` finds it even if this fails),
/// the client that asks whether they are up, and where progress goes.
struct Starter<'a> {
    layout: &'a Layout,
    processes: &'a mut Vec<Process>,
    checker: Checker,
    report: &'a mut dyn FnMut(String),
}

impl Starter<'_> {
    /// Starts `component`, records it, and waits until `check` passes (failing at once if the
    /// process exits); returns how long it took.
    async fn start_until<F, Fut>(
        &mut self,
        component: Component,
        check: F,
    ) -> anyhow::Result<Duration>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let mut command = Command::new(
            component.name,
            &self.layout.bin(component.name),
            component.args,
        );
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
    async fn start_healthy(
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
    async fn wait_on<F, Fut>(
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
        let (client, peer) = (free_port()?, free_port()?);
        let url = format!("http://127.0.0.1:{client}");
        let args = vec![
            "--name=default".to_owned(),
            flag("data-dir", &self.layout.etcd_data),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            "--quota-backend-bytes=2147483648".to_owned(),
            "--log-level=warn".to_owned(),
            // a development cluster's data dies with it; fsyncs would only slow the machine
            "--unsafe-no-fsync".to_owned(),
        ];
        let etcd = Component {
            name: ETCD,
            args,
            env: Vec::new(),
            awaited: "etcd /health",
            limit: ETCD_UP,
        };
        self.start_healthy(etcd, format!("{url}/health"), "etcd")
            .await?;
        Ok(url)
    }

    /// The API server ([`apiserver_args`]) at `url`, on `port` of `node_ip`.
    async fn api_server(
        &mut self,
        pki: &ClusterPki,
        node_ip: Ipv4Addr,
        port: u16,
        etcd_url: &str,
        url: &str,
    ) -> anyhow::Result<()> {
        let audit = write_audit_policy(self.layout)?;
        let api_server = Component {
            name: APISERVER,
            args: apiserver_args(pki, node_ip, port, etcd_url, &audit),
            env: Vec::new(),
            awaited: "the API server's /readyz",
            limit: APISERVER_UP,
        };
        self.start_healthy(api_server, format!("{url}/readyz"), "API server")
            .await
    }

    /// The controller-manager, then the scheduler, each on a loopback port of its own.
    async fn controller_manager_and_scheduler(&mut self, pki: &ClusterPki) -> anyhow::Result<()> {
        let (cm_port, scheduler_port) = (free_port()?, free_port()?);
        let controller_manager = Component {
            name: CONTROLLER_MANAGER,
            args: controller_manager_args(pki, cm_port)?,
            env: Vec::new(),
            awaited: "the controller-manager's /healthz",
            limit: CONTROLLERS_UP,
        };
        let health = format!("https://127.0.0.1:{cm_port}/healthz");
        self.start_healthy(controller_manager, health, "controller-manager")
            .await?;
        let scheduler = Component {
            name: SCHEDULER,
            args: scheduler_args(pki, scheduler_port)?,
            env: Vec::new(),
            awaited: "the scheduler's /healthz",
            limit: CONTROLLERS_UP,
        };
        let health = format!("https://127.0.0.1:{scheduler_port}/healthz");
        self.start_healthy(scheduler, health, "scheduler").await
    }

    /// containerd with runc, the pause image and the CNI network; up when `ctr version` reaches
    /// it, then the pause image is imported. Returns whether containers may get OOM scores
    /// below 0 (this host grants CAP_SYS_RESOURCE).
    async fn containerd(&mut self, pause_archive: &Path) -> anyhow::Result<bool> {
        let layout = self.layout;
        let runc = host::find_tool("runc").context("runc is not installed")?;
        let lower_oom_score = host::can_lower_oom_score_adj();
        if !lower_oom_score {
            (self.report)(
                "this host denies CAP_SYS_RESOURCE: containers' OOM scores are clamped to 0 \
                 (containerd restrict_oom_score_adj)"
                    .to_owned(),
            );
        }
        let config = layout.containerd.join("config.toml");
        write(
            &config,
            &config::containerd(layout, images::PAUSE_IMAGE, &runc, !lower_oom_score)?,
        )?;
        write(
            &layout.cni_conf_dir.join("10-athenz-devstack.conflist"),
            &serde_json::to_string_pretty(&config::cni_conflist(layout))?,
        )?;
        let containerd = Component {
            name: CONTAINERD,
            args: vec![flag("config", &config)],
            env: path_env(layout),
            awaited: "containerd's socket",
            limit: CONTAINERD_UP,
        };
        let took = self
            .start_until(containerd, || ctr_version(layout.clone()))
            .await?;
        images::import(layout, pause_archive)?;
        (self.report)(format!(
            "containerd up in {:.1} s; pause image imported",
            took.as_secs_f64()
        ));
        Ok(lower_oom_score)
    }

    /// The kubelet, serving on [`KUBELET_PORT`] with a certificate from the cluster CA; returns
    /// the node's ports (kube-proxy's too, chosen here for both configs).
    async fn kubelet(
        &mut self,
        pki: &ClusterPki,
        node: &Node,
        lower_oom_score: bool,
    ) -> anyhow::Result<NodePorts> {
        let ports = NodePorts {
            // the port every kubelet serves on, which deploy/ (the agent's KUBELET_URL) assumes
            kubelet: KUBELET_PORT,
            kubelet_healthz: free_port()?,
            proxy_healthz: free_port()?,
            proxy_metrics: free_port()?,
        };
        let config = self.layout.kubelet.join("config.yaml");
        let inputs = KubeletInputs {
            lower_oom_score,
            client_ca: &pki.ca,
            tls_cert: &pki.kubelet_serving.cert,
            tls_key: &pki.kubelet_serving.key,
            ports,
        };
        write(
            &config,
            &serde_json::to_string_pretty(&config::kubelet(self.layout, &inputs))?,
        )?;
        let kubelet = Component {
            name: KUBELET,
            args: vec![
                flag("config", &config),
                flag("kubeconfig", pki.kubeconfig("kubelet")?),
                format!("--hostname-override={}", node.name),
                format!("--node-ip={}", node.ip),
                "--v=2".to_owned(),
            ],
            env: path_env(self.layout),
            awaited: "the kubelet's /healthz",
            limit: KUBELET_UP,
        };
        let health = format!("http://127.0.0.1:{}/healthz", ports.kubelet_healthz);
        self.start_healthy(kubelet, health, "kubelet").await?;
        Ok(ports)
    }

    /// kube-proxy, on the ports [`Starter::kubelet`] chose.
    async fn kube_proxy(
        &mut self,
        pki: &ClusterPki,
        node: &Node,
        ports: NodePorts,
        lower_oom_score: bool,
    ) -> anyhow::Result<()> {
        let config = self.layout.kube_proxy.join("config.yaml");
        write(
            &config,
            &serde_json::to_string_pretty(&config::kube_proxy(
                pki.kubeconfig("kube-proxy")?,
                &node.name,
                node.ip,
                ports,
                lower_oom_score,
            ))?,
        )?;
        let kube_proxy = Component {
            name: KUBE_PROXY,
            args: vec![flag("config", &config), "--v=1".to_owned()],
            env: path_env(self.layout),
            awaited: "kube-proxy's /healthz",
            limit: PROXY_UP,
        };
        let health = format!("http://127.0.0.1:{}/healthz", ports.proxy_healthz);
        self.start_healthy(kube_proxy, health, "kube-proxy").await
    }

    /// Waits until the API has node `name` Ready with a pod range (the kubelet must keep
    /// running meanwhile).
    async fn node_ready(&mut self, name: &str) -> anyhow::Result<()> {
        let checker = self.checker.clone();
        let ready = || {
            let checker = checker.clone();
            let name = name.to_owned();
            async move {
                let state = checker.node(&name).await;
                match (&state.ready, &state.pod_cidr) {
                    (Some(c), Some(_)) if c.ready => Ok(()),
                    _ => Err(state.to_string()),
                }
            }
        };
        let awaited = format!("node {name} Ready");
        let took = self
            .wait_on(KUBELET, "the kubelet", &awaited, NODE_READY, ready)
            .await?;
        (self.report)(format!("node {name} Ready in {:.1} s", took.as_secs_f64()));
        Ok(())
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
    async fn cluster_info(&self, api_server: String, pki: &ClusterPki, node: Node) -> ClusterInfo {
        let layout = self.layout;
        let version = self
            .checker
            .api_json("/version")
            .await
            .and_then(|v| v["gitVersion"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let pod_cidr = self
            .checker
            .node(&node.name)
            .await
            .pod_cidr
            .unwrap_or_default();
        ClusterInfo {
            api_server: ApiServer {
                url: api_server,
                ca: pki.ca.clone(),
            },
            node_name: node.name,
            node_ip: node.ip.to_string(),
            kubernetes_version: version,
            containerd: Containerd {
                socket: layout.containerd_socket(),
                namespace: super::CONTAINERD_NAMESPACE.to_owned(),
            },
            kube_bin: layout.kube_bin.clone(),
            kubeconfig: layout.kubeconfig.clone(),
            pause_image: images::PAUSE_IMAGE.to_owned(),
            pod_cidr,
            service_cidr: super::SERVICE_CIDR.to_owned(),
            logs: layout.logs.clone(),
            pids: pids(self.processes),
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

/// `Ok` when `ctr version` reaches containerd through its socket, else why not.
async fn ctr_version(layout: Layout) -> Result<(), String> {
    let mut ctr = std::process::Command::new(layout.bin("ctr"));
    ctr.arg("--address")
        .arg(layout.containerd_socket())
        .arg("version");
    images::run(&mut ctr, "ctr version")
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

/// Writes `text` to `path`, naming the path on failure.
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
