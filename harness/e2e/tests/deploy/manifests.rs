//! The cluster manifests in `deploy/`: every document is the Kubernetes object it claims to be
//! (read into its k8s-openapi type with nothing left over), `kubectl kustomize deploy/` renders
//! them, and the settings that must agree across components do: the injected SIA settings with
//! the SIA's and the driver's defaults, the agent's directories with the driver's, principals with
//! allow-lists, Services with the webhook and the certificates' names, and every environment
//! variable with a setting its binary reads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Every environment variable set is one its binary reads.
mod env_vars;
/// The initializer's own CA: its empty Secret, its grant by name and the policy bounding it.
mod initializer_ca;
mod kustomize;
/// deploy/node-authorizer/: the static pod, its kubeconfig and the authorization configuration.
mod node_authorizer;
/// Privilege: namespaces by Pod Security level, and no key for the agent anywhere.
mod privilege;
/// One setting, one value, across the components that read it.
mod settings;
use kustomize::deploy_dir;

/// The image deploy/image.sh builds by default (its IMAGE_NAME, tagged with the version), which
/// every container of ours and the initializer's template must name.
static IMAGE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "ghcr.io/athenz-k8s-identity/athenz-k8s-identity:{}",
        env!("CARGO_PKG_VERSION")
    )
});

/// Every document of every YAML file under deploy/base, with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir().join("base"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        // kustomize's own configuration (where the image transformer looks), not an object
        .filter(|p| !p.ends_with("kustomize-images.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let values: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for value in values.into_iter().filter(|v| !v.is_null()) {
            docs.push((
                file.file_name().unwrap().to_string_lossy().into_owned(),
                value,
            ));
        }
    }
    docs
}

/// Reads `value` as `T` and checks that writing it back gives the same document: a field the
/// type does not know (a typo, a wrong indentation) would be dropped and fail here.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(file: &str, value: &Value) -> T {
    let object: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| {
        panic!(
            "{file}: {} is not a valid {}: {e}",
            value["metadata"]["name"], value["kind"]
        )
    });
    let back = serde_json::to_value(&object).unwrap();
    if let Some(path) = first_difference(&strip_nulls(value.clone()), &strip_nulls(back), "") {
        panic!(
            "{file}: {} {}: {path} is not a field of its type (or not of that form)",
            value["kind"], value["metadata"]["name"]
        );
    }
    object
}

/// Where two documents first differ, as a path like `/spec/template/spec/hostNetwrk`.
fn first_difference(written: &Value, read_back: &Value, path: &str) -> Option<String> {
    match (written, read_back) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .find_map(|(k, v)| match b.get(k) {
                Some(w) => first_difference(v, w, &format!("{path}/{k}")),
                None => Some(format!("{path}/{k}")),
            })
            .or_else(|| {
                b.keys()
                    .find(|k| !a.contains_key(*k))
                    .map(|k| format!("{path}/{k}"))
            }),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, &format!("{path}/{i}"))),
        (a, b) if a == b => None,
        _ => Some(path.to_owned()),
    }
}

fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

/// All the objects, typed.
#[derive(Default)]
struct Objects {
    config_maps: BTreeMap<String, ConfigMap>,
    deployments: BTreeMap<String, Deployment>,
    daemon_sets: BTreeMap<String, DaemonSet>,
    services: BTreeMap<String, Service>,
    cluster_roles: BTreeMap<String, ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    service_accounts: Vec<String>,
    pdbs: Vec<PodDisruptionBudget>,
    webhooks: Vec<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>,
    csi_drivers: Vec<k8s_openapi::api::storage::v1::CSIDriver>,
    secrets: Vec<Secret>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
}

