//! The configuration files of containerd, the CNI bridge network, the kubelet and kube-proxy.
//! The kubelet's and kube-proxy's are JSON (which is YAML), made with `serde_json` so a typo
//! cannot make a field silently unknown to us — the kubelet rejects unknown fields itself.

use super::layout::NodeDirs;
use anyhow::bail;
use serde_json::json;
use std::net::Ipv4Addr;
use std::path::Path;

/// Ports of the node's components (chosen free at start: two clusters' tests, or a cluster and
/// a conformance run, may share a machine).
#[derive(Debug, Clone, Copy)]
pub struct NodePorts {
    /// The kubelet's API (default 10250).
    pub kubelet: u16,
    /// The kubelet's plain-HTTP /healthz on loopback (default 10248).
    pub kubelet_healthz: u16,
    /// kube-proxy's /healthz on loopback (default 10256).
    pub proxy_healthz: u16,
    /// kube-proxy's /metrics on loopback (default 10249).
    pub proxy_metrics: u16,
}

/// A path as a TOML literal string (no escapes: refused if it holds a quote or a newline).
fn toml_path(path: &Path) -> anyhow::Result<String> {
    let text = path.display().to_string();
    if text.contains('\'') || text.contains('\n') {
        bail!("{text}: a path with a quote or newline cannot go into containerd's config");
    }
    Ok(format!("'{text}'"))
}

/// containerd's config (version 4, as containerd 2.4 writes its default): its own root, state,
/// sockets and shim socket dir; no imports from /etc, NRI off (its socket is host-global);
/// runc from the host through the cgroupfs driver (no systemd here); the CRI plugin with our
/// pause image pinned as the sandbox image, network namespaces mounted under its state dir (so
/// they are under the state dir, and found and unmounted by `cluster down`), runc's state under
/// the run dir (not the host's `/run/containerd/runc`), and the CNI plugins from Debian's
/// package. `restrict_oom_score_adj` clamps containers' OOM scores to containerd's own where
/// the host denies lowering them ([`super::host::can_lower_oom_score_adj`]).
pub fn containerd(
    node: &NodeDirs,
    pause_image: &str,
    runc: &Path,
    restrict_oom_score_adj: bool,
) -> anyhow::Result<String> {
    let socket = node.containerd_socket();
    let ttrpc = node.run_dir.join("containerd.sock.ttrpc");
    Ok(format!(
        "version = 4
root = {root}
state = {state}
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = {socket}
  [plugins.'io.containerd.server.v1.ttrpc']
    address = {ttrpc}
  [plugins.'io.containerd.server.v1.debug']
    address = ''
  [plugins.'io.containerd.internal.v1.opt']
    path = {opt}
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = {shims}
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{pause_image}'
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = {restrict_oom_score_adj}
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {runc}
          Root = {runc_root}
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}']
      conf_dir = {cni_conf}
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
",
        root = toml_path(&node.containerd.join("root"))?,
        state = toml_path(&node.containerd.join("state"))?,
        socket = toml_path(&socket)?,
        ttrpc = toml_path(&ttrpc)?,
        opt = toml_path(&node.containerd.join("opt"))?,
        shims = toml_path(&node.shims)?,
        runc = toml_path(runc)?,
        runc_root = toml_path(&node.run_dir.join("runc"))?,
        cni_bin = super::host::CNI_BIN_DIR,
        cni_conf = toml_path(&node.cni_conf_dir)?,
    ))
}

/// The pods' network: a `bridge` on [`super::BRIDGE`] that is the pods' gateway and masquerades
/// what leaves the pod range, host-local addresses from the node's `pod_cidr` kept under the
/// node's directory, and `portmap` for hostPorts. containerd adds the loopback itself.
pub fn cni_conflist(node: &NodeDirs, pod_cidr: &str) -> serde_json::Value {
    json!({
        "cniVersion": "1.0.0",
        "name": super::CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": super::BRIDGE,
                "isGateway": true,
                "isDefaultGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": node.cni_ipam_dir,
                    "ranges": [[{ "subnet": pod_cidr }]],
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    })
}

