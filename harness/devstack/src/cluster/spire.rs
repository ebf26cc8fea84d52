//! SPIRE beside us on the real node, for `cluster bench --systems athenz,spire`: the platform
//! teams' usual alternative, deployed as SPIRE's Kubernetes quickstart deploys it
//! (harness/peers/spire/deploy/spire.yaml: spire-server with SQLite and k8s_psat node attestation,
//! spire-agent as a DaemonSet with the k8s workload attestor against the real kubelet, the SPIFFE
//! CSI driver), from images built here of SPIRE's and spiffe-csi's published Go modules
//! (harness/peers/spire/build.sh). Its registration entries are made one of two ways
//! ([`Entries`]): with spire-server's CLI before any pod starts (SPIRE's best case: one node
//! alias for every agent of the cluster, and one entry per namespace and service account the
//! bench uses), or by spire-controller-manager, one per pod, from a ClusterSPIFFEID per namespace
//! (the way SPIRE's Helm chart runs it: harness/peers/spire/deploy/kustomization.yaml).
//!
//! Two parts are the devstack's own, each forced by this machine: the CSI driver is registered
//! with the kubelet by [`athenz_csi_driver::registration`] on the host (the Go module proxy here
//! refuses node-driver-registrar), and the entries are created with the host's spire-server CLI
//! on the server's API socket, a hostPath (no `kubectl exec` needed).

use super::Layout;
use super::images::{self, ImageSpec};
use super::kubectl::Kubectl;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The manifests.
const MANIFEST: &str = include_str!("../../../peers/spire/deploy/spire.yaml");
/// The directory `kubectl kustomize` renders SPIRE with spire-controller-manager from: its
/// kustomization.yaml adds controller-manager.yaml and controller-manager-server.yaml to
/// spire.yaml.
const DEPLOY_DIR: &str = "harness/peers/spire/deploy";
/// spire-controller-manager's version (harness/peers/spire/controller-manager/go.mod) and image.
const CONTROLLER_MANAGER_VERSION: &str = "0.6.4";
const CONTROLLER_MANAGER_IMAGE: &str = "localhost/athenz-devstack/spire-controller-manager:0.6.4";
/// The custom resources spire-controller-manager watches, whose CRDs build.sh copies from its
/// module into `crds/` beside the binaries.
const CONTROLLER_MANAGER_CRDS: [&str; 3] = [
    "clusterspiffeids",
    "clusterstaticentries",
    "clusterfederatedtrustdomains",
];

/// How SPIRE's registration entries are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entries {
    /// With spire-server's CLI before the pods: one per namespace and service account.
    Cli,
    /// By spire-controller-manager beside spire-server: one per pod, from a ClusterSPIFFEID per
    /// measured namespace.
    ControllerManager,
}

/// The namespace the manifests put SPIRE in.
pub const NAMESPACE: &str = "spire";
/// SPIRE's trust domain in the manifests.
pub const TRUST_DOMAIN: &str = "example.org";
/// The cluster name k8s_psat attests agents under (the manifests' `cluster`).
const PSAT_CLUSTER: &str = "devstack";
/// The node alias every attested agent of the cluster gets (entries are parented to it).
const NODE_ALIAS: &str = "spiffe://example.org/ns/spire/node/devstack";
/// The server's API socket, on the host (the manifests' hostPath).
const SERVER_SOCKET: &str = "/run/spire/server-socket/api.sock";
/// The SPIFFE CSI driver's name, its socket as the kubelet dials it, and where the kubelet looks
/// for registration sockets.
const CSI_DRIVER: &str = "csi.spiffe.io";
const CSI_ENDPOINT: &str = "/var/lib/kubelet/plugins/csi.spiffe.io/csi.sock";
const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
/// Where a SPIRE pod's app container finds the Workload API (the CSI volume's mount).
pub const WORKLOAD_API_DIR: &str = "/spiffe-workload-api";
/// The probe image: harness/peers/spire/probe, a Workload API client (go-spiffe).
pub const PROBE_IMAGE: &str = "localhost/athenz-devstack/spire-probe:3";
/// How long SPIRE may take to come up (server ready, agent attested).
const READY_LIMIT: Duration = Duration::from_secs(180);

