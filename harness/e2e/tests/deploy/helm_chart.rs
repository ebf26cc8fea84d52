//! The Helm chart (`deploy/helm/athenz-k8s-identity`) renders, with its default values and the
//! two it requires (the ZTS URL and CA), exactly the objects `kubectl kustomize deploy/` does with
//! those two settings, its values change what they say and nothing else, and it refuses an
//! install that could not work, naming the value. Rendered by the Helm CLI that `harness/real-node/kube/build.sh` builds from Helm's own module
//! (`harness/real-node/helm`); a missing binary fails the test naming the command that builds it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kustomize;

use kustomize::{Key, deploy_dir, key};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn helm() -> PathBuf {
    let helm = athenz_devstack::cluster::default_kube_bin().join("helm");
    assert!(
        helm.is_file(),
        "{} is missing: build it with harness/real-node/kube/build.sh (Helm from its Go module, harness/real-node/helm)",
        helm.display()
    );
    helm
}

/// The ZTS URL every rendering below installs with (the chart requires one).
const INSTALL_ZTS_URL: &str = "https://zts.acme.test:4443/zts/v1";
/// The base's placeholder for it, and for the CA.
const BASE_ZTS_URL: &str = "https://zts.athenz.example.com:4443/zts/v1";
/// `ztsUrl=` the base's placeholder.
const BASE_URL_VALUE: &str = "ztsUrl=https://zts.athenz.example.com:4443/zts/v1";
const BASE_CA: &str = "# replace with the PEM certificates of your Athenz CA\n";
/// The CA every rendering below installs with (the chart requires one).
const INSTALL_CA: &str = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";

/// `helm template athenz <chart> <args>`, run, with none of the values the chart requires.
fn run_helm_template(args: &[&str]) -> std::process::Output {
    std::process::Command::new(helm())
        .args(["template", "athenz"])
        .arg(deploy_dir().join("helm/athenz-k8s-identity"))
        .args(args)
        .output()
        .unwrap()
}

/// [`run_helm_template`] with the values the chart requires ([`INSTALL_ZTS_URL`],
/// [`INSTALL_CA`]) first, then `args` (e.g. `--set k=v`; a later value wins).
fn run_helm_template_installing(args: &[&str]) -> std::process::Output {
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), INSTALL_CA).unwrap();
    let url = format!("ztsUrl={INSTALL_ZTS_URL}");
    let ca = format!("ztsCa={}", ca_file.path().display());
    let required = ["--set", url.as_str(), "--set-file", ca.as_str()];
    run_helm_template(&[&required[..], args].concat())
}

/// `helm template` of the chart installing with `args` ([`run_helm_template_installing`]),
/// parsed by [`Key`].
fn helm_template(args: &[&str]) -> BTreeMap<Key, Value> {
    let out = run_helm_template_installing(args);
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let mut objects = BTreeMap::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let k = key(
            doc["kind"].as_str().unwrap(),
            doc["metadata"]["namespace"].as_str().unwrap_or(""),
            doc["metadata"]["name"].as_str().unwrap(),
        );
        assert!(objects.insert(k.clone(), doc).is_none(), "{k:?} twice");
    }
    objects
}

/// `helm template` installing with `args` that must fail: its stderr.
fn helm_template_error(args: &[&str]) -> String {
    helm_output_error(args, run_helm_template_installing(args))
}

/// `helm template` with `args` alone (none of the required values), which must fail: its stderr.
fn helm_template_error_bare(args: &[&str]) -> String {
    helm_output_error(args, run_helm_template(args))
}