fn objects() -> Objects {
    let mut o = Objects::default();
    for (file, doc) in documents() {
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        match doc["kind"].as_str().unwrap() {
            "Namespace" => {
                typed::<Namespace>(&file, &doc);
            }
            "ConfigMap" => {
                // the settings both namespaces read are one ConfigMap in each: they must agree
                let map: ConfigMap = typed(&file, &doc);
                if let Some(other) = o.config_maps.get(&name) {
                    assert_eq!(other.data, map.data, "{file}: the copies of {name} differ");
                    assert_ne!(other.metadata.namespace, map.metadata.namespace);
                }
                o.config_maps.insert(name, map);
            }
            "ServiceAccount" => {
                typed::<ServiceAccount>(&file, &doc);
                o.service_accounts.push(name);
            }
            "ClusterRole" => {
                o.cluster_roles.insert(name, typed(&file, &doc));
            }
            "ClusterRoleBinding" => o.bindings.push(typed(&file, &doc)),
            "DaemonSet" => {
                o.daemon_sets.insert(name, typed(&file, &doc));
            }
            "Deployment" => {
                o.deployments.insert(name, typed(&file, &doc));
            }
            "Service" => {
                o.services.insert(name, typed(&file, &doc));
            }
            "PodDisruptionBudget" => o.pdbs.push(typed(&file, &doc)),
            "MutatingWebhookConfiguration" => o.webhooks.push(typed(&file, &doc)),
            "CSIDriver" => o.csi_drivers.push(typed(&file, &doc)),
            "Secret" => o.secrets.push(typed(&file, &doc)),
            "Role" => o.roles.push(typed(&file, &doc)),
            "RoleBinding" => o.role_bindings.push(typed(&file, &doc)),
            "ValidatingAdmissionPolicy" => o.policies.push(typed(&file, &doc)),
            "ValidatingAdmissionPolicyBinding" => o.policy_bindings.push(typed(&file, &doc)),
            other => panic!("{file}: no test reads kind {other}"),
        }
    }
    o
}

#[test]
fn every_document_is_a_valid_kubernetes_object() {
    let o = objects();
    assert_eq!(o.daemon_sets.len(), 1);
    assert_eq!(o.deployments.len(), 3);
    assert_eq!(o.services.len(), 3);
    assert_eq!(o.pdbs.len(), 3);
    assert_eq!(o.webhooks.len(), 1);
    // every Deployment has a PDB selecting it and a Service in front
    for (name, deployment) in &o.deployments {
        let labels = deployment
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .clone()
            .unwrap();
        assert!(
            o.pdbs.iter().any(|p| p
                .spec
                .as_ref()
                .unwrap()
                .selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                == Some(&labels)),
            "no PDB for {name}"
        );
        assert_eq!(
            o.services[name].spec.as_ref().unwrap().selector.as_ref(),
            Some(&labels),
            "the Service {name} selects its Deployment"
        );
        let sa = deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .service_account_name
            .clone();
        assert!(o.service_accounts.contains(&sa.unwrap()));
    }
    // RBAC: the callback reads pods, services and nodes, lists and watches pods (its pod
    // cache) and reviews tokens (node agents' attestation), nothing else; the agent reads its
    // kubelet
    let callback = o.cluster_roles["athenz-callback"].rules.as_ref().unwrap();
    assert_eq!(callback.len(), 3);
    assert_eq!(callback[0].verbs, ["get"]);
    assert_eq!(
        callback[0].resources.as_ref().unwrap(),
        &["pods", "services", "nodes"]
    );
    assert_eq!(callback[1].verbs, ["list", "watch"]);
    assert_eq!(callback[1].resources.as_ref().unwrap(), &["pods"]);
    assert_eq!(
        callback[2].api_groups.as_ref().unwrap(),
        &["authentication.k8s.io"]
    );
    assert_eq!(callback[2].resources.as_ref().unwrap(), &["tokenreviews"]);
    assert_eq!(callback[2].verbs, ["create"]);
    let agent = o.cluster_roles["athenz-agent"].rules.as_ref().unwrap();
    assert_eq!(agent.len(), 2);
    // fine-grained kubelet authorization: nodes/pods, never nodes/proxy (exec through kubelets)
    assert_eq!(agent[0].resources.as_ref().unwrap(), &["nodes/pods"]);
    assert_eq!(agent[0].verbs, ["get"]);
    // the watch of the node's pending pods (CSI_EARLY_ISSUE), reading nothing else
    assert_eq!(agent[1].resources.as_ref().unwrap(), &["pods"]);
    assert_eq!(agent[1].verbs, ["list", "watch"]);
    // the agent's, the callback's and the initializer's (its webhook, by name: initializer_ca)
    assert_eq!(o.bindings.len(), 3);
    // every file is in the base's kustomization, and deploy/ installs the base
    let kustomization =
        std::fs::read_to_string(deploy_dir().join("base/kustomization.yaml")).unwrap();
    for entry in std::fs::read_dir(deploy_dir().join("base")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name == "kustomization.yaml" {
            continue;
        }
        assert!(
            kustomization.contains(&format!("  - {name}\n")),
            "{name} is not in base/kustomization.yaml"
        );
    }
    let top = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    assert!(top.contains("resources:\n  - base\n"), "{top}");
}