/// The images `entries` needs, with their binaries from harness/peers/spire/build.sh.
fn image_specs(bin: &Path, entries: Entries) -> Vec<ImageSpec> {
    let image = |name: &str, binary: &str| ImageSpec {
        name: name.to_owned(),
        files: vec![(bin.join(binary), format!("/{binary}"))],
        entrypoint: vec![format!("/{binary}")],
    };
    vec![
        image(
            "localhost/athenz-devstack/spire-server:1.13.3",
            "spire-server",
        ),
        image(
            "localhost/athenz-devstack/spire-agent:1.13.3",
            "spire-agent",
        ),
        image(
            "localhost/athenz-devstack/spiffe-csi-driver:0.2.6",
            "spiffe-csi-driver",
        ),
        image(PROBE_IMAGE, "probe"),
    ]
    .into_iter()
    .chain(
        (entries == Entries::ControllerManager)
            .then(|| image(CONTROLLER_MANAGER_IMAGE, "spire-controller-manager")),
    )
    .collect()
}

/// What the bench reports as SPIRE's configuration (`spire_config`): its version, how entries
/// are made, and every setting of the agent's k8s workload attestor as spire.yaml has it.
pub fn config(entries: Entries) -> std::collections::BTreeMap<String, String> {
    let made = match entries {
        Entries::Cli => {
            "one per namespace and service account (k8s:ns, k8s:sa), made with spire-server's \
             CLI before the pods"
        }
        Entries::ControllerManager => {
            "one per pod (k8s:pod-uid), made by spire-controller-manager in the spire-server pod \
             from a ClusterSPIFFEID per namespace (spiffe://example.org/ns/<ns>/sa/<sa>); no \
             validating webhook"
        }
    };
    let mut config = std::collections::BTreeMap::from([
        ("version".to_owned(), "1.13.3".to_owned()),
        ("spiffe_csi_driver".to_owned(), "0.2.6".to_owned()),
        ("entries".to_owned(), made.to_owned()),
    ]);
    let probe_wait = match entries {
        Entries::Cli => "a Workload API fetch, again every 20 ms until served",
        Entries::ControllerManager => {
            "go-spiffe's X509Source (its watch, retried on its default backoff: 1 s, 2 s, 3 s...)"
        }
    };
    config.insert("probe_wait".to_owned(), probe_wait.to_owned());
    if entries == Entries::ControllerManager {
        config.insert(
            "spire_controller_manager".to_owned(),
            CONTROLLER_MANAGER_VERSION.to_owned(),
        );
    }
    for (key, value) in workload_attestor_settings(MANIFEST) {
        config.insert(format!("workload_attestor_k8s.{key}"), value);
    }
    config
}

/// The `key = value` lines of the `WorkloadAttestor "k8s"` block's `plugin_data` in `manifest`.
fn workload_attestor_settings(manifest: &str) -> Vec<(String, String)> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != "WorkloadAttestor \"k8s\" {")
        .skip(2) // the block's line and `plugin_data {`
        .take_while(|l| l.trim() != "}")
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.split_once('=')?;
            Some((
                key.trim().to_owned(),
                value.trim().trim_matches('"').to_owned(),
            ))
        })
        .collect()
}

/// harness/peers/spire/build.sh's output: static binaries.
pub fn default_bin_dir() -> PathBuf {
    crate::cluster::workspace_path("target/spire/static")
}

/// SPIRE, installed on a running cluster; its CSI registration runs until this is dropped.
pub struct Spire {
    bin: PathBuf,
    entries: Entries,
    registration: tokio::task::JoinHandle<()>,
}

impl Drop for Spire {
    fn drop(&mut self) {
        self.registration.abort();
    }
}

