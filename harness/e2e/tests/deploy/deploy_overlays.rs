//! What an operator's overlay and each of `deploy/components/` change in the rendered base, and
//! nothing more: `kubectl kustomize` of the base beside the same with the overlay or component,
//! compared object by object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "deploy_overlays/grants_and_egress.rs"]
mod grants_and_egress;
mod kustomize;

use kustomize::{Key, LocalOverlay, STAND_IN_ZTS_URL, deploy_dir, key};
use serde_json::Value;
use std::collections::BTreeMap;

/// The objects only in `after`, only in `before`, and in both but different.
struct Changes {
    added: Vec<Key>,
    removed: Vec<Key>,
    changed: Vec<Key>,
}

fn changes(before: &BTreeMap<Key, Value>, after: &BTreeMap<Key, Value>) -> Changes {
    Changes {
        added: after
            .keys()
            .filter(|k| !before.contains_key(*k))
            .cloned()
            .collect(),
        removed: before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .cloned()
            .collect(),
        changed: before
            .iter()
            .filter(|(k, v)| after.get(*k).is_some_and(|w| w != *v))
            .map(|(k, _)| k.clone())
            .collect(),
    }
}

/// The base rendered with `deploy/components/<name>` (in a copy of `deploy/`, as an operator's
/// overlay would list it).
fn with_component(name: &str) -> BTreeMap<Key, Value> {
    with_components(&[name], "")
}

/// The base rendered with the components `names`, in that order, and `more` (the rest of an
/// overlay's kustomization.yaml, e.g. its `patches:`).
fn with_components(names: &[&str], more: &str) -> BTreeMap<Key, Value> {
    let copy = LocalOverlay::new();
    let dir = copy.dir.path().join("deploy/overlays/with-component");
    std::fs::create_dir_all(&dir).unwrap();
    let components: Vec<String> = names
        .iter()
        .map(|name| format!("../../components/{name}"))
        .collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [../../base]\ncomponents: [{}]\n{more}",
            components.join(", ")
        ),
    )
    .unwrap();
    kustomize::kustomize(&dir)
}

fn base() -> BTreeMap<Key, Value> {
    kustomize::kustomize(&deploy_dir())
}

const AGENT: (&str, &str, &str) = ("DaemonSet", "athenz-system", "athenz-agent");

fn agent_key() -> Key {
    key(AGENT.0, AGENT.1, AGENT.2)
}

/// The agent container's environment, by name.
fn agent_env(objects: &BTreeMap<Key, Value>) -> BTreeMap<String, Value> {
    objects[&agent_key()]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_owned(), e["value"].clone()))
        .collect()
}

fn agent_volume<'a>(objects: &'a BTreeMap<Key, Value>, name: &str) -> Option<&'a Value> {
    objects[&agent_key()]["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
}

/// deploy/overlays/local changes only what an operator's overlay changes: ZTS's URL and CA in
/// both namespaces, the JWT public keys, the Secrets (added), and the webhook's CA bundle, made
/// by kustomize from the same CA file; every other object is exactly the base's.
#[test]
fn the_local_overlay_changes_only_what_an_operator_sets() {
    let local = LocalOverlay::new();
    let base = base();
    let rendered = kustomize::kustomize(&local.overlay);
    let c = changes(&base, &rendered);
    let secret = |name: &str| key("Secret", "k8s-admin", name);
    assert_eq!(
        c.added,
        [
            secret("athenz-callback-key"),
            secret("athenz-jwt-service-key"),
            secret("athenz-jwt-signing-keys"),
        ],
        "the control plane's keys alone (the initializer has none: its own CA)"
    );
    assert!(c.removed.is_empty(), "{:?}", c.removed);
    // the webhook is the base's: its caBundle is the initializer's to keep
    let webhook = key("MutatingWebhookConfiguration", "", "athenz-initializer");
    assert_eq!(rendered[&webhook], base[&webhook]);
    let mut expected_changes = Vec::new();
    for ns in ["athenz-system", "k8s-admin"] {
        expected_changes.push(key("ConfigMap", ns, "athenz-cluster"));
        expected_changes.push(key("ConfigMap", ns, "athenz-zts-ca"));
    }
    expected_changes.push(key("ConfigMap", "k8s-admin", "athenz-jwt-public-keys"));
    expected_changes.sort();
    assert_eq!(c.changed, expected_changes);
    for ns in ["athenz-system", "k8s-admin"] {
        let cluster = &rendered[&key("ConfigMap", ns, "athenz-cluster")];
        assert_eq!(cluster["data"]["ZTS_URL"], STAND_IN_ZTS_URL);
        let mut theirs = base[&key("ConfigMap", ns, "athenz-cluster")].clone();
        theirs["data"]["ZTS_URL"] = cluster["data"]["ZTS_URL"].clone();
        assert_eq!(cluster, &theirs, "only ZTS_URL changes in {ns}");
        let ca = &rendered[&key("ConfigMap", ns, "athenz-zts-ca")];
        assert_eq!(ca["data"]["ca.pem"], local.ca.as_str());
    }
}

