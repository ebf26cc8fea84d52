//! SPIRE beside us on the real node, for `cluster bench --systems athenz,spire`: the platform
//! teams' usual alternative, deployed as SPIRE's Kubernetes quickstart deploys it
//! (harness/peers/spire/deploy/spire.yaml: spire-server with SQLite and k8s_psat node attestation,
//! spire-agent as a DaemonSet with the k8s workload attestor against the real kubelet, the SPIFFE
//! CSI driver), from images built here of SPIRE's and spiffe-csi's published Go modules
//! (harness/peers/spire/build.sh). Registration entries are made before any pod starts (SPIRE's best
//! case): one node alias for every agent of the cluster, and one entry per namespace and
//! service account the bench uses.
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
pub const PROBE_IMAGE: &str = "localhost/athenz-devstack/spire-probe:2";
/// How long SPIRE may take to come up (server ready, agent attested).
const READY_LIMIT: Duration = Duration::from_secs(180);

/// The images, with their binaries from harness/peers/spire/build.sh.
fn image_specs(bin: &Path) -> Vec<ImageSpec> {
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
}

/// What the bench reports as SPIRE's configuration (`spire_config`): its version, how entries
/// are made, and every setting of the agent's k8s workload attestor as spire.yaml has it.
pub fn config() -> std::collections::BTreeMap<String, String> {
    let mut config = std::collections::BTreeMap::from([
        ("version".to_owned(), "1.13.3".to_owned()),
        ("spiffe_csi_driver".to_owned(), "0.2.6".to_owned()),
        (
            "entries".to_owned(),
            "one per namespace and service account (k8s:ns, k8s:sa), made with spire-server's \
             CLI before the pods"
                .to_owned(),
        ),
    ]);
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
    registration: tokio::task::JoinHandle<()>,
}

impl Drop for Spire {
    fn drop(&mut self) {
        self.registration.abort();
    }
}

impl Spire {
    /// Imports the images, applies the manifests, registers the CSI driver with the kubelet,
    /// and waits until the server is ready and this node's agent attested; then makes the
    /// node alias.
    pub async fn install(
        layout: &Layout,
        kubectl: &Kubectl,
        bin: &Path,
        report: &mut dyn FnMut(String),
    ) -> anyhow::Result<Self> {
        for spec in image_specs(bin) {
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
            registration,
        };
        kubectl.apply_manifest(MANIFEST, "SPIRE's manifests")?;
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

    /// Registers the pods of service account `sa` in `ns`; returns their SPIFFE ID.
    pub fn register_workload(&self, ns: &str, sa: &str) -> anyhow::Result<String> {
        let id = workload_id(ns, sa);
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

/// The SPIFFE ID of service account `sa` in `ns` (SPIRE's Kubernetes convention).
pub fn workload_id(ns: &str, sa: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/{sa}")
}

/// What a SPIRE pod's app container is: the probe, asking for `id` on the CSI volume's socket.
pub fn probe_container(id: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "app",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "args": [format!("unix://{WORKLOAD_API_DIR}/spire-agent.sock"), id],
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
    let registration = athenz_csi_driver::registration::Registration::of_driver(
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
        for spec in image_specs(Path::new("/bin")) {
            assert!(
                MANIFEST.contains(&format!("image: {}", spec.name)) || spec.name == PROBE_IMAGE,
                "{} is not in the manifests",
                spec.name
            );
        }
    }

    #[test]
    fn the_reported_config_is_the_manifests() {
        let config = config();
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
        let container = probe_container(&workload_id("a", "b"));
        assert_eq!(
            container["args"],
            serde_json::json!([
                "unix:///spiffe-workload-api/spire-agent.sock",
                "spiffe://example.org/ns/a/sa/b"
            ])
        );
        assert_eq!(workload_api_volume()["csi"]["driver"], CSI_DRIVER);
    }
}