impl Spire {
    /// Imports the images, applies the manifests (with spire-controller-manager's CRDs first,
    /// when it makes the entries), registers the CSI driver with the kubelet, and waits until
    /// the server is ready and this node's agent attested; then makes the node alias the CLI's
    /// entries are parented to.
    pub async fn install(
        layout: &Layout,
        kubectl: &Kubectl,
        bin: &Path,
        entries: Entries,
        report: &mut dyn FnMut(String),
    ) -> anyhow::Result<Self> {
        for spec in image_specs(bin, entries) {
            for (file, _) in &spec.files {
                if !file.is_file() {
                    bail!(
                        "{} is missing: build SPIRE with harness/peers/spire/build.sh",
                        file.display()
                    );
                }
            }
            let archive = images::build_once(&layout.images, &spec)?;
            images::import(layout, &archive)?;
        }
        let registration = register_csi_driver()?;
        let spire = Self {
            bin: bin.to_owned(),
            entries,
            registration,
        };
        match entries {
            Entries::Cli => {
                kubectl.apply_manifest(MANIFEST, "SPIRE's manifests")?;
            }
            Entries::ControllerManager => {
                apply_controller_manager_crds(kubectl, bin)?;
                let deploy = crate::cluster::workspace_path(DEPLOY_DIR);
                let manifests = kubectl
                    .run(&["kustomize", &deploy.to_string_lossy()])
                    .context("rendering SPIRE with spire-controller-manager")?;
                kubectl.apply_manifest(&manifests, "SPIRE's manifests with its controller")?;
            }
        }
        let started = Instant::now();
        kubectl.run(&[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            "statefulset/spire-server",
            "--timeout=180s",
        ])?;
        report(format!(
            "spire-server ready in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        loop {
            let agents = spire.server_cli(&["agent", "list"]).unwrap_or_default();
            if agents.contains("k8s_psat") {
                break;
            }
            if started.elapsed() > READY_LIMIT {
                bail!("no spire-agent attested within {READY_LIMIT:?}: {agents}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        report(format!(
            "spire-agent attested in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        if entries == Entries::ControllerManager {
            // its entries are parented to each node's agent, no alias
            return Ok(spire);
        }
        spire.server_cli(&[
            "entry",
            "create",
            "-node",
            "-spiffeID",
            NODE_ALIAS,
            "-selector",
            &format!("k8s_psat:cluster:{PSAT_CLUSTER}"),
        ])?;
        Ok(spire)
    }

    /// How its entries are made.
    pub fn entries(&self) -> Entries {
        self.entries
    }

    /// Registers the pods of service account `sa` in `ns`: an entry now, or a ClusterSPIFFEID
    /// from which spire-controller-manager makes each pod's; returns their SPIFFE ID.
    pub fn register_workload(
        &self,
        kubectl: &Kubectl,
        ns: &str,
        sa: &str,
    ) -> anyhow::Result<String> {
        let id = workload_id(ns, sa);
        if self.entries == Entries::ControllerManager {
            kubectl.apply_manifest(
                &cluster_spiffe_id(ns).to_string(),
                &format!("the ClusterSPIFFEID of {ns}"),
            )?;
            return Ok(id);
        }
        self.server_cli(&[
            "entry",
            "create",
            "-parentID",
            NODE_ALIAS,
            "-spiffeID",
            &id,
            "-selector",
            &format!("k8s:ns:{ns}"),
            "-selector",
            &format!("k8s:sa:{sa}"),
        ])?;
        Ok(id)
    }

    /// The host's spire-server CLI on the server's API socket.
    fn server_cli(&self, args: &[&str]) -> anyhow::Result<String> {
        images::run(
            Command::new(self.bin.join("spire-server"))
                .args(args)
                .args(["-socketPath", SERVER_SOCKET]),
            &format!("spire-server {}", args.join(" ")),
        )
    }
}

/// spire-controller-manager's CRDs, from build.sh's copy of its module's, established before
/// the controller starts (it waits for their informers).
fn apply_controller_manager_crds(kubectl: &Kubectl, bin: &Path) -> anyhow::Result<()> {
    for crd in CONTROLLER_MANAGER_CRDS {
        let file = bin.join(format!("crds/spire.spiffe.io_{crd}.yaml"));
        let manifest = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "reading {}: build SPIRE with harness/peers/spire/build.sh",
                file.display()
            )
        })?;
        kubectl.apply_manifest(&manifest, &format!("the CRD of {crd}"))?;
    }
    let names: Vec<String> = CONTROLLER_MANAGER_CRDS
        .iter()
        .map(|crd| format!("crd/{crd}.spire.spiffe.io"))
        .collect();
    let mut args = vec!["wait", "--for", "condition=established", "--timeout=60s"];
    args.extend(names.iter().map(String::as_str));
    kubectl.run(&args)?;
    Ok(())
}