/// `kustomize edit set image` (README, docs/operating.md) in an overlay changes every image of
/// ours, the one the initializer injects included (SIA_IMAGE, through the base's image
/// configuration), and the initializer started with that setting injects it.
#[test]
fn kustomize_edit_set_image_reaches_the_injected_containers() {
    let kustomize_bin = athenz_devstack::cluster::default_kube_bin().join("kustomize");
    assert!(
        kustomize_bin.is_file(),
        "{} is missing: build it with harness/real-node/kube/build.sh (harness/real-node/kustomize)",
        kustomize_bin.display()
    );
    let local = LocalOverlay::new();
    let digest = format!("sha256:{}", "0f".repeat(32));
    let image = format!("registry.example/athenz/identity@{digest}");
    let status = std::process::Command::new(&kustomize_bin)
        .args(["edit", "set", "image"])
        .arg(format!(
            "ghcr.io/athenz-k8s-identity/athenz-k8s-identity=registry.example/athenz/identity@{digest}"
        ))
        .current_dir(&local.overlay)
        .status()
        .unwrap();
    assert!(status.success());
    let rendered = kustomize::kustomize(&local.overlay);
    let mut images = std::collections::BTreeSet::new();
    for object in rendered.values() {
        let spec = &object["spec"]["template"]["spec"];
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                images.insert(c["image"].as_str().unwrap().to_owned());
            }
        }
    }
    assert_eq!(images, [image.clone()].into(), "every workload's image");
    let settings = &rendered[&key("ConfigMap", "k8s-admin", "athenz-cluster")]["data"];
    assert_eq!(settings["SIA_IMAGE"], image.as_str());
    // the initializer, given that ConfigMap as its environment, injects that image
    let template_text = rendered[&key("ConfigMap", "k8s-admin", "athenz-initializer-template")]
        ["data"]["template.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &template_text).unwrap();
    let install = athenz_initializer::template::InstallSettings {
        sia_image: settings["SIA_IMAGE"].as_str().map(str::to_owned),
        zts_url: settings["ZTS_URL"].as_str().map(str::to_owned),
    };
    let template =
        athenz_initializer::template::Template::from_file(file.path(), &install).unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "media-sports"},
        "spec": {"containers": [{"name": "app", "image": "app"}]}
    }))
    .unwrap();
    let injected = athenz_initializer::mutate::inject(&template, &pod).unwrap();
    let inits = injected.spec.unwrap().init_containers.unwrap();
    assert_eq!(
        inits.len(),
        2,
        "the SIA's init container and native sidecar"
    );
    for c in &inits {
        assert_eq!(c.image.as_deref(), Some(image.as_str()), "{}", c.name);
        let zts = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "ZTS_URL")
            .unwrap();
        assert_eq!(zts.value.as_deref(), Some(kustomize::STAND_IN_ZTS_URL));
    }
    // the base's default: csi-socket, admitted by Pod Security restricted
    assert!(injected_volume_is_csi(&pod, &template));
}

fn injected_volume_is_csi(
    pod: &k8s_openapi::api::core::v1::Pod,
    template: &athenz_initializer::template::Template,
) -> bool {
    let injected = athenz_initializer::mutate::inject(template, pod).unwrap();
    injected
        .spec
        .unwrap()
        .volumes
        .unwrap()
        .iter()
        .any(|v| v.name == "athenz-identity" && v.csi.is_some() && v.flex_volume.is_none())
}

/// The base never says `caBundle`, so applying the base again (an upgrade) keeps the bundle an
/// overlay or an operator set: `kubectl apply` only removes fields it applied before.
#[test]
fn the_base_leaves_the_webhook_ca_bundle_alone() {
    let base = base();
    let hook = &base[&key("MutatingWebhookConfiguration", "", "athenz-initializer")];
    assert!(
        hook["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none(),
        "{hook}"
    );
}

#[test]
fn legacy_kubelet_authz_grants_nodes_proxy_instead_of_nodes_pods() {
    let base = base();
    let rendered = with_component("legacy-kubelet-authz");
    let c = changes(&base, &rendered);
    let role = key("ClusterRole", "", "athenz-agent");
    assert_eq!(c.changed, std::slice::from_ref(&role));
    assert!(c.added.is_empty() && c.removed.is_empty());
    let watch =
        serde_json::json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]});
    assert_eq!(
        base[&role]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]}, watch])
    );
    assert_eq!(
        rendered[&role]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}, watch])
    );
}

