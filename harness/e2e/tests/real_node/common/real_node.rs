//! What the real-node tests check beyond the scenario: the API server's audit log against our
//! RBAC, each daemon's metrics against docs/operating.md, what an uninstall leaves, and the
//! previous release to upgrade from.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_devstack::cluster::info::NodeInfo;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use athenz_devstack::cluster::kubectl::Kubectl;
use athenz_devstack::cluster::runbook;
use std::path::Path;

/// The audit log's events (JSON lines).
pub fn audit_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `verb resource[/subresource]` of an audit event.
pub fn access(event: &serde_json::Value) -> String {
    let object = &event["objectRef"];
    let mut resource = object["resource"].as_str().unwrap_or("").to_owned();
    if let Some(sub) = object["subresource"].as_str() {
        resource = format!("{resource}/{sub}");
    }
    format!("{} {resource}", event["verb"].as_str().unwrap_or(""))
}

/// `verb resource` for every verb and resource the ClusterRole `name` grants.
pub fn granted(
    kubectl: &athenz_devstack::cluster::kubectl::Kubectl,
    name: &str,
) -> std::collections::BTreeSet<String> {
    let role = kubectl.get_json(&["clusterrole", name]).unwrap();
    let mut out = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for resource in rule["resources"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                out.insert(format!(
                    "{} {}",
                    verb.as_str().unwrap(),
                    resource.as_str().unwrap()
                ));
            }
        }
    }
    out
}

/// Scrapes each daemon's `/metrics` through the API server's pod proxy and holds the names to
/// docs/operating.md's tables: a name served but not documented fails, and so does one
/// documented but not served, unless it is a labelled family (served from its first sample).
pub fn check_metrics_reference(kubectl: &Kubectl) {
    let reference = runbook::metrics_reference(runbook::OPERATING);
    let labelled = runbook::labelled_metrics(runbook::OPERATING);
    let daemons = [
        (
            "athenz-identity-agent",
            NODE_NAMESPACE,
            "athenz-agent",
            9190,
        ),
        (
            "athenz-callback",
            CONTROL_NAMESPACE,
            "athenz-callback",
            9090,
        ),
        (
            "athenz-jwt-service",
            CONTROL_NAMESPACE,
            "athenz-jwt-service",
            9090,
        ),
        (
            "athenz-initializer",
            CONTROL_NAMESPACE,
            "athenz-initializer",
            9090,
        ),
        // the callback pod's control-sia sidecar (the three pods' sidecars serve the same)
        (
            "athenz-control-sia",
            CONTROL_NAMESPACE,
            "athenz-callback",
            9091,
        ),
    ];
    assert_eq!(reference.len(), daemons.len());
    for (daemon, ns, app, port) in daemons {
        let exposition = metrics_expositions(kubectl, ns, app, port)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no {app} pod in {ns}"));
        let served = runbook::served_metrics(&exposition);
        let undocumented: Vec<_> = served.difference(&reference[daemon]).collect();
        assert!(
            undocumented.is_empty(),
            "{daemon} serves what docs/operating.md does not list: {undocumented:?}"
        );
        let missing: Vec<_> = reference[daemon]
            .difference(&served)
            .filter(|name| !labelled.contains(*name))
            .collect();
        assert!(
            missing.is_empty(),
            "{daemon} does not serve what docs/operating.md lists: {missing:?}"
        );
        eprintln!(
            "{daemon}: {} metrics served, all documented; not yet sampled: {:?}",
            served.len(),
            reference[daemon].difference(&served).collect::<Vec<_>>()
        );
    }
}

