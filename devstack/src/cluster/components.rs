//! Starting the components in dependency order, each as its own process with its own log, each
//! waited for before the next: etcd, the API server, the controller-manager and scheduler,
//! containerd (and the pause image), the kubelet, kube-proxy; then the node must be Ready with a
//! pod range, and the `default` service account must exist (what pods need before they can be
//! created).

use super::config::{self, KubeletInputs, NodePorts};
use super::health::{Checker, wait_for};
use super::info::{ApiServer, ClusterInfo, Containerd};
use super::layout::{pids, write_pids};
use super::pki::ClusterPki;
use super::{ClusterOptions, Layout, host, images};
use crate::procs::{Command, Process, free_port};
use anyhow::{Context, bail};
use std::time::Duration;

/// The components' names (their logs are `logs/<name>.log`).
pub const ETCD: &str = "etcd";
/// The API server.
pub const APISERVER: &str = "kube-apiserver";
/// The controller-manager.
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";
/// The scheduler.
pub const SCHEDULER: &str = "kube-scheduler";
/// containerd.
pub const CONTAINERD: &str = "containerd";
/// The kubelet.
pub const KUBELET: &str = "kubelet";
/// kube-proxy.
pub const KUBE_PROXY: &str = "kube-proxy";
/// The API server's audit log, in the logs directory (JSON lines).
pub const AUDIT_LOG: &str = "audit.log";
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

/// Starts `name` from the build (`<kube_bin>/<name>`) with `args`, and records it.
fn start(
    layout: &Layout,
    processes: &mut Vec<Process>,
    name: &str,
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let mut command = Command::new(name, &layout.bin(name), args);
    command.env = env;
    command.cwd = Some(layout.dir.clone());
    let process = Process::start(command, &layout.logs)?;
    processes.push(process);
    write_pids(layout, processes)
}

/// The last started process (the one a wait is about).
fn last(processes: &mut [Process]) -> anyhow::Result<&mut Process> {
    processes.last_mut().context("no process was started")
}

