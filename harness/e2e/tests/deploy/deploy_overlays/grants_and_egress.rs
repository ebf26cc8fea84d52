//! The components that take grants and reach away: no-early-issue (the agents' pods watch) and
//! network-policies' egress (the control plane's, by address), each as an operator's overlay
//! lists it.

use super::kustomize::{Key, deploy_dir, key};
use super::{agent_env, agent_key, base, changes, with_component, with_components};
use serde_json::{Value, json};
use std::collections::BTreeMap;

fn agent_rules(objects: &BTreeMap<Key, Value>) -> Value {
    objects[&key("ClusterRole", "", "athenz-agent")]["rules"].clone()
}

/// no-early-issue sets CSI_EARLY_ISSUE=false on the agents and removes their `list`/`watch` on
/// pods, and nothing else; without it both are there. With legacy-kubelet-authz and
/// domain-annotations, in any order, each still changes only its own rule.
#[test]
fn no_early_issue_turns_early_issuance_off_and_drops_the_pods_watch() {
    let base = base();
    let rendered = with_component("no-early-issue");
    let c = changes(&base, &rendered);
    let role = key("ClusterRole", "", "athenz-agent");
    assert_eq!(c.changed, [role.clone(), agent_key()]);
    assert!(c.added.is_empty() && c.removed.is_empty());
    let get_pods = json!({"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]});
    let watch = json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]});
    assert_eq!(agent_rules(&base), json!([get_pods, watch]));
    assert_eq!(agent_env(&base)["CSI_EARLY_ISSUE"], "true");
    assert_eq!(agent_rules(&rendered), json!([get_pods]));
    assert_eq!(agent_env(&rendered)["CSI_EARLY_ISSUE"], "false");
    // the DaemonSet is the base's but for that one variable (the patch puts it first)
    let without_it = |objects: &BTreeMap<Key, Value>| {
        let mut agent = objects[&agent_key()].clone();
        agent["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .retain(|e| e["name"] != "CSI_EARLY_ISSUE");
        agent
    };
    assert_eq!(without_it(&rendered), without_it(&base));

    let get_proxy = json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]});
    let get_namespaces = json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]});
    for order in [
        [
            "no-early-issue",
            "legacy-kubelet-authz",
            "domain-annotations",
        ],
        [
            "legacy-kubelet-authz",
            "domain-annotations",
            "no-early-issue",
        ],
        [
            "domain-annotations",
            "no-early-issue",
            "legacy-kubelet-authz",
        ],
    ] {
        let rendered = with_components(&order, "");
        assert_eq!(
            agent_rules(&rendered),
            json!([get_proxy, get_namespaces]),
            "{order:?}"
        );
        assert_eq!(
            agent_env(&rendered)["CSI_EARLY_ISSUE"],
            "false",
            "{order:?}"
        );
    }
}

/// The athenz-egress policy's ZTS and API server rules' addresses.
fn egress_cidrs(objects: &BTreeMap<Key, Value>) -> [Option<Vec<String>>; 2] {
    let egress = &objects[&key("NetworkPolicy", "k8s-admin", "athenz-egress")]["spec"]["egress"];
    assert!(egress[0].get("to").is_none(), "DNS by port: {egress}");
    [1, 2].map(|rule| {
        egress[rule].get("to").map(|to| {
            to.as_array()
                .unwrap()
                .iter()
                .map(|t| t["ipBlock"]["cidr"].as_str().unwrap().to_owned())
                .collect()
        })
    })
}

/// docs/operating.md "Network policies": its overlay patch (the first `yaml` block there).
fn documented_egress_patch() -> String {
    let page = std::fs::read_to_string(athenz_testbed::bins::repo_root().join("docs/operating.md"))
        .unwrap();
    let section = page
        .split("\n## Network policies\n")
        .nth(1)
        .expect("docs/operating.md has a \"Network policies\" section");
    let section = section.split("\n## ").next().unwrap();
    let block = section
        .split("```yaml\n")
        .nth(1)
        .expect("\"Network policies\" shows the overlay's patch in a yaml block");
    block.split("```").next().unwrap().to_owned()
}

/// kustomize cannot refuse to render, so the component's egress names documentation addresses
/// (RFC 5737's TEST-NET-3) that no ZTS or API server has: the control plane fails closed until
/// the overlay names its own, as the documented patch does. Egress to any address is an
/// overlay's explicit removal of the addresses.
#[test]
fn network_policies_egress_is_by_address_and_the_overlay_names_its_own() {
    let shipped = egress_cidrs(&with_component("network-policies"));
    for cidrs in &shipped {
        let cidrs = cidrs.as_ref().expect("the component names addresses");
        assert!(!cidrs.is_empty());
        for cidr in cidrs {
            assert!(cidr.starts_with("203.0.113."), "not a placeholder: {cidr}");
        }
    }
    let patch = documented_egress_patch();
    let component = std::fs::read_to_string(
        deploy_dir().join("components/network-policies/kustomization.yaml"),
    )
    .unwrap();
    for op in patch.lines().filter(|l| l.contains("op: replace")) {
        assert!(
            component.contains(op.trim()),
            "the component's comment differs: {op}"
        );
    }
    let yours = egress_cidrs(&with_components(&["network-policies"], &patch));
    for cidrs in &yours {
        let cidrs = cidrs.as_ref().unwrap();
        assert!(!cidrs.is_empty() && cidrs.iter().all(|c| !c.starts_with("203.0.113.")));
    }
    assert_ne!(
        yours[0], yours[1],
        "ZTS's and the API server's are each their own"
    );
    let any = "patches:\n  - target: {kind: NetworkPolicy, name: athenz-egress}\n    patch: |-\n      \
               - {op: remove, path: /spec/egress/1/to}\n      - {op: remove, path: /spec/egress/2/to}\n";
    assert_eq!(
        egress_cidrs(&with_components(&["network-policies"], any)),
        [None, None]
    );
}