/// The ClusterSPIFFEID for the pods of namespace `ns`: the template of SPIRE's Helm chart's
/// default (namespace and service account), selecting that namespace alone.
fn cluster_spiffe_id(ns: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {"name": format!("bench-{ns}")},
        "spec": {
            "spiffeIDTemplate": format!(
                "spiffe://{{{{ .TrustDomain }}}}/ns/{{{{ .PodMeta.Namespace }}}}/sa/{{{{ .PodSpec.ServiceAccountName }}}}"
            ),
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        },
    })
}

/// The SPIFFE ID of service account `sa` in `ns` (SPIRE's Kubernetes convention).
pub fn workload_id(ns: &str, sa: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/{sa}")
}

/// What a SPIRE pod's app container is: the probe, asking for `id` on the CSI volume's socket
/// and waiting for it as a workload would where `entries` are made: fetching again every 20 ms
/// for entries made before the pods, as go-spiffe's X509Source (its backoff) for entries made
/// per pod after it starts (harness/peers/spire/probe says why).
pub fn probe_container(id: &str, entries: Entries) -> serde_json::Value {
    let wait = match entries {
        Entries::Cli => "fetch",
        Entries::ControllerManager => "source",
    };
    serde_json::json!({
        "name": "app",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "args": [format!("unix://{WORKLOAD_API_DIR}/spire-agent.sock"), id, wait],
        "volumeMounts": [{"name": "spiffe-workload-api", "mountPath": WORKLOAD_API_DIR, "readOnly": true}],
    })
}

/// The pod's volume for [`probe_container`].
pub fn workload_api_volume() -> serde_json::Value {
    serde_json::json!({"name": "spiffe-workload-api", "csi": {"driver": CSI_DRIVER, "readOnly": true}})
}