#[test]
fn domain_annotations_let_the_agent_and_the_callback_get_namespaces_and_nothing_else() {
    let base = base();
    let rendered = with_component("domain-annotations");
    let c = changes(&base, &rendered);
    let agent = key("ClusterRole", "", "athenz-agent");
    let callback = key("ClusterRole", "", "athenz-callback");
    assert_eq!(c.changed, [agent.clone(), callback.clone()]);
    assert!(c.added.is_empty() && c.removed.is_empty());
    let get_namespaces =
        serde_json::json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]});
    for role in [agent, callback] {
        let before = base[&role]["rules"].as_array().unwrap();
        let after = rendered[&role]["rules"].as_array().unwrap();
        assert_eq!(
            &after[..before.len()],
            &before[..],
            "{role:?}: the base's rules stay"
        );
        assert_eq!(
            &after[before.len()..],
            std::slice::from_ref(&get_namespaces),
            "{role:?}"
        );
    }
}

#[test]
fn csi_only_mounts_no_flex_dir_and_injects_csi_files() {
    let base = base();
    let rendered = with_component("csi-only");
    let c = changes(&base, &rendered);
    let template = key("ConfigMap", "k8s-admin", "athenz-initializer-template");
    assert_eq!(c.changed, [template.clone(), agent_key()]);
    assert!(c.added.is_empty() && c.removed.is_empty());
    assert!(agent_volume(&base, "flexvolume").is_some());
    assert!(agent_volume(&rendered, "flexvolume").is_none());
    let env = agent_env(&rendered);
    assert!(!env.contains_key("DRIVER_SOURCE") && !env.contains_key("FLEX_PLUGIN_DIR"));
    let mounts =
        &rendered[&agent_key()]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    assert!(!mounts.to_string().contains("/flexvolume"), "{mounts}");
    // the CSI socket and everything else of the agent stay
    assert_eq!(env["CSI_SOCKET"], "/csi/csi.sock");
    let text = rendered[&template]["data"]["template.yaml"]
        .as_str()
        .unwrap();
    let parsed = athenz_initializer::template::Template::from_yaml(text).unwrap();
    assert_eq!(
        parsed.volume,
        athenz_core::volume_mode::VolumeMode::CsiFiles
    );
}

#[test]
fn gke_moves_the_flex_dir_and_admits_the_critical_priority_classes() {
    let base = base();
    let rendered = with_component("gke");
    let c = changes(&base, &rendered);
    assert_eq!(c.changed, [agent_key()]);
    assert_eq!(
        c.added,
        [
            key("ResourceQuota", "athenz-system", "athenz-critical-pods"),
            key("ResourceQuota", "k8s-admin", "athenz-critical-pods"),
        ]
    );
    assert_eq!(
        agent_volume(&rendered, "flexvolume").unwrap()["hostPath"]["path"],
        "/home/kubernetes/flexvolume"
    );
    // each quota names the priority class its namespace's pods use
    for (ns, class) in [
        ("athenz-system", "system-node-critical"),
        ("k8s-admin", "system-cluster-critical"),
    ] {
        let quota = &rendered[&key("ResourceQuota", ns, "athenz-critical-pods")];
        assert_eq!(
            quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"],
            serde_json::json!([class])
        );
        let used: Vec<_> = rendered
            .iter()
            .filter(|(k, _)| k.1 == ns && ["Deployment", "DaemonSet"].contains(&k.0.as_str()))
            .map(|(_, v)| v["spec"]["template"]["spec"]["priorityClassName"].clone())
            .collect();
        assert!(
            !used.is_empty() && used.iter().all(|c| c == class),
            "{ns}: {used:?}"
        );
    }
}