fn helm_output_error(args: &[&str], out: std::process::Output) -> String {
    assert!(!out.status.success(), "helm template {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `chart` with the two required settings put back to the base's placeholders: the ZTS URL, the
/// CA in its ConfigMaps, and what the CA adds (the webhook's caBundle, the pods' checksum
/// annotation that rolls them on a CA change). Each must be there to be put back.
fn as_base(mut chart: BTreeMap<Key, Value>) -> BTreeMap<Key, Value> {
    let mut put_back = 0;
    for (k, object) in &mut chart {
        match (k.0.as_str(), k.2.as_str()) {
            ("ConfigMap", "athenz-cluster") => {
                assert_eq!(object["data"]["ZTS_URL"], INSTALL_ZTS_URL, "{k:?}");
                object["data"]["ZTS_URL"] = BASE_ZTS_URL.into();
                put_back += 1;
            }
            ("ConfigMap", "athenz-zts-ca") => {
                assert_eq!(object["data"]["ca.pem"], INSTALL_CA, "{k:?}");
                object["data"]["ca.pem"] = BASE_CA.into();
                put_back += 1;
            }
            ("MutatingWebhookConfiguration", _) => {
                for webhook in object["webhooks"].as_array_mut().unwrap() {
                    let config = webhook["clientConfig"].as_object_mut().unwrap();
                    assert!(config.remove("caBundle").is_some(), "{k:?}: no caBundle");
                    put_back += 1;
                }
            }
            ("Deployment" | "DaemonSet", _) => {
                let metadata = object["spec"]["template"]["metadata"]
                    .as_object_mut()
                    .unwrap();
                let annotations = metadata["annotations"].as_object_mut().unwrap();
                assert!(annotations.remove("checksum/zts-ca").is_some(), "{k:?}");
                if annotations.is_empty() {
                    metadata.remove("annotations");
                }
                put_back += 1;
            }
            _ => {}
        }
    }
    // two of each ConfigMap, one webhook, four workloads
    assert!(put_back >= 9, "{put_back} settings put back");
    chart
}

#[test]
fn the_defaults_render_what_kustomize_renders() {
    let chart = as_base(helm_template(&[]));
    let base = kustomize::kustomize(&deploy_dir());
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        base.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (k, object) in &base {
        assert_eq!(
            &chart[k], object,
            "{k:?} differs between the chart and the base"
        );
    }
}

/// Every component of the kustomize tree, switched on in the chart, renders exactly what
/// kustomize renders with that component over the base: the chart has all of them, and each
/// does the same thing through either installer.
#[test]
fn each_component_renders_what_kustomize_renders_with_it() {
    let components = deploy_dir().join("components");
    let mut names: Vec<String> = std::fs::read_dir(&components)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 8, "{names:?}");
    for name in &names {
        let copy = tempfile::tempdir().unwrap();
        // kustomize refuses paths outside the kustomization's root: a copy of deploy/ instead
        let tree = copy.path().join("deploy");
        copy_dir(&deploy_dir(), &tree);
        std::fs::create_dir_all(tree.join("overlays/with")).unwrap();
        std::fs::write(
            tree.join("overlays/with/kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources: [../../base]\ncomponents: [../../components/{name}]\n"
            ),
        )
        .unwrap();
        let expected = kustomize::kustomize(&tree.join("overlays/with"));
        let value = format!("components.{}=true", camel(name));
        let chart = as_base(helm_template(&["--set", &value]));
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{name}: the same objects"
        );
        for (k, object) in &expected {
            assert_eq!(&chart[k], object, "{name}: {k:?} differs");
        }
    }
}

/// deploy/monitoring (alerts, PodMonitors), switched on in the chart, is exactly what
/// `kubectl kustomize deploy/monitoring` renders, Prometheus's own `{{ $labels.x }}` included.
#[test]
fn the_monitoring_objects_render_what_kustomize_renders() {
    let expected = kustomize::kustomize(&deploy_dir().join("monitoring"));
    assert!(expected.len() >= 7, "{:?}", expected.keys());
    let chart = helm_template(&[
        "--set",
        "monitoring.prometheusRule=true",
        "--set",
        "monitoring.podMonitors=true",
        "--set",
        "monitoring.dashboard=true",
    ]);
    for (k, object) in &expected {
        assert_eq!(chart.get(k), Some(object), "{k:?} differs");
    }
    let defaults = helm_template(&[]);
    assert!(
        expected.keys().all(|k| !defaults.contains_key(k)),
        "off by default: they need the Prometheus Operator's CRDs"
    );
}

