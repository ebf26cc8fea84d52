//! The initializer in the pods' path at scale: the release's `athenz-initializer` (from the
//! image's binaries) as a process on this host, as its service account (deploy/'s RBAC), serving
//! from its own CA in the shipped Secret and keeping the shipped webhook configuration's
//! caBundle, as in a cluster. The API server reaches it through the shipped Service's name: a
//! Service of that name with an EndpointSlice for this host (the API server routes webhooks
//! to endpoints, `--enable-aggregator-routing`), so each admission is the API server's own call,
//! name check and all.

use crate::cluster::kubectl::Kubectl;
use crate::procs::{Command, Process, free_port};
use anyhow::Context;
use serde_json::json;
use std::net::Ipv4Addr;
use std::path::Path;

/// The initializer's service account, as deploy/ names it.
pub const INITIALIZER_USER: &str = "system:serviceaccount:k8s-admin:athenz-initializer";
/// The webhook's name in deploy/base/initializer-webhook.yaml (the API server's metrics label).
pub const WEBHOOK_NAME: &str = "initializer.athenz.io";
/// The namespace deploy/ runs the initializer in.
const NAMESPACE: &str = "k8s-admin";
/// Its Service, Secret, webhook configuration and template ConfigMap, as deploy/ names them.
const SERVICE: &str = "athenz-initializer";
const CA_SECRET: &str = "athenz-initializer-ca";
const TEMPLATE_CONFIG_MAP: &str = "athenz-initializer-template";
/// The settings every daemon reads (`envFrom` in deploy/).
const CLUSTER_SETTINGS: &str = "athenz-cluster";

/// Applies what deploy/ ships for the webhook: the cluster settings, the template, the empty CA
/// Secret and the webhook configuration; and, for this host, the Service and its endpoint at
/// `ip:port`. Returns the template's text and the settings (the initializer's environment).
pub fn install(
    kubectl: &Kubectl,
    ip: Ipv4Addr,
    port: u16,
) -> anyhow::Result<(String, Vec<(String, String)>)> {
    for file in [
        "deploy/base/cluster-settings.yaml",
        "deploy/base/initializer-template.yaml",
        "deploy/base/initializer-webhook.yaml",
    ] {
        let path = crate::cluster::workspace_path(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        kubectl.apply_manifest(&text, file)?;
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": CA_SECRET, "namespace": NAMESPACE}});
    // no selector: the endpoint is this host's, written here (no pod backs it)
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}});
    let endpoints = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{SERVICE}-host"), "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]});
    for object in [secret, service, endpoints] {
        kubectl.apply_manifest(&object.to_string(), "the webhook's Service for this host")?;
    }
    let template = kubectl.run(&[
        "get",
        "configmap",
        TEMPLATE_CONFIG_MAP,
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.data.template\\.yaml}",
    ])?;
    let settings = kubectl.get_json(&["configmap", CLUSTER_SETTINGS, "-n", NAMESPACE])?;
    let env = settings["data"]
        .as_object()
        .context("the cluster settings have no data")?
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    Ok((template, env))
}

/// The initializer running on this host.
pub struct Initializer {
    pub process: Process,
    /// Its ops address (`/metrics`).
    pub ops: String,
}

/// Starts the initializer from `binary` on `ip:port` with `kubeconfig` (its service account's),
/// `template` and the cluster's `settings` as its environment, as deploy/'s Deployment sets
/// them; waits until it serves (its /readyz: a certificate from its CA, the caBundle written).
pub async fn start(
    binary: &Path,
    kubeconfig: &Path,
    (ip, port): (Ipv4Addr, u16),
    (template, settings): &(String, Vec<(String, String)>),
    dir: &Path,
    logs: &Path,
) -> anyhow::Result<Initializer> {
    let dir = dir.join("initializer");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let template_file = dir.join("template.yaml");
    std::fs::write(&template_file, template)
        .with_context(|| format!("writing {}", template_file.display()))?;
    let ops = free_port()?;
    let args = vec![
        format!("--listen={ip}:{port}"),
        format!("--ops-listen=127.0.0.1:{ops}"),
        format!("--serving-ca-secret={NAMESPACE}/{CA_SECRET}"),
        format!("--webhook-configuration={SERVICE}"),
        format!("--serving-dns-names={SERVICE}.{NAMESPACE}.svc"),
        format!("--template={}", template_file.display()),
    ];
    let mut command = Command::new("athenz-initializer", binary, args);
    command.env = settings.clone();
    command
        .env
        .push(("KUBECONFIG".to_owned(), kubeconfig.display().to_string()));
    let mut process = Process::start(command, logs)?;
    let ops = format!("http://127.0.0.1:{ops}");
    process.wait_http_ok(&format!("{ops}/readyz")).await?;
    Ok(Initializer { process, ops })
}