#[test]
fn openshift_moves_the_flex_dir_and_leaves_uids_to_the_namespace() {
    let base = base();
    let rendered = with_component("openshift");
    let c = changes(&base, &rendered);
    assert_eq!(
        c.added,
        [key(
            "RoleBinding",
            "athenz-system",
            "athenz-agent-scc-privileged"
        )]
    );
    assert_eq!(
        c.changed.len(),
        4,
        "the agent and the three Deployments: {:?}",
        c.changed
    );
    assert_eq!(
        agent_volume(&rendered, "flexvolume").unwrap()["hostPath"]["path"],
        "/etc/kubernetes/kubelet-plugins/volume/exec"
    );
    for name in [
        "athenz-callback",
        "athenz-initializer",
        "athenz-jwt-service",
    ] {
        let pod = &rendered[&key("Deployment", "k8s-admin", name)]["spec"]["template"]["spec"];
        let text = pod.to_string();
        assert!(
            !text.contains("runAsUser") && !text.contains("fsGroup"),
            "{name}: {text}"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
    }
}

#[test]
fn kubelet_ca_points_the_agent_at_its_own_ca() {
    let base = base();
    let rendered = with_component("kubelet-ca");
    let c = changes(&base, &rendered);
    assert_eq!(c.changed, [agent_key()]);
    assert_eq!(
        agent_env(&base)["KUBELET_CA_FILE"],
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    );
    assert_eq!(
        agent_env(&rendered)["KUBELET_CA_FILE"],
        "/etc/athenz/kubelet-ca/ca.pem"
    );
    assert_eq!(
        agent_volume(&rendered, "kubelet-ca").unwrap()["configMap"]["name"],
        "athenz-kubelet-ca"
    );
}

/// With brackets, the node's address makes a URL and a socket address the agent can read
/// (its settings are a `url` and a `SocketAddr`).
#[test]
fn ipv6_brackets_the_node_address() {
    let base = base();
    let rendered = with_component("ipv6");
    let c = changes(&base, &rendered);
    assert_eq!(c.changed, [agent_key()]);
    let env = agent_env(&rendered);
    let node_ip = "fd00:10:244::7";
    let url = env["KUBELET_URL"]
        .as_str()
        .unwrap()
        .replace("$(NODE_IP)", node_ip);
    let parsed = reqwest::Url::parse(&url).unwrap();
    assert_eq!(parsed.host_str(), Some("[fd00:10:244::7]"));
    assert_eq!(parsed.port(), Some(10250));
    let ops = env["OPS_LISTEN"]
        .as_str()
        .unwrap()
        .replace("$(NODE_IP)", node_ip);
    let addr: std::net::SocketAddr = ops.parse().unwrap();
    assert_eq!(addr.port(), 9190);
    // the base's unbracketed form is what breaks on such a node
    let unbracketed = agent_env(&base)["OPS_LISTEN"]
        .as_str()
        .unwrap()
        .replace("$(NODE_IP)", node_ip);
    assert!(unbracketed.parse::<std::net::SocketAddr>().is_err());
}

#[test]
fn external_zts_adds_a_pass_through_load_balancer_for_the_callback() {
    let base = base();
    let rendered = with_component("external-zts");
    let c = changes(&base, &rendered);
    let external = key("Service", "k8s-admin", "athenz-callback-external");
    assert_eq!(c.added, std::slice::from_ref(&external));
    assert!(c.changed.is_empty() && c.removed.is_empty());
    let svc = &rendered[&external];
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    let internal = &base[&key("Service", "k8s-admin", "athenz-callback")];
    assert_eq!(svc["spec"]["selector"], internal["spec"]["selector"]);
    assert_eq!(
        svc["spec"]["ports"], internal["spec"]["ports"],
        "TLS to the callback's own port"
    );
}

/// What the policies select and open is what the control plane's pods are and serve: every
/// Deployment's pods are selected by the TLS policy on their `https` port, and the scrape
/// policy opens their `ops` port; nothing else of the base changes.
#[test]
fn network_policies_select_the_control_plane_and_open_its_ports() {
    let base = base();
    let rendered = with_component("network-policies");
    let c = changes(&base, &rendered);
    let policy = |name: &str| key("NetworkPolicy", "k8s-admin", name);
    assert_eq!(
        c.added,
        [
            policy("athenz-egress"),
            policy("athenz-ops-scrape"),
            policy("athenz-servers-tls"),
            policy("default-deny"),
        ]
    );
    assert!(c.changed.is_empty() && c.removed.is_empty());
    let tls = &rendered[&policy("athenz-servers-tls")]["spec"];
    let selected = tls["podSelector"]["matchExpressions"][0]["values"]
        .as_array()
        .unwrap()
        .clone();
    let tls_port = &tls["ingress"][0]["ports"][0]["port"];
    let ops_port =
        &rendered[&policy("athenz-ops-scrape")]["spec"]["ingress"][0]["ports"][0]["port"];
    let deployments: Vec<_> = base.iter().filter(|(k, _)| k.0 == "Deployment").collect();
    assert_eq!(deployments.len(), 3);
    for (k, deployment) in deployments {
        assert_eq!(k.1, "k8s-admin");
        let pod = &deployment["spec"]["template"];
        let label = &pod["metadata"]["labels"]["app.kubernetes.io/name"];
        assert!(selected.contains(label), "{k:?} is not selected");
        let ports = &pod["spec"]["containers"][0]["ports"];
        let port = |name: &str| {
            ports
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap()["containerPort"]
                .clone()
        };
        assert_eq!(&port("https"), tls_port, "{k:?}");
        assert_eq!(&port("ops"), ops_port, "{k:?}");
    }
}

/// Every component is tested above.
#[test]
fn every_component_has_its_test() {
    let tested = [
        "csi-only",
        "domain-annotations",
        "external-zts",
        "gke",
        "ipv6",
        "kubelet-ca",
        "legacy-kubelet-authz",
        "network-policies",
        "no-early-issue",
        "openshift",
    ];
    let mut found: Vec<String> = std::fs::read_dir(deploy_dir().join("components"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, tested);
}
