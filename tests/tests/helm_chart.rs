//! The Helm chart (`deploy/helm/athenz-k8s-identity`) renders, with its default values, exactly
//! the objects `kubectl kustomize deploy/` does, and its values change what they say and nothing
//! else. Rendered by the Helm CLI that `tests/kube/build.sh` builds from Helm's own module
//! (`tests/helm`); a missing binary fails the test naming the command that builds it.

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
        "{} is missing: build it with tests/kube/build.sh (Helm from its Go module, tests/helm)",
        helm.display()
    );
    helm
}

/// `helm template` of the chart with `args` (e.g. `--set k=v`), parsed by [`Key`].
fn helm_template(args: &[&str]) -> BTreeMap<Key, Value> {
    let out = std::process::Command::new(helm())
        .args(["template", "athenz"])
        .arg(deploy_dir().join("helm/athenz-k8s-identity"))
        .args(args)
        .output()
        .unwrap();
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

#[test]
fn the_defaults_render_what_kustomize_renders() {
    let chart = helm_template(&[]);
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

#[test]
fn the_values_change_what_they_name() {
    let ca = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), ca).unwrap();
    let ca_arg = format!("ztsCa={}", ca_file.path().display());
    let chart = helm_template(&[
        "--set-file",
        &ca_arg,
        "--set",
        "ztsUrl=https://zts.example:4443/zts/v1",
        "--set",
        "image.repository=registry.example/athenz",
        "--set",
        "kubeletAuthorization=nodes/proxy",
        "--set",
        "flexPluginDir=",
        "--set",
        "serviceKeys.athenz-callback=stand-in key",
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
    let agent = &chart[&key("DaemonSet", "athenz-system", "athenz-agent")];
    assert_eq!(
        agent["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/athenz:0.1.0"
    );
    let text = agent.to_string();
    assert!(
        !text.contains("flexvolume") && !text.contains("DRIVER_SOURCE"),
        "{text}"
    );
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