/// The `/metrics` exposition of each pod of `app` in `ns`, scraped on `port` through the API
/// server's pod proxy.
fn metrics_expositions(kubectl: &Kubectl, ns: &str, app: &str, port: u16) -> Vec<String> {
    let pods = kubectl
        .run(&[
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/name={app}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .unwrap();
    pods.split_whitespace()
        .map(|pod| {
            kubectl
                .run(&[
                    "get",
                    "--raw",
                    &format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics"),
                ])
                .unwrap()
        })
        .collect()
}

/// Each callback replica's metrics exposition.
fn callback_expositions(kubectl: &Kubectl) -> Vec<String> {
    metrics_expositions(kubectl, CONTROL_NAMESPACE, "athenz-callback", 9090)
}

/// The counter `metric` with the one label `label`, summed over `expositions` by its value.
fn counter_by_label(
    expositions: &[String],
    metric: &str,
    label: &str,
) -> std::collections::BTreeMap<String, u64> {
    let prefix = format!("{metric}{{{label}=\"");
    let mut counts = std::collections::BTreeMap::new();
    for exposition in expositions {
        for line in exposition.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let (value_of_label, count) = rest.split_once("\"} ").unwrap();
            *counts.entry(value_of_label.to_owned()).or_default() +=
                count.trim().parse::<u64>().unwrap();
        }
    }
    counts
}

/// The callback replicas' `athenz_callback_pod_reads_total`, summed by `source` (`cache`, `api`).
pub fn callback_pod_reads(kubectl: &Kubectl) -> std::collections::BTreeMap<String, u64> {
    counter_by_label(
        &callback_expositions(kubectl),
        "athenz_callback_pod_reads_total",
        "source",
    )
}

/// The agents' `athenz_agent_csi_early_issues_total`, summed by `outcome` (`taken`, `failed`,
/// `expired`, `dropped`).
pub fn agent_early_issues(kubectl: &Kubectl) -> std::collections::BTreeMap<String, u64> {
    counter_by_label(
        &metrics_expositions(kubectl, NODE_NAMESPACE, "athenz-agent", 9190),
        "athenz_agent_csi_early_issues_total",
        "outcome",
    )
}

/// Each callback replica's `athenz_callback_pod_cache_pods`: the pods its cache holds.
pub fn callback_pod_cache_sizes(kubectl: &Kubectl) -> Vec<u64> {
    callback_expositions(kubectl)
        .iter()
        .map(|exposition| {
            let line = exposition
                .lines()
                .find_map(|line| line.strip_prefix("athenz_callback_pod_cache_pods "))
                .unwrap_or_else(|| panic!("no athenz_callback_pod_cache_pods in {exposition}"));
            line.trim().parse().unwrap()
        })
        .collect()
}

/// The webhook's caBundle, which must be set.
pub fn webhook_ca_bundle(kubectl: &Kubectl) -> String {
    let hook = kubectl
        .get_json(&["mutatingwebhookconfiguration", "athenz-initializer"])
        .unwrap();
    let bundle = hook["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!bundle.is_empty(), "the webhook has no caBundle: {hook}");
    bundle
}

/// Uninstalls as docs/operating.md says: the tenants' pods first (their `namespaces` deleted),
/// then the page's "Uninstall" steps for `installer` in `checkout` (the node's files on every
/// one of `nodes`); then checks that nothing is left ([`check_nothing_left`]).
pub fn uninstall_as_documented(
    kubectl: &Kubectl,
    installer: athenz_devstack::cluster::install::Installer,
    checkout: &Path,
    namespaces: &[&str],
    nodes: &[NodeInfo],
) {
    for ns in namespaces {
        kubectl
            .run(&[
                "delete",
                "namespace",
                ns,
                "--ignore-not-found",
                "--timeout=120s",
            ])
            .unwrap();
    }
    // every node holds the agent's files before, so "nothing left" after says something
    for node in nodes {
        assert!(
            !node_paths_present(node).is_empty(),
            "node {} holds none of {NODE_PATHS:?} before the uninstall",
            node.name
        );
    }
    athenz_devstack::cluster::install::run_uninstall_steps(installer, kubectl, checkout, nodes)
        .unwrap();
    check_nothing_left(kubectl, nodes);
}

/// The node paths the release writes (the state dir, the CSI socket dir and registration, the
/// flex driver).
const NODE_PATHS: [&str; 4] = [
    "/var/athenz",
    "/var/lib/kubelet/plugins/csi.athenz.io",
    "/var/lib/kubelet/plugins_registry/csi.athenz.io-reg.sock",
    "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/athenz~volume-driver",
];

/// After the documented uninstall: none of our cluster objects, and nothing on any of `nodes`
/// ([`NODE_PATHS`], no mount under `/var/athenz`), each looked at from inside the node.
pub fn check_nothing_left(kubectl: &Kubectl, nodes: &[NodeInfo]) {
    for (kind, name) in [
        ("mutatingwebhookconfiguration", "athenz-initializer"),
        ("csidriver", "csi.athenz.io"),
        ("clusterrole", "athenz-agent"),
        ("clusterrole", "athenz-callback"),
        ("clusterrole", "athenz-initializer"),
        (
            "validatingadmissionpolicy",
            "athenz-initializer-changes-only-cabundle",
        ),
        ("namespace", NODE_NAMESPACE),
        ("namespace", CONTROL_NAMESPACE),
    ] {
        let left = kubectl
            .run(&["get", kind, name, "--ignore-not-found", "-o", "name"])
            .unwrap();
        assert!(left.is_empty(), "left after uninstall: {left}");
    }
    assert!(!nodes.is_empty(), "no node to look at");
    for node in nodes {
        let left = node_paths_present(node);
        assert!(
            left.is_empty(),
            "left on node {} after uninstall: {left:?}",
            node.name
        );
    }
}

/// Which of [`NODE_PATHS`] exist on `node`, and the mounts under `/var/athenz` there, as the
/// node's root sees them.
fn node_paths_present(node: &NodeInfo) -> Vec<String> {
    let look = format!(
        "for p in {}; do [ -e \"$p\" ] && echo \"$p\"; done; \
         awk '$5 ~ \"^/var/athenz\" {{print $5}}' /proc/self/mountinfo; true",
        NODE_PATHS.join(" ")
    );
    let out = node.command("sh").args(["-c", &look]).output().unwrap();
    assert!(out.status.success(), "{}: {out:?}", node.name);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}
