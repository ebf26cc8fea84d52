//! Rendering the chart as the tests need it: `helm template` with or without the values the
//! chart requires, its objects by [`Key`], its refusals, and the chart's rendering put back to
//! the base's placeholders for comparing with kustomize.

use super::kustomize::{Key, deploy_dir, key};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub fn helm() -> PathBuf {
    let helm = athenz_devstack::cluster::default_kube_bin().join("helm");
    assert!(
        helm.is_file(),
        "{} is missing: build it with harness/real-node/kube/build.sh (Helm from its Go module, harness/real-node/helm)",
        helm.display()
    );
    helm
}

/// The ZTS URL every rendering below installs with (the chart requires one).
pub const INSTALL_ZTS_URL: &str = "https://zts.acme.test:4443/zts/v1";
/// The base's placeholder for it, and for the CA.
pub const BASE_ZTS_URL: &str = "https://zts.athenz.example.com:4443/zts/v1";
/// `ztsUrl=` the base's placeholder.
pub const BASE_URL_VALUE: &str = "ztsUrl=https://zts.athenz.example.com:4443/zts/v1";
pub const BASE_CA: &str = "# replace with the PEM certificates of your Athenz CA\n";
/// The CA every rendering below installs with (the chart requires one).
pub const INSTALL_CA: &str = "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";

/// `helm template athenz <chart> <args>`, run, with none of the values the chart requires.
pub fn run_helm_template(args: &[&str]) -> std::process::Output {
    std::process::Command::new(helm())
        .args(["template", "athenz"])
        .arg(deploy_dir().join("helm/athenz-k8s-identity"))
        .args(args)
        .output()
        .unwrap()
}

/// [`run_helm_template`] with the values the chart requires ([`INSTALL_ZTS_URL`],
/// [`INSTALL_CA`]) first, then `args` (e.g. `--set k=v`; a later value wins).
pub fn run_helm_template_installing(args: &[&str]) -> std::process::Output {
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), INSTALL_CA).unwrap();
    let url = format!("ztsUrl={INSTALL_ZTS_URL}");
    let ca = format!("ztsCa={}", ca_file.path().display());
    let required = ["--set", url.as_str(), "--set-file", ca.as_str()];
    run_helm_template(&[&required[..], args].concat())
}

/// `helm template` of the chart installing with `args` ([`run_helm_template_installing`]),
/// parsed by [`Key`].
pub fn helm_template(args: &[&str]) -> BTreeMap<Key, Value> {
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
pub fn helm_template_error(args: &[&str]) -> String {
    helm_output_error(args, run_helm_template_installing(args))
}

/// `helm template` with `args` alone (none of the required values), which must fail: its stderr.
pub fn helm_template_error_bare(args: &[&str]) -> String {
    helm_output_error(args, run_helm_template(args))
}

pub fn helm_output_error(args: &[&str], out: std::process::Output) -> String {
    assert!(!out.status.success(), "helm template {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `chart` with the two required settings put back to the base's placeholders: the ZTS URL, the
/// CA in its ConfigMaps (nothing else: a CA change rolls no pod). Each must be there to be put
/// back.
pub fn as_base(mut chart: BTreeMap<Key, Value>) -> BTreeMap<Key, Value> {
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
            _ => {}
        }
    }
    // two of each ConfigMap, four workloads (the webhook's caBundle is never the chart's: the
    // initializer keeps its own CA there)
    assert_eq!(put_back, 4, "the ZTS URL and the CA in both namespaces");
    chart
}

pub fn camel(kebab: &str) -> String {
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

pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
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

/// The callback's pod volumes, as JSON text.
pub fn callback_volumes(chart: &BTreeMap<Key, Value>) -> String {
    chart[&key("Deployment", "k8s-admin", "athenz-callback")]["spec"]["template"]["spec"]["volumes"]
        .to_string()
}