fn camel(kebab: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in kebab.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn the_values_change_what_they_name() {
    let ca = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), ca).unwrap();
    let ca_arg = format!("ztsCa={}", ca_file.path().display());
    let digest = format!("sha256:{}", "ab".repeat(32));
    let digest_arg = format!("image.digest={digest}");
    let chart = helm_template(&[
        "--namespace",
        "k8s-admin",
        "--set-file",
        &ca_arg,
        "--set",
        "ztsUrl=https://zts.example:4443/zts/v1",
        "--set",
        "image.repository=registry.example/athenz",
        "--set",
        &digest_arg,
        "--set",
        "imagePullSecrets[0].name=pull",
        "--set",
        "kubeletAuthorization=nodes/proxy",
        "--set",
        "flexPluginDir=",
        "--set",
        "serviceKeys.athenz-callback=stand-in key",
        "--set",
        "namespaces.create=false",
        "--set",
        "agent.priorityClassName=node-high",
        "--set",
        "agent.nodeSelector.pool=identity",
        "--set",
        "callback.tolerations[0].key=dedicated",
        "--set",
        "callback.tolerations[0].operator=Exists",
        "--set",
        "jwtService.resources.limits.memory=256Mi",
        "--set",
        "initializer.extraEnv[0].name=RUST_LOG",
        "--set",
        "initializer.extraEnv[0].value=debug",
        "--set",
        "components.networkPolicies=true",
        "--set",
        "networkPolicies.ztsCidrs[0]=192.0.2.10/32",
        "--set",
        "networkPolicies.apiServerCidrs[0]=198.51.100.0/24",
    ]);
    let webhook = &chart[&key("MutatingWebhookConfiguration", "", "athenz-initializer")];
    let bundle = webhook["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap();
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(bundle)
        .unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), ca);
    for ns in ["athenz-system", "k8s-admin"] {
        assert_eq!(
            chart[&key("ConfigMap", ns, "athenz-zts-ca")]["data"]["ca.pem"],
            ca
        );
        assert_eq!(
            chart[&key("ConfigMap", ns, "athenz-cluster")]["data"]["ZTS_URL"],
            "https://zts.example:4443/zts/v1"
        );
    }
    let image = format!("registry.example/athenz@{digest}");
    // the image the initializer injects is the workloads' image
    assert_eq!(
        chart[&key("ConfigMap", "k8s-admin", "athenz-cluster")]["data"]["SIA_IMAGE"],
        image.as_str()
    );
    assert!(
        !chart.contains_key(&key("Namespace", "", "k8s-admin")),
        "namespaces.create=false"
    );
    let agent = &chart[&key("DaemonSet", "athenz-system", "athenz-agent")];
    let pod = &agent["spec"]["template"];
    assert_eq!(pod["spec"]["containers"][0]["image"], image.as_str());
    assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "pull");
    assert_eq!(pod["spec"]["priorityClassName"], "node-high");
    assert_eq!(pod["spec"]["nodeSelector"]["pool"], "identity");
    assert_eq!(pod["spec"]["nodeSelector"]["kubernetes.io/arch"], "amd64");
    assert_eq!(
        pod["metadata"]["annotations"]["checksum/zts-ca"]
            .as_str()
            .unwrap()
            .len(),
        64,
        "a CA change rolls the pods"
    );
    let text = agent.to_string();
    assert!(
        !text.contains("flexvolume") && !text.contains("DRIVER_SOURCE"),
        "{text}"
    );
    let callback = &chart[&key("Deployment", "k8s-admin", "athenz-callback")];
    assert_eq!(
        callback["spec"]["template"]["spec"]["tolerations"][0]["key"],
        "dedicated"
    );
    let jwt = &chart[&key("Deployment", "k8s-admin", "athenz-jwt-service")];
    let main = &jwt["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(main["resources"]["limits"]["memory"], "256Mi");
    assert!(
        main["resources"]["requests"].is_null(),
        "replaced, not merged"
    );
    let initializer = &chart[&key("Deployment", "k8s-admin", "athenz-initializer")];
    let env = initializer["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert_eq!(env.last().unwrap()["name"], "RUST_LOG", "appended last");
    assert_eq!(
        chart[&key("ClusterRole", "", "athenz-agent")]["rules"][0]["resources"],
        serde_json::json!(["nodes/proxy"])
    );
    let secret = &chart[&key("Secret", "k8s-admin", "athenz-callback-key")];
    assert_eq!(secret["stringData"]["service.key"], "stand-in key");
    assert!(
        !chart.contains_key(&key("Secret", "k8s-admin", "athenz-jwt-service-key")),
        "a key not given makes no Secret"
    );
    let egress = &chart[&key("NetworkPolicy", "k8s-admin", "athenz-egress")]["spec"]["egress"];
    assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "192.0.2.10/32");
    assert_eq!(egress[2]["to"][0]["ipBlock"]["cidr"], "198.51.100.0/24");
    assert!(egress[0]["to"].is_null(), "DNS stays by port");
}

