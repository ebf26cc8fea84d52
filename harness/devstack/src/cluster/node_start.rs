//! Starting one node's components (docs/design.md §5.1, §5.2): for a further node its
//! namespaces first ([`super::nodes`]), then containerd with the pause image, the kubelet, the
//! pods' network on the range the controller-manager gave the node, kube-proxy, and the wait
//! until the API has it Ready. [`super::components`] starts the control plane and calls this
//! for each node.

use super::components::{
    CONTAINERD, CONTAINERD_UP, Component, KUBE_PROXY, KUBELET, KUBELET_PORT, KUBELET_UP,
    NODE_READY, PROXY_UP, Starter, ctr_version, path_env, write,
};
use super::config::{self, KubeletInputs, NodePorts};
use super::control_plane::flag;
use super::info::{Containerd, NodeInfo, NodeNamespaceFiles};
use super::layout::NodeDirs;
use super::nodes::{NodeNamespaces, NodeSpec};
use super::pki::ClusterPki;
use super::{Layout, host, images};
use crate::procs::free_port;
use anyhow::Context;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

impl Starter<'_> {
    /// Starts node `node` (see [`super::nodes`]): for a further node its namespaces first, then
    /// containerd with the pause image, the kubelet, the pods' network on the range the
    /// controller-manager gave the node, kube-proxy; returns once the API has it Ready.
    pub(super) async fn node(
        &mut self,
        pki: &ClusterPki,
        node: &NodeSpec,
        pause_archive: &Path,
    ) -> anyhow::Result<NodeInfo> {
        let dirs = self.layout.node(node.index);
        dirs.create()?;
        let namespaces = if node.is_primary() {
            None
        } else {
            let made = super::nodes::create(&self.layout.run_dir, &dirs.dir, node)?;
            (self.report)(format!(
                "node {} ({}): network and mount namespaces made",
                node.name, node.ip
            ));
            Some(made)
        };
        let on = OnNode {
            spec: node,
            dirs: &dirs,
            namespaces: namespaces.as_ref(),
        };
        if node.is_primary() {
            // the controller-manager gives the first node to register the first range
            write_cni_conflist(&dirs, super::NODE_POD_CIDR)?;
        }
        let lower_oom_score = self.containerd(&on, pause_archive).await?;
        let ports = self.kubelet(pki, &on, lower_oom_score).await?;
        let pod_cidr = self.pod_range(&on).await?;
        if !node.is_primary() {
            write_cni_conflist(&dirs, &pod_cidr)?;
            super::nodes::route_pods(node, &pod_cidr)?;
        }
        self.kube_proxy(pki, &on, ports, lower_oom_score).await?;
        self.node_ready(&on).await?;
        Ok(NodeInfo {
            name: node.name.clone(),
            ip: node.ip.to_string(),
            pod_cidr,
            containerd: Containerd {
                socket: dirs.containerd_socket(),
                namespace: super::CONTAINERD_NAMESPACE.to_owned(),
            },
            namespaces: namespaces.map(|n| NodeNamespaceFiles {
                net: n.net,
                mount: n.mount,
            }),
        })
    }

    /// containerd with runc and the pause image; up when `ctr version` reaches it, then the
    /// pause image is imported. Returns whether containers may get OOM scores below 0 (this
    /// host grants CAP_SYS_RESOURCE).
    async fn containerd(&mut self, on: &OnNode<'_>, pause_archive: &Path) -> anyhow::Result<bool> {
        let runc = host::find_tool("runc").context("runc is not installed")?;
        let lower_oom_score = host::can_lower_oom_score_adj();
        if !lower_oom_score && on.spec.is_primary() {
            (self.report)(
                "this host denies CAP_SYS_RESOURCE: containers' OOM scores are clamped to 0 \
                 (containerd restrict_oom_score_adj)"
                    .to_owned(),
            );
        }
        let config = on.dirs.containerd.join("config.toml");
        write(
            &config,
            &config::containerd(on.dirs, images::PAUSE_IMAGE, &runc, !lower_oom_score)?,
        )?;
        let containerd = on.component(CONTAINERD, vec![flag("config", &config)], self.layout);
        let containerd = Component {
            awaited: "containerd's socket",
            limit: CONTAINERD_UP,
            ..containerd
        };
        let socket = on.dirs.containerd_socket();
        let layout = self.layout.clone();
        let took = self
            .start_until(containerd, || ctr_version(layout.clone(), socket.clone()))
            .await?;
        images::import_into(self.layout, &on.dirs.containerd_socket(), pause_archive)?;
        (self.report)(format!(
            "{} up in {:.1} s; pause image imported",
            on.spec.process_name(CONTAINERD),
            took.as_secs_f64()
        ));
        Ok(lower_oom_score)
    }

    /// The kubelet, serving on [`KUBELET_PORT`] with a certificate from the cluster CA; returns
    /// the node's ports (kube-proxy's too, chosen here for both configs).
    async fn kubelet(
        &mut self,
        pki: &ClusterPki,
        on: &OnNode<'_>,
        lower_oom_score: bool,
    ) -> anyhow::Result<NodePorts> {
        let ports = NodePorts {
            // the port every kubelet serves on, which deploy/ (the agent's KUBELET_URL) assumes
            kubelet: KUBELET_PORT,
            kubelet_healthz: free_port()?,
            proxy_healthz: free_port()?,
            proxy_metrics: free_port()?,
        };
        let credentials = pki.kubelet(on.spec.index)?;
        let config = on.dirs.kubelet.join("config.yaml");
        let cgroup_root = on.spec.cgroup_root();
        let inputs = KubeletInputs {
            lower_oom_score,
            client_ca: &pki.ca,
            tls_cert: &credentials.serving.cert,
            tls_key: &credentials.serving.key,
            ports,
            healthz_address: on.health_ip(),
            cgroup_root: &cgroup_root,
        };
        write(
            &config,
            &serde_json::to_string_pretty(&config::kubelet(on.dirs, &inputs))?,
        )?;
        let args = vec![
            flag("config", &config),
            flag("kubeconfig", &credentials.kubeconfig),
            format!("--hostname-override={}", on.spec.name),
            format!("--node-ip={}", on.spec.ip),
            "--v=2".to_owned(),
        ];
        let kubelet = Component {
            awaited: "the kubelet's /healthz",
            limit: KUBELET_UP,
            ..on.component(KUBELET, args, self.layout)
        };
        let health = format!(
            "http://{}:{}/healthz",
            on.health_ip(),
            ports.kubelet_healthz
        );
        let label = on.spec.process_name(KUBELET);
        self.start_healthy(kubelet, health, &label).await?;
        Ok(ports)
    }

    /// Waits until the controller-manager has given the registered node a pod range; returns it.
    async fn pod_range(&mut self, on: &OnNode<'_>) -> anyhow::Result<String> {
        let checker = self.checker.clone();
        let name = on.spec.name.clone();
        let ranged = || {
            let checker = checker.clone();
            let name = name.clone();
            async move {
                let state = checker.node(&name).await;
                state.pod_cidr.clone().ok_or_else(|| state.to_string())
            }
        };
        let process = on.spec.process_name(KUBELET);
        let awaited = format!("node {} registered with a pod range", on.spec.name);
        self.wait_on(&process, "the kubelet", &awaited, NODE_READY, || async {
            ranged().await.map(|_| ())
        })
        .await?;
        ranged()
            .await
            .map_err(|state| anyhow::anyhow!("node {name}: {state}"))
    }

    /// kube-proxy, on the ports [`Starter::kubelet`] chose.
    async fn kube_proxy(
        &mut self,
        pki: &ClusterPki,
        on: &OnNode<'_>,
        ports: NodePorts,
        lower_oom_score: bool,
    ) -> anyhow::Result<()> {
        let config = on.dirs.kube_proxy.join("config.yaml");
        write(
            &config,
            &serde_json::to_string_pretty(&config::kube_proxy(
                pki.kubeconfig("kube-proxy")?,
                &on.spec.name,
                on.spec.ip,
                on.health_ip(),
                ports,
                lower_oom_score,
            ))?,
        )?;
        let kube_proxy = Component {
            awaited: "kube-proxy's /healthz",
            limit: PROXY_UP,
            ..on.component(
                KUBE_PROXY,
                vec![flag("config", &config), "--v=1".to_owned()],
                self.layout,
            )
        };
        let health = format!("http://{}:{}/healthz", on.health_ip(), ports.proxy_healthz);
        let label = on.spec.process_name(KUBE_PROXY);
        self.start_healthy(kube_proxy, health, &label).await
    }

    /// Waits until the API has the node Ready with a pod range (its kubelet must keep running
    /// meanwhile).
    async fn node_ready(&mut self, on: &OnNode<'_>) -> anyhow::Result<()> {
        let checker = self.checker.clone();
        let name = on.spec.name.clone();
        let ready = || {
            let checker = checker.clone();
            let name = name.clone();
            async move {
                let state = checker.node(&name).await;
                match (&state.ready, &state.pod_cidr) {
                    (Some(c), Some(_)) if c.ready => Ok(()),
                    _ => Err(state.to_string()),
                }
            }
        };
        let awaited = format!("node {name} Ready");
        let process = on.spec.process_name(KUBELET);
        let took = self
            .wait_on(&process, "the kubelet", &awaited, NODE_READY, ready)
            .await?;
        (self.report)(format!("node {name} Ready in {:.1} s", took.as_secs_f64()));
        Ok(())
    }
}