/// The CSI driver as kubelet needs it (docs/design.md §4.10): the CSIDriver object, the agent
/// serving the socket and registering it with kubelet itself, kubelet's dirs at kubelet's paths
/// with Bidirectional propagation where the driver mounts.
#[test]
fn the_csi_driver_is_wired_as_kubelet_expects() {
    use k8s_openapi::api::core::v1::{PodSpec, Volume};
    let o = objects();
    assert_eq!(o.csi_drivers.len(), 1);
    let driver = &o.csi_drivers[0];
    assert_eq!(driver.metadata.name.as_deref(), Some("csi.athenz.io"));
    let d = &driver.spec;
    assert_eq!(d.attach_required, Some(false));
    assert_eq!(d.pod_info_on_mount, Some(true));
    assert_eq!(
        d.volume_lifecycle_modes.as_deref(),
        Some(&["Ephemeral".to_owned()][..])
    );
    assert_eq!(d.fs_group_policy.as_deref(), Some("File"));
    assert_eq!(d.requires_republish, Some(false));

    let spec: PodSpec = o.daemon_sets["athenz-agent"]
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap();
    let host_path = |name: &str| -> String {
        let v: &Volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        v.host_path.as_ref().unwrap().path.clone()
    };
    let all = containers(&spec);
    let container = |name: &str| all.iter().find(|c| c.name == name).unwrap().clone();
    let mount_of = |c: &Container, volume: &str| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume)
            .unwrap_or_else(|| panic!("{} does not mount {volume}", c.name))
            .clone()
    };

    let agent = container("agent");
    let socket = env(&agent, "CSI_SOCKET").unwrap();
    let plugin = mount_of(&agent, "plugin-dir");
    assert_eq!(
        Path::new(&socket).parent().unwrap(),
        Path::new(&plugin.mount_path)
    );
    let host_socket = Path::new(&host_path("plugin-dir")).join("csi.sock");
    assert_eq!(
        host_socket,
        Path::new("/var/lib/kubelet/plugins/csi.athenz.io/csi.sock")
    );
    // files-mode identities are issued when their pod is bound (docs/design.md §4.10); the
    // watch's in-cluster client reads the namespace beside the token and the CA
    assert_eq!(env(&agent, "CSI_EARLY_ISSUE").as_deref(), Some("true"));
    let api_access = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "kube-api-access")
        .and_then(|v| v.projected.as_ref())
        .and_then(|p| p.sources.as_ref())
        .unwrap();
    assert!(api_access.iter().any(|source| {
        source.downward_api.as_ref().is_some_and(|d| {
            d.items.iter().flatten().any(|item| {
                item.path == "namespace"
                    && item.field_ref.as_ref().map(|f| f.field_path.as_str())
                        == Some("metadata.namespace")
            })
        })
    }));
    // target paths are host paths: the agent sees kubelet's pods dir at the same path
    let pods = mount_of(&agent, "kubelet-pods");
    assert_eq!(pods.mount_path, "/var/lib/kubelet/pods");
    assert_eq!(host_path("kubelet-pods"), "/var/lib/kubelet/pods");
    for volume in ["kubelet-pods", "athenz"] {
        assert_eq!(
            mount_of(&agent, volume).mount_propagation.as_deref(),
            Some("Bidirectional"),
            "{volume}"
        );
    }
    // the volumes dir the agent mounts in is inside the Bidirectional mount
    let athenz = mount_of(&agent, "athenz").mount_path;
    assert!(
        env(&agent, "ATHENZ_VOLUMES_DIR")
            .unwrap()
            .starts_with(&athenz)
    );
    assert_eq!(
        agent.security_context.as_ref().unwrap().privileged,
        Some(true),
        "Kubernetes allows Bidirectional propagation to privileged containers only"
    );

    // the agent registers the socket with kubelet itself: the registration dir is kubelet's
    // plugins_registry, and the endpoint it names is the socket's path on the host
    assert_eq!(
        host_path("registration-dir"),
        "/var/lib/kubelet/plugins_registry"
    );
    assert_eq!(
        env(&agent, "CSI_REGISTRATION_DIR").unwrap(),
        mount_of(&agent, "registration-dir").mount_path
    );
    assert_eq!(
        Path::new(&env(&agent, "CSI_KUBELET_SOCKET").unwrap()),
        host_socket
    );
    // no sidecar: one image on every node
    assert_eq!(
        all.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["agent"]
    );
    // readiness is the agent's own /readyz on its ops port (the node identity is valid, as the
    // driver's Probe answers)
    let readiness = agent
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .clone()
        .unwrap();
    assert_eq!(readiness.path.as_deref(), Some("/readyz"));
    let ops_port = env(&agent, "OPS_LISTEN")
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse::<i32>()
        .unwrap();
    assert_eq!(
        readiness.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(ops_port)
    );
}