/// Serves the kubelet's plugin registration for the SPIFFE CSI driver, on the host.
fn register_csi_driver() -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let dir = Path::new(PLUGINS_REGISTRY);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let listener = athenz_csi_driver::registration::bind(dir, CSI_DRIVER)
        .with_context(|| format!("the {CSI_DRIVER} registration socket in {}", dir.display()))?;
    let registration = athenz_csi_driver::registration::PluginRegistration::of_driver(
        CSI_DRIVER.to_owned(),
        CSI_ENDPOINT.to_owned(),
        prometheus_client::metrics::gauge::Gauge::default(),
    );
    Ok(tokio::spawn(athenz_csi_driver::registration::serve(
        listener,
        registration,
        std::future::pending(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifests and the code that drives them name the same things.
    #[test]
    fn the_manifests_agree_with_the_bench() {
        for needle in [
            format!("trust_domain = \"{TRUST_DOMAIN}\""),
            format!("\"{PSAT_CLUSTER}\" = {{"),
            format!("cluster = \"{PSAT_CLUSTER}\""),
            format!("socket_path = \"{SERVER_SOCKET}\""),
            format!("metadata: {{name: {CSI_DRIVER}}}"),
            format!("- {CSI_DRIVER}"),
            "path: /var/lib/kubelet/plugins/csi.spiffe.io,".to_owned(),
            "socket_path = \"/run/spire/agent-sockets/spire-agent.sock\"".to_owned(),
        ] {
            assert!(MANIFEST.contains(&needle), "spire.yaml lacks {needle}");
        }
        assert!(CSI_ENDPOINT.starts_with("/var/lib/kubelet/plugins/csi.spiffe.io/"));
        for spec in image_specs(Path::new("/bin"), Entries::ControllerManager) {
            assert!(
                MANIFEST.contains(&format!("image: {}", spec.name))
                    || CONTROLLER_MANAGER_SERVER.contains(&format!("image: {}", spec.name))
                    || spec.name == PROBE_IMAGE,
                "{} is not in the manifests",
                spec.name
            );
        }
        assert!(
            !image_specs(Path::new("/bin"), Entries::Cli)
                .iter()
                .any(|spec| spec.name == CONTROLLER_MANAGER_IMAGE)
        );
    }

    const CONTROLLER_MANAGER: &str =
        include_str!("../../../peers/spire/deploy/controller-manager.yaml");
    const CONTROLLER_MANAGER_SERVER: &str =
        include_str!("../../../peers/spire/deploy/controller-manager-server.yaml");
    const KUSTOMIZATION: &str = include_str!("../../../peers/spire/deploy/kustomization.yaml");

    /// spire-controller-manager's config names spire.yaml's cluster, trust domain and server
    /// socket (as mounted in its container), and keeps the entries it did not make.
    #[test]
    fn the_controller_manager_agrees_with_the_server() {
        for needle in [
            format!("clusterName: {PSAT_CLUSTER}"),
            format!("trustDomain: {TRUST_DOMAIN}"),
            "spireServerSocketPath: /spire-server/api.sock".to_owned(),
            "entryIDPrefix: ".to_owned(),
        ] {
            assert!(
                CONTROLLER_MANAGER.contains(&needle),
                "controller-manager.yaml lacks {needle}"
            );
        }
        let server_socket_dir = Path::new(SERVER_SOCKET).parent().unwrap();
        assert!(MANIFEST.contains(&format!(
            "{{name: server-socket, mountPath: {}}}",
            server_socket_dir.display()
        )));
        assert!(
            CONTROLLER_MANAGER_SERVER
                .contains("{name: server-socket, mountPath: /spire-server, readOnly: true}")
        );
        assert!(CONTROLLER_MANAGER_IMAGE.ends_with(CONTROLLER_MANAGER_VERSION));
        assert!(KUSTOMIZATION.contains("resources: [spire.yaml, controller-manager.yaml]"));
        // its ignoreNamespaces are unanchored regular expressions: each must match one name
        let ignored = CONTROLLER_MANAGER
            .lines()
            .find_map(|l| l.trim().strip_prefix("ignoreNamespaces: "))
            .expect("controller-manager.yaml sets ignoreNamespaces");
        let ignored: Vec<String> = serde_json::from_str(ignored).unwrap();
        assert!(ignored.contains(&format!("^{NAMESPACE}$")), "{ignored:?}");
        for pattern in &ignored {
            assert!(
                pattern.starts_with('^') && pattern.ends_with('$'),
                "{pattern} would ignore every namespace containing it, the bench's too"
            );
        }
        assert!(KUSTOMIZATION.contains("- path: controller-manager-server.yaml"));
        let id = cluster_spiffe_id("bench-spire");
        assert_eq!(
            id["spec"]["spiffeIDTemplate"],
            "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}"
        );
        assert_eq!(
            id["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "bench-spire"
        );
        assert_eq!(
            config(Entries::ControllerManager)["spire_controller_manager"],
            CONTROLLER_MANAGER_VERSION
        );
        assert!(!config(Entries::Cli).contains_key("spire_controller_manager"));
    }

    #[test]
    fn the_reported_config_is_the_manifests() {
        let config = config(Entries::Cli);
        assert_eq!(
            config["workload_attestor_k8s.disable_container_selectors"],
            "true"
        );
        assert_eq!(
            config["workload_attestor_k8s.skip_kubelet_verification"],
            "false"
        );
        assert_eq!(
            config["workload_attestor_k8s.node_name_env"],
            "MY_NODE_NAME"
        );
        let block = "WorkloadAttestor \"k8s\" {\n  plugin_data {\n    a = 1\n    # note = not a setting\n  }\n}\nx = 2";
        assert_eq!(
            workload_attestor_settings(block),
            [("a".to_owned(), "1".to_owned())]
        );
        assert!(workload_attestor_settings("nothing").is_empty());
    }

    #[test]
    fn a_workload_is_named_by_namespace_and_service_account() {
        assert_eq!(
            workload_id("bench-spire", "probe"),
            "spiffe://example.org/ns/bench-spire/sa/probe"
        );
        let container = probe_container(&workload_id("a", "b"), Entries::Cli);
        assert_eq!(
            container["args"],
            serde_json::json!([
                "unix:///spiffe-workload-api/spire-agent.sock",
                "spiffe://example.org/ns/a/sa/b",
                "fetch"
            ])
        );
        let per_pod = probe_container(&workload_id("a", "b"), Entries::ControllerManager);
        assert_eq!(per_pod["args"][2], "source");
        assert_eq!(workload_api_volume()["csi"]["driver"], CSI_DRIVER);
    }
}