/// `--flag=<path>`.
fn flag(name: &str, value: impl AsRef<std::ffi::OsStr>) -> String {
    format!(
        "--{name}={}",
        std::path::Path::new(value.as_ref()).display()
    )
}

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
    let node_ip = match options.node_ip {
        Some(ip) => ip,
        None => host::default_ipv4()?,
    };
    let node_name = options
        .node_name
        .clone()
        .unwrap_or_else(host::default_node_name);
    if !host::is_dns_subdomain(&node_name) {
        bail!("--node-name {node_name}: a node name must be a lowercase RFC 1123 subdomain");
    }
    let api_port = free_port()?;
    let api_server = format!("https://{node_ip}:{api_port}");
    let pki = ClusterPki::create(layout, &node_name, node_ip, &api_server)?;
    let checker = Checker::new(&pki.ca, &pki.admin.cert, &pki.admin.key, &api_server)?;
    report(format!(
        "node {node_name} ({node_ip}); state in {}",
        layout.dir.display()
    ));
    let pause_archive = images::build_pause(layout)?;
    report(format!("pause image {} built", images::PAUSE_IMAGE));

    // etcd
    let (etcd_client, etcd_peer) = (free_port()?, free_port()?);
    let etcd_url = format!("http://127.0.0.1:{etcd_client}");
    start(
        layout,
        processes,
        ETCD,
        vec![
            "--name=default".to_owned(),
            flag("data-dir", &layout.etcd_data),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            "--quota-backend-bytes=2147483648".to_owned(),
            "--log-level=warn".to_owned(),
            // a development cluster's data dies with it; fsyncs would only slow the machine
            "--unsafe-no-fsync".to_owned(),
        ],
        Vec::new(),
    )?;
    let health = format!("{etcd_url}/health");
    let took = wait_for(last(processes)?, "etcd /health", ETCD_UP, || {
        ok_or(&checker, &health)
    })
    .await?;
    report(format!("etcd up in {:.1} s", took.as_secs_f64()));

    // the API server
    start(
        layout,
        processes,
        APISERVER,
        apiserver_args(
            &pki,
            node_ip,
            api_port,
            &etcd_url,
            &write_audit_policy(layout)?,
        ),
        Vec::new(),
    )?;
    let readyz = format!("{api_server}/readyz");
    let took = wait_for(
        last(processes)?,
        "the API server's /readyz",
        APISERVER_UP,
        || ok_or(&checker, &readyz),
    )
    .await?;
    report(format!("API server up in {:.1} s", took.as_secs_f64()));

    // the controller-manager and the scheduler
    let (cm_port, scheduler_port) = (free_port()?, free_port()?);
    start(
        layout,
        processes,
        CONTROLLER_MANAGER,
        controller_manager_args(&pki, cm_port)?,
        Vec::new(),
    )?;
    let cm_health = format!("https://127.0.0.1:{cm_port}/healthz");
    let took = wait_for(
        last(processes)?,
        "the controller-manager's /healthz",
        CONTROLLERS_UP,
        || ok_or(&checker, &cm_health),
    )
    .await?;
    report(format!(
        "controller-manager up in {:.1} s",
        took.as_secs_f64()
    ));
    start(
        layout,
        processes,
        SCHEDULER,
        scheduler_args(&pki, scheduler_port)?,
        Vec::new(),
    )?;
    let scheduler_health = format!("https://127.0.0.1:{scheduler_port}/healthz");
    let took = wait_for(
        last(processes)?,
        "the scheduler's /healthz",
        CONTROLLERS_UP,
        || ok_or(&checker, &scheduler_health),
    )
    .await?;
    report(format!("scheduler up in {:.1} s", took.as_secs_f64()));

    // containerd, with the pause image and the CNI network
    let runc = host::find_tool("runc").context("runc is not installed")?;
    let lower_oom_score = host::can_lower_oom_score_adj();
    if !lower_oom_score {
        report(
            "this host denies CAP_SYS_RESOURCE: containers' OOM scores are clamped to 0 \
             (containerd restrict_oom_score_adj)"
                .to_owned(),
        );
    }
    let containerd_config = layout.containerd.join("config.toml");
    write(
        &containerd_config,
        &config::containerd(layout, images::PAUSE_IMAGE, &runc, !lower_oom_score)?,
    )?;
    write(
        &layout.cni_conf_dir.join("10-athenz-devstack.conflist"),
        &serde_json::to_string_pretty(&config::cni_conflist(layout))?,
    )?;
    start(
        layout,
        processes,
        CONTAINERD,
        vec![flag("config", &containerd_config)],
        path_env(layout),
    )?;
    let ctr_version = || {
        let layout = layout.clone();
        async move {
            let mut ctr = std::process::Command::new(layout.bin("ctr"));
            ctr.arg("--address")
                .arg(layout.containerd_socket())
                .arg("version");
            images::run(&mut ctr, "ctr version")
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        }
    };
    let took = wait_for(
        last(processes)?,
        "containerd's socket",
        CONTAINERD_UP,
        ctr_version,
    )
    .await?;
    images::import(layout, &pause_archive)?;
    report(format!(
        "containerd up in {:.1} s; pause image imported",
        took.as_secs_f64()
    ));

    // the kubelet
    let ports = NodePorts {
        // the port every kubelet serves on, which deploy/ (the agent's KUBELET_URL) assumes
        kubelet: KUBELET_PORT,
        kubelet_healthz: free_port()?,
        proxy_healthz: free_port()?,
        proxy_metrics: free_port()?,
    };
    let kubelet_config = layout.kubelet.join("config.yaml");
    let inputs = KubeletInputs {
        lower_oom_score,
        client_ca: &pki.ca,
        tls_cert: &pki.kubelet_serving.cert,
        tls_key: &pki.kubelet_serving.key,
        ports,
    };
    write(
        &kubelet_config,
        &serde_json::to_string_pretty(&config::kubelet(layout, &inputs))?,
    )?;
    start(
        layout,
        processes,
        KUBELET,
        vec![
            flag("config", &kubelet_config),
            flag("kubeconfig", pki.kubeconfig("kubelet")?),
            format!("--hostname-override={node_name}"),
            format!("--node-ip={node_ip}"),
            "--v=2".to_owned(),
        ],
        path_env(layout),
    )?;
    let kubelet_health = format!("http://127.0.0.1:{}/healthz", ports.kubelet_healthz);
    let took = wait_for(
        last(processes)?,
        "the kubelet's /healthz",
        KUBELET_UP,
        || ok_or(&checker, &kubelet_health),
    )
    .await?;
    report(format!("kubelet up in {:.1} s", took.as_secs_f64()));

    // kube-proxy
    let proxy_config = layout.kube_proxy.join("config.yaml");
    write(
        &proxy_config,
        &serde_json::to_string_pretty(&config::kube_proxy(
            pki.kubeconfig("kube-proxy")?,
            &node_name,
            node_ip,
            ports,
            lower_oom_score,
        ))?,
    )?;
    start(
        layout,
        processes,
        KUBE_PROXY,
        vec![flag("config", &proxy_config), "--v=1".to_owned()],
        path_env(layout),
    )?;
    let proxy_health = format!("http://127.0.0.1:{}/healthz", ports.proxy_healthz);
    let took = wait_for(last(processes)?, "kube-proxy's /healthz", PROXY_UP, || {
        ok_or(&checker, &proxy_health)
    })
    .await?;
    report(format!("kube-proxy up in {:.1} s", took.as_secs_f64()));

    // the node, as the API sees it
    let kubelet = processes
        .iter_mut()
        .find(|p| p.command.name == KUBELET)
        .context("the kubelet is not running")?;
    let took = wait_for(
        kubelet,
        &format!("node {node_name} Ready"),
        NODE_READY,
        || {
            let checker = checker.clone();
            let node_name = node_name.clone();
            async move {
                let state = checker.node(&node_name).await;
                match (&state.ready, &state.pod_cidr) {
                    (Some(c), Some(_)) if c.ready => Ok(()),
                    _ => Err(state.to_string()),
                }
            }
        },
    )
    .await?;
    report(format!(
        "node {node_name} Ready in {:.1} s",
        took.as_secs_f64()
    ));
    let controller_manager = processes
        .iter_mut()
        .find(|p| p.command.name == CONTROLLER_MANAGER)
        .context("the controller-manager is not running")?;
    wait_for(
        controller_manager,
        "the default service account",
        CONTROLLERS_UP,
        || {
            let checker = checker.clone();
            async move {
                checker
                    .api_json("/api/v1/namespaces/default/serviceaccounts/default")
                    .await
                    .map(|_| ())
                    .ok_or_else(|| "not created yet".to_owned())
            }
        },
    )
    .await?;

    let version = checker
        .api_json("/version")
        .await
        .and_then(|v| v["gitVersion"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let pod_cidr = checker.node(&node_name).await.pod_cidr.unwrap_or_default();
    let info = ClusterInfo {
        api_server: ApiServer {
            url: api_server,
            ca: pki.ca.clone(),
        },
        node_name,
        node_ip: node_ip.to_string(),
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
        pids: pids(processes),
        zts: None,
        image: None,
        overlay: None,
    };
    Ok(info)
}

/// `Ok` when `GET url` answers 2xx, else what was asked (for the error).
async fn ok_or(checker: &Checker, url: &str) -> Result<(), String> {
    if checker.ok(url).await {
        Ok(())
    } else {
        Err(format!("GET {url} not 2xx"))
    }
}

fn write(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The API server: the node's address advertised (it refuses loopback), `Node,RBAC` with the
/// cluster CA's client certificates, NodeRestriction on top of the default admission plugins,
/// the service-account issuer a conformant cluster uses, the front proxy for aggregated APIs,
/// and aggregator routing to endpoints (webhooks work before kube-proxy does).
fn apiserver_args(
    pki: &ClusterPki,
    node_ip: std::net::Ipv4Addr,
    port: u16,
    etcd: &str,
    audit: &Audit,
) -> Vec<String> {
    vec![
        flag("audit-policy-file", &audit.policy),
        flag("audit-log-path", &audit.log),
        "--audit-log-format=json".to_owned(),
        format!("--advertise-address={node_ip}"),
        "--bind-address=0.0.0.0".to_owned(),
        format!("--secure-port={port}"),
        format!("--etcd-servers={etcd}"),
        "--allow-privileged=true".to_owned(),
        "--authorization-mode=Node,RBAC".to_owned(),
        "--enable-admission-plugins=NodeRestriction".to_owned(),
        flag("client-ca-file", &pki.ca),
        flag("tls-cert-file", &pki.apiserver.cert),
        flag("tls-private-key-file", &pki.apiserver.key),
        flag(
            "kubelet-client-certificate",
            &pki.apiserver_kubelet_client.cert,
        ),
        flag("kubelet-client-key", &pki.apiserver_kubelet_client.key),
        flag("kubelet-certificate-authority", &pki.ca),
        "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
        flag("proxy-client-cert-file", &pki.front_proxy_client.cert),
        flag("proxy-client-key-file", &pki.front_proxy_client.key),
        flag("requestheader-client-ca-file", &pki.front_proxy_ca),
        "--requestheader-allowed-names=front-proxy-client".to_owned(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
        "--requestheader-group-headers=X-Remote-Group".to_owned(),
        "--requestheader-username-headers=X-Remote-User".to_owned(),
        format!("--service-account-issuer={}", super::SERVICE_ACCOUNT_ISSUER),
        flag("service-account-key-file", &pki.service_account_public),
        flag("service-account-signing-key-file", &pki.service_account_key),
        format!("--service-cluster-ip-range={}", super::SERVICE_CIDR),
        "--enable-aggregator-routing=true".to_owned(),
        "--v=1".to_owned(),
    ]
}

/// The API server's audit: the policy file and where the log goes.
struct Audit {
    policy: std::path::PathBuf,
    log: std::path::PathBuf,
}

/// The audit policy (DESIGN.md 5.1: the real API server judges our RBAC): every request of a
/// service account of ours (`athenz-system`, `k8s-admin`: who asked what, and the answer's code)
/// and of SPIRE's when `cluster bench` installs it (`spire`: its API requests per credential),
/// and every SubjectAccessReview with its answer (the kubelet asks one for each caller of its
/// API, so the log says what the kubelet required of the agent). Nothing else is logged.
fn write_audit_policy(layout: &Layout) -> anyhow::Result<Audit> {
    let policy = layout.dir.join("audit-policy.yaml");
    write(
        &policy,
        &format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             \x20 - level: RequestResponse\n\
             \x20   resources: [{{group: authorization.k8s.io, resources: [subjectaccessreviews]}}]\n\
             \x20 - level: Metadata\n\
             \x20   userGroups: [\"system:serviceaccounts:{}\", \"system:serviceaccounts:{}\", \
             \"system:serviceaccounts:{}\"]\n\
             \x20 - level: None\n",
            super::install::NODE_NAMESPACE,
            super::install::CONTROL_NAMESPACE,
            super::spire::NAMESPACE
        ),
    )?;
    Ok(Audit {
        policy,
        log: layout.logs.join(AUDIT_LOG),
    })
}

/// The controller-manager: every default controller, service-account tokens per controller,
/// the root CA for `kube-root-ca.crt`, the cluster CA as the CSR signer, pod ranges per node.
fn controller_manager_args(pki: &ClusterPki, port: u16) -> anyhow::Result<Vec<String>> {
    let kubeconfig = pki.kubeconfig("controller-manager")?;
    Ok(vec![
        flag("kubeconfig", kubeconfig),
        flag("authentication-kubeconfig", kubeconfig),
        flag("authorization-kubeconfig", kubeconfig),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        flag("tls-cert-file", &pki.controller_manager_serving.cert),
        flag("tls-private-key-file", &pki.controller_manager_serving.key),
        flag("client-ca-file", &pki.ca),
        flag("requestheader-client-ca-file", &pki.front_proxy_ca),
        flag("cluster-signing-cert-file", &pki.ca),
        flag("cluster-signing-key-file", &pki.ca_key),
        "--controllers=*".to_owned(),
        "--leader-elect=false".to_owned(),
        flag("root-ca-file", &pki.ca),
        flag("service-account-private-key-file", &pki.service_account_key),
        "--use-service-account-credentials=true".to_owned(),
        "--allocate-node-cidrs=true".to_owned(),
        format!("--cluster-cidr={}", super::CLUSTER_CIDR),
        "--node-cidr-mask-size=24".to_owned(),
        format!("--service-cluster-ip-range={}", super::SERVICE_CIDR),
        "--cluster-name=athenz-devstack".to_owned(),
        "--v=1".to_owned(),
    ])
}

/// The scheduler, with its own kubeconfig and a serving certificate from the cluster CA.
fn scheduler_args(pki: &ClusterPki, port: u16) -> anyhow::Result<Vec<String>> {
    let kubeconfig = pki.kubeconfig("scheduler")?;
    Ok(vec![
        flag("kubeconfig", kubeconfig),
        flag("authentication-kubeconfig", kubeconfig),
        flag("authorization-kubeconfig", kubeconfig),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        flag("tls-cert-file", &pki.scheduler_serving.cert),
        flag("tls-private-key-file", &pki.scheduler_serving.key),
        flag("client-ca-file", &pki.ca),
        "--leader-elect=false".to_owned(),
        "--v=1".to_owned(),
    ])
}