/// What a platform team sets per workload and per cluster lands where it names, and an extraEnv
/// entry replaces the base's variable of the same name instead of repeating it.
#[test]
fn the_workload_and_cluster_values_change_what_they_name() {
    let chart = helm_template(&[
        "--set",
        "callback.replicas=3",
        "--set",
        "callback.minAvailable=2",
        "--set",
        "callback.podLabels.team=identity",
        "--set",
        "callback.podAnnotations.example\\.com/owner=platform",
        "--set",
        "callback.topologySpreadConstraints[0].maxSkew=1",
        "--set",
        "callback.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "--set",
        "callback.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "--set",
        "initializer.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "--set",
        "initializer.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "--set",
        "jwtService.serviceAccountAnnotations.iam\\.example/role=signer",
        "--set",
        "kubeletRootDir=/data/kubelet",
        "--set",
        "clusterDomain=corp.internal",
        "--set",
        "agent.earlyIssue=false",
        "--set",
        "agent.extraEnv[0].name=RUST_LOG",
        "--set",
        "agent.extraEnv[0].value=debug",
        "--set",
        "agent.extraEnv[1].name=CSI_SOCKET",
        "--set",
        "agent.extraEnv[1].value=/csi/other.sock",
        "--set",
        "monitoring.podMonitors=true",
        "--set",
        "monitoring.labels.release=kube-prometheus-stack",
        "--set",
        "existingSecrets.athenz-callback-key=vault-callback-key",
        "--set",
        "domainPrefix=acme.",
        "--set",
        "domainAnnotationAllow={acme.*,legacy.billing}",
        "--set",
        "components.domainAnnotations=true",
    ]);
    for ns in ["athenz-system", "k8s-admin"] {
        let settings = &chart[&key("ConfigMap", ns, "athenz-cluster")]["data"];
        assert_eq!(settings["DOMAIN_PREFIX"], "acme.");
        assert_eq!(settings["DOMAIN_SUFFIX"], "");
        assert_eq!(settings["DOMAIN_ANNOTATION_ALLOW"], "acme.*,legacy.billing");
    }
    assert!(
        chart[&key("ClusterRole", "", "athenz-callback")]["rules"]
            .to_string()
            .contains("namespaces")
    );
    let volumes = callback_volumes(&chart);
    assert!(
        volumes.contains("\"secretName\":\"vault-callback-key\""),
        "{volumes}"
    );
    let callback = &chart[&key("Deployment", "k8s-admin", "athenz-callback")];
    assert_eq!(callback["spec"]["replicas"], 3);
    let pod = &callback["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "identity");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "athenz-callback"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/owner"],
        "platform"
    );
    assert!(pod["metadata"]["annotations"]["checksum/zts-ca"].is_string());
    assert_eq!(
        pod["spec"]["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    assert!(
        pod["spec"]["affinity"]["podAntiAffinity"].is_object(),
        "the base's affinity unless given"
    );
    assert_eq!(
        chart[&key("PodDisruptionBudget", "k8s-admin", "athenz-callback")]["spec"]["minAvailable"],
        2
    );
    let initializer = &chart[&key("Deployment", "k8s-admin", "athenz-initializer")];
    let affinity = &initializer["spec"]["template"]["spec"]["affinity"];
    assert!(
        affinity["podAntiAffinity"].is_null(),
        "replaced: {affinity}"
    );
    assert!(affinity["nodeAffinity"].is_object());
    assert_eq!(
        chart[&key("ServiceAccount", "k8s-admin", "athenz-jwt-service")]["metadata"]["annotations"]
            ["iam.example/role"],
        "signer"
    );

    let agent = &chart[&key("DaemonSet", "athenz-system", "athenz-agent")];
    let spec = &agent["spec"]["template"]["spec"];
    let text = spec.to_string();
    assert!(
        text.contains("/data/kubelet/pods") && text.contains("/data/kubelet/plugins_registry"),
        "{text}"
    );
    assert!(!text.contains("/var/lib/kubelet"), "{text}");
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let value = |name: &str| -> Vec<&Value> {
        env.iter()
            .filter(|e| e["name"] == name)
            .map(|e| &e["value"])
            .collect()
    };
    assert_eq!(value("CLUSTER_DOMAIN"), [&Value::from("corp.internal")]);
    assert_eq!(value("CSI_EARLY_ISSUE"), [&Value::from("false")]);
    assert_eq!(
        value("CSI_SOCKET"),
        [&Value::from("/csi/other.sock")],
        "replaced, once"
    );
    assert_eq!(value("RUST_LOG"), [&Value::from("debug")]);
    let mut names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    let all = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all, "a name twice in the agent's env");
    // early issuance off: the agents may no longer list or watch pods
    let rules = &chart[&key("ClusterRole", "", "athenz-agent")]["rules"];
    assert!(
        !rules.to_string().contains("watch"),
        "the pods watch outlived early issuance: {rules}"
    );
    let monitor = &chart[&key("PodMonitor", "athenz-system", "athenz-agent")];
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
}

