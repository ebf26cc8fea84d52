//! The Helm chart (`deploy/helm/athenz-k8s-identity`) renders, with its default values and the
//! two it requires (the ZTS URL and CA), exactly the objects `kubectl kustomize deploy/` does with
//! those two settings, its values change what they say and nothing else, and it refuses an
//! install that could not work, naming the value. Rendered by the Helm CLI that `harness/real-node/kube/build.sh` builds from Helm's own module
//! (`harness/real-node/helm`); a missing binary fails the test naming the command that builds it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "helm_chart/egress.rs"]
mod egress;
#[path = "helm_chart/keys.rs"]
mod keys;
mod kustomize;
#[path = "helm_chart/refusals.rs"]
mod refusals;
#[path = "helm_chart/render.rs"]
mod render;
#[path = "helm_chart/values.rs"]
mod values;

use kustomize::{deploy_dir, key};
use render::{
    INSTALL_CA, INSTALL_ZTS_URL, as_base, camel, copy_dir, helm, helm_template,
    helm_template_error, run_helm_template,
};

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

/// The components whose switch in the chart is a value it has for that (one switch per
/// installer; deploy/helm/generate's COMPONENT_VALUES): the component, that value.
const SWITCHED_BY_A_VALUE: [(&str, &str); 1] = [("no-early-issue", "agent.earlyIssue=false")];

/// Every component of the kustomize tree, switched on in the chart, renders exactly what
/// kustomize renders with that component over the base: the chart has all of them, and each
/// does the same thing through either installer. The network policies' addresses are the
/// component's placeholders given as the chart's values (the chart has no placeholder: it
/// refuses the lists empty).
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
        let mut values = match SWITCHED_BY_A_VALUE.iter().find(|(c, _)| c == name) {
            Some((_, value)) => vec![(*value).to_owned()],
            None => vec![format!("components.{}=true", camel(name))],
        };
        if let Some(policy) = expected.get(&key("NetworkPolicy", "k8s-admin", "athenz-egress")) {
            for (rule, list) in [(1, "ztsCidrs"), (2, "apiServerCidrs")] {
                let to = &policy["spec"]["egress"][rule]["to"];
                assert_eq!(to.as_array().map(Vec::len), Some(1), "{name}: {policy}");
                let cidr = to[0]["ipBlock"]["cidr"].as_str().unwrap();
                values.push(format!("networkPolicies.{list}={{{cidr}}}"));
            }
        }
        let args: Vec<&str> = values.iter().flat_map(|v| ["--set", v.as_str()]).collect();
        let chart = as_base(helm_template(&args));
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