/// One node as its components are started on it.
struct OnNode<'a> {
    spec: &'a NodeSpec,
    dirs: &'a NodeDirs,
    /// A further node's namespaces (`None` on the primary).
    namespaces: Option<&'a NodeNamespaces>,
}

impl OnNode<'_> {
    /// Where the host reaches the node's health endpoints: loopback on the primary, the node's
    /// address on a further node.
    fn health_ip(&self) -> Ipv4Addr {
        if self.spec.is_primary() {
            Ipv4Addr::LOCALHOST
        } else {
            self.spec.ip
        }
    }

    /// `binary` with `args` as this node runs it (inside its namespaces on a further node), with
    /// PATH for the host tools it execs; the caller sets what is awaited.
    fn component(&self, binary: &'static str, args: Vec<String>, layout: &Layout) -> Component {
        Component {
            name: binary,
            process: self.spec.process_name(binary),
            namespaces: self.namespaces.cloned(),
            args,
            env: path_env(layout),
            awaited: "",
            limit: Duration::ZERO,
        }
    }
}

/// Writes the node's CNI network for `pod_cidr` (containerd picks it up when it appears).
fn write_cni_conflist(dirs: &NodeDirs, pod_cidr: &str) -> anyhow::Result<()> {
    write(
        &dirs.cni_conf_dir.join("10-athenz-devstack.conflist"),
        &serde_json::to_string_pretty(&config::cni_conflist(dirs, pod_cidr))?,
    )
}