/// What the kubelet's config depends on.
#[derive(Debug, Clone, Copy)]
pub struct KubeletInputs<'a> {
    /// Whether it may give itself -999 (see [`super::host::can_lower_oom_score_adj`]).
    pub lower_oom_score: bool,
    /// The cluster CA (clients' certificates are checked against it).
    pub client_ca: &'a Path,
    /// Its serving certificate and key (issued here: no TLS bootstrap).
    pub tls_cert: &'a Path,
    /// The serving key.
    pub tls_key: &'a Path,
    pub ports: NodePorts,
    /// Where its plain-HTTP /healthz listens: loopback on the primary, the node's address on a
    /// further node (whose loopback the host cannot reach).
    pub healthz_address: Ipv4Addr,
    /// Its `cgroupRoot`: `/` on the primary, the node's own on a further node.
    pub cgroup_root: &'a str,
}

/// The kubelet's config: cgroupfs with the QoS hierarchy under `/kubepods` and cgroup v1
/// allowed (this host's hybrid layout counts as v1; 1.35+ refuses it otherwise), no swap check,
/// only the pods' allocatable enforced, webhook authentication (x509 with the cluster CA) and
/// authorization, no read-only port, the serving certificate issued here, containerd's socket,
/// cluster DNS, the pods' logs under the state dir, and eviction and image GC thresholds off (a
/// development machine's disk fills for other reasons; evicting the pods under test would only
/// hide that) as kind sets them.
pub fn kubelet(node: &NodeDirs, inputs: &KubeletInputs<'_>) -> serde_json::Value {
    let endpoint = format!("unix://{}", node.containerd_socket().display());
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "port": inputs.ports.kubelet,
        "healthzBindAddress": inputs.healthz_address.to_string(),
        "healthzPort": inputs.ports.kubelet_healthz,
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": inputs.client_ca },
        },
        "authorization": { "mode": "Webhook" },
        "tlsCertFile": inputs.tls_cert,
        "tlsPrivateKeyFile": inputs.tls_key,
        "serverTLSBootstrap": false,
        "rotateCertificates": false,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": false,
        "failSwapOn": false,
        "cgroupsPerQOS": true,
        "cgroupRoot": inputs.cgroup_root,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "clusterDNS": [super::CLUSTER_DNS],
        "clusterDomain": "cluster.local",
        "podLogsDir": node.kubelet.join("pod-logs"),
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "oomScoreAdj": if inputs.lower_oom_score { -999 } else { 0 },
    })
}

/// kube-proxy's config: iptables mode, the pods' range (what it masquerades), the node's name,
/// NodePorts on the node's primary address only (what kube-proxy recommends), health and
/// metrics on free loopback ports; it leaves the host's conntrack table size and
/// `route_localnet` alone (no localhost NodePorts), as kind's does.
pub fn kube_proxy(
    kubeconfig: &Path,
    node_name: &str,
    node_ip: Ipv4Addr,
    health_ip: Ipv4Addr,
    ports: NodePorts,
    lower_oom_score: bool,
) -> serde_json::Value {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": { "kubeconfig": kubeconfig },
        "mode": "iptables",
        "clusterCIDR": super::CLUSTER_CIDR,
        "hostnameOverride": node_name,
        "bindAddress": node_ip.to_string(),
        "healthzBindAddress": format!("{health_ip}:{}", ports.proxy_healthz),
        "metricsBindAddress": format!("{health_ip}:{}", ports.proxy_metrics),
        "iptables": { "localhostNodePorts": false },
        "nodePortAddresses": ["primary"],
        "conntrack": { "maxPerCore": 0 },
        "oomScoreAdj": if lower_oom_score { -999 } else { 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_with_a_quote_is_refused() {
        assert!(toml_path(Path::new("/tmp/it's")).is_err());
        assert_eq!(toml_path(Path::new("/tmp/a b")).unwrap(), "'/tmp/a b'");
    }
}