/// `helm lint --strict` passes (NOTES.txt and every template parse), and the chart's README is
/// the one `deploy/helm/generate` writes (`the_templates_are_generated_from_the_base`).
#[test]
fn the_chart_lints_clean() {
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), INSTALL_CA).unwrap();
    let out = std::process::Command::new(helm())
        .args(["lint", "--strict"])
        .arg(deploy_dir().join("helm/athenz-k8s-identity"))
        .args(["--set", &format!("ztsUrl={INSTALL_ZTS_URL}"), "--set-file"])
        .arg(format!("ztsCa={}", ca_file.path().display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let notes =
        std::fs::read_to_string(deploy_dir().join("helm/athenz-k8s-identity/templates/NOTES.txt"))
            .unwrap();
    assert!(
        notes.contains("rollout status daemonset/athenz-agent"),
        "{notes}"
    );
}

/// The callback's pod volumes, as JSON text.
fn callback_volumes(chart: &BTreeMap<Key, Value>) -> String {
    chart[&key("Deployment", "k8s-admin", "athenz-callback")]["spec"]["template"]["spec"]["volumes"]
        .to_string()
}

/// An install that could not work is refused, naming the value: the defaults alone (no ZTS URL,
/// no CA), the documentation's example URL, and names that disagree with each other.
#[test]
fn an_install_that_could_not_work_is_refused_by_name() {
    let err = helm_template_error_bare(&[]);
    assert!(err.contains("ztsUrl: give your ZTS's base URL"), "{err}");
    let url = format!("ztsUrl={INSTALL_ZTS_URL}");
    let err = helm_template_error_bare(&["--set", &url]);
    assert!(err.contains("ztsCa: give the Athenz CA bundle"), "{err}");
    let not_a_ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_a_ca.path(), "not a certificate").unwrap();
    let bad_ca = format!("ztsCa={}", not_a_ca.path().display());
    // (Helm applies --set-file after --set: this replaces the required CA)
    let err = helm_template_error(&["--set-file", &bad_ca]);
    assert!(err.contains("ztsCa: give the Athenz CA bundle"), "{err}");

    // with both given, what must agree with what
    for (args, named) in [
        (vec!["--set", BASE_URL_VALUE], "example host"),
        (
            vec!["--set", "adminDomain=acme.k8s"],
            "controlPlaneNamespace \"k8s-admin\": must be adminDomain \"acme.k8s\" with dashes for dots, \"acme-k8s\"",
        ),
        (
            vec!["--set", "provider=k8s.admin.provider"],
            "provider \"k8s.admin.provider\": must be \"k8s.admin.athenz-callback\"",
        ),
        (
            vec!["--set", "agentNamespace=k8s-admin"],
            "agentNamespace \"k8s-admin\": must differ",
        ),
        (
            vec![
                "--namespace",
                "k8s-admin",
                "--set",
                "serviceKeys.athenz-callback=a key",
                "--set",
                "existingSecrets.athenz-callback-key=mine",
            ],
            "serviceKeys.athenz-callback and existingSecrets.athenz-callback-key",
        ),
        (
            vec!["--set", "domainAnnotationAllow[0]=acme.*"],
            "domainAnnotationAllow: set components.domainAnnotations too",
        ),
    ] {
        let err = helm_template_error(&args);
        assert!(err.contains(named), "{args:?}: {err}");
    }
    // the three named together, as an operator of another admin domain sets them, install
    let other = helm_template(&[
        "--set",
        "adminDomain=acme.k8s",
        "--set",
        "controlPlaneNamespace=acme-k8s",
        "--set",
        "provider=acme.k8s.athenz-callback",
    ]);
    assert!(other.contains_key(&key("Deployment", "acme-k8s", "athenz-callback")));
}