#[test]
fn kubectl_kustomize_renders_the_base() {
    let out = std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(deploy_dir())
        .output()
        .expect("kubectl is needed (.ci/run installs Debian's kubernetes-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let count = |kind: &str| rendered.iter().filter(|d| d["kind"] == kind).count();
    assert_eq!(count("DaemonSet"), 1);
    assert_eq!(count("Deployment"), 3);
    assert_eq!(count("MutatingWebhookConfiguration"), 1);
    assert_eq!(count("CSIDriver"), 1);
    assert_eq!(rendered.len(), documents().len());
    // every workload runs only on a node of the image's platforms (deploy/image.sh's index)
    for workload in rendered
        .iter()
        .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
    {
        let spec = &workload["spec"]["template"]["spec"];
        let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(
            terms,
            &serde_json::json!([{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
            ]}]),
            "{}",
            workload["metadata"]["name"]
        );
        assert_eq!(
            spec["nodeSelector"],
            serde_json::json!({"kubernetes.io/os": "linux"})
        );
    }
    // every container of ours names the image deploy/image.sh builds, tagged with the version
    let images: Vec<String> = rendered
        .iter()
        .flat_map(|d| {
            let spec = &d["spec"]["template"]["spec"];
            ["initContainers", "containers"]
                .into_iter()
                .flat_map(move |list| spec[list].as_array().cloned().unwrap_or_default())
        })
        .filter_map(|c| c["image"].as_str().map(str::to_owned))
        .filter(|image| !image.starts_with("registry.k8s.io/"))
        .collect();
    // the agent's, the jwt-service's and the callback's with their control-sia, the initializer's
    assert!(images.len() >= 8, "{images:?}");
    for image in &images {
        assert_eq!(image, &*IMAGE);
    }
    let template = rendered
        .iter()
        .find(|d| d["metadata"]["name"] == "athenz-initializer-template")
        .unwrap()["data"]["template.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    // the template names no image: the initializer injects the install's SIA_IMAGE, the same
    let template: Value = serde_saphyr::from_str(&template).unwrap();
    assert!(template["image"].is_null(), "{template}");
    let sia_image = rendered
        .iter()
        .find(|d| {
            d["metadata"]["name"] == "athenz-cluster" && d["metadata"]["namespace"] == "k8s-admin"
        })
        .unwrap()["data"]["SIA_IMAGE"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(sia_image, *IMAGE);
    let script = std::fs::read_to_string(deploy_dir().join("image.sh")).unwrap();
    let (name, _version) = IMAGE.rsplit_once(':').unwrap();
    assert!(
        script.contains(&format!("name=\"${{IMAGE_NAME:-{name}}}\"")),
        "deploy/image.sh's default name is not {name}"
    );
    assert!(script.contains(r#"tag="${IMAGE_TAG:-$version}""#));
}

fn env(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn containers(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .cloned()
        .collect()
}