/// Private keys as values only in a release of the control plane's namespace (Helm keeps values
/// in its release Secret there); the defaults need no key at all.
#[test]
fn keys_as_values_are_refused_outside_the_control_planes_namespace() {
    for (args, value) in [
        (
            vec!["--set", "serviceKeys.athenz-callback=a key"],
            "serviceKeys",
        ),
        (
            vec!["--set-string", "jwtSigningKeys.v1\\.pem=a key"],
            "jwtSigningKeys",
        ),
    ] {
        let err = helm_template_error(&[&["--namespace", "default"][..], &args[..]].concat());
        assert!(
            err.contains("serviceKeys / jwtSigningKeys") && err.contains("\"default\""),
            "{value}: {err}"
        );
    }
    let defaults = helm_template(&["--namespace", "default"]);
    assert!(
        !defaults.keys().any(|(kind, _, _)| kind == "Secret"),
        "no Secret, so no key, by default"
    );
}

/// values.schema.json refuses what the chart cannot use, naming it.
#[test]
fn the_schema_refuses_unknown_and_malformed_values() {
    for (args, named) in [
        (vec!["--set", "imagee.tag=1"], "imagee"),
        (vec!["--set", "image.digest=sha256:short"], "digest"),
        (vec!["--set", "ztsUrl=http://zts.example/zts/v1"], "ztsUrl"),
        (
            vec!["--set", "kubeletAuthorization=nodes/*"],
            "kubeletAuthorization",
        ),
        (vec!["--set", "components.flex=true"], "flex"),
        (vec!["--set", "agent.extraEnv[0].value=x"], "name"),
        (
            vec!["--set", "networkPolicies.ztsCidrs[0]=zts.example"],
            "ztsCidrs",
        ),
        (
            vec!["--set", "controlPlaneNamespace=K8s_Admin"],
            "controlPlaneNamespace",
        ),
    ] {
        let err = helm_template_error(&args);
        assert!(err.contains(named), "{args:?}: {err}");
    }
}

/// The grant the agent's kubelet reads need follows the cluster's version unless chosen.
#[test]
fn the_kubelet_grant_follows_the_kubernetes_version() {
    let grant = |args: &[&str]| {
        helm_template(args)[&key("ClusterRole", "", "athenz-agent")]["rules"][0]["resources"][0]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(grant(&["--kube-version", "1.33.0"]), "nodes/pods");
    assert_eq!(grant(&["--kube-version", "1.37.2"]), "nodes/pods");
    assert_eq!(grant(&["--kube-version", "1.32.4"]), "nodes/proxy");
    // before 1.32 token reviews do not name the node: the chart refuses the cluster
    // (docs/kubernetes-versions.md)
    let refused = run_helm_template(&["--kube-version", "1.31.9"]);
    assert!(!refused.status.success(), "the chart installed on 1.31");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains(">=1.32.0-0"), "{said}");
    assert_eq!(
        grant(&[
            "--kube-version",
            "1.32.4",
            "--set",
            "kubeletAuthorization=nodes/pods"
        ]),
        "nodes/pods"
    );
    assert_eq!(
        grant(&[
            "--kube-version",
            "1.37.2",
            "--set",
            "components.legacyKubeletAuthz=true"
        ]),
        "nodes/proxy"
    );
    let err = helm_template_error(&["--kube-version", "1.28.9"]);
    assert!(err.contains("kubeVersion") || err.contains("1.28"), "{err}");
}

/// The committed templates are what `deploy/helm/generate` makes of today's `deploy/base`.
#[test]
fn the_templates_are_generated_from_the_base() {
    let out = std::process::Command::new("python3")
        .arg(deploy_dir().join("helm/generate"))
        .arg("--check")
        .output()
        .expect("python3 is needed to run deploy/helm/generate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
