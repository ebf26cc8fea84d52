//! What the real API server's audit log says of our service accounts after `real_cluster`.

use crate::common::real_node::{access, audit_events, granted};
use athenz_devstack::cluster::control_plane::AUDIT_LOG;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use athenz_devstack::cluster::kubectl::Kubectl;
use std::path::Path;

/// The real API server's audit log: our service accounts used exactly what deploy/ grants them
/// (a missing grant is a 403 here; an unused one is an extra), and the kubelet let the agent
/// read its /pods, asking only for what the agent's ClusterRole grants beside the agent's own
/// watch of its node's pending pods.
pub fn our_accounts_used_exactly_their_grants(kubectl: &Kubectl, state_dir: &Path) {
    let audit = audit_events(&state_dir.join("logs").join(AUDIT_LOG));
    let callback_user = format!("system:serviceaccount:{CONTROL_NAMESPACE}:athenz-callback");
    let agent_user = format!("system:serviceaccount:{NODE_NAMESPACE}:athenz-agent");
    let mut used = std::collections::BTreeSet::new();
    let mut agent_used = std::collections::BTreeSet::new();
    let mut non_resource = std::collections::BTreeSet::new();
    for event in &audit {
        let user = event["user"]["username"].as_str().unwrap_or_default();
        let ours = [NODE_NAMESPACE, CONTROL_NAMESPACE]
            .iter()
            .any(|ns| user.starts_with(&format!("system:serviceaccount:{ns}:")));
        if ours {
            assert_ne!(event["responseStatus"]["code"], 403, "refused: {event}");
        }
        if user == agent_user && !event["objectRef"].is_null() {
            // the agent's own API use: the watch of its node's pending pods
            agent_used.insert(access(event));
        }
        if user == callback_user {
            if event["objectRef"].is_null() {
                // a non-resource URL (discovery, /version): every authenticated user may
                non_resource.insert(format!(
                    "{} {}",
                    event["verb"].as_str().unwrap_or(""),
                    event["requestURI"].as_str().unwrap_or("")
                ));
            } else {
                used.insert(access(event));
            }
        }
    }
    let callback_granted = granted(kubectl, "athenz-callback");
    assert_eq!(
        used, callback_granted,
        "the callback's use of the API (left) against its ClusterRole (right)"
    );
    let kubelet_checks: Vec<_> = audit
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "subjectaccessreviews")
        .filter(|e| e["requestObject"]["spec"]["user"] == agent_user.as_str())
        .map(|e| {
            let attrs = &e["responseObject"]["spec"]["resourceAttributes"];
            (
                format!(
                    "{}/{}",
                    attrs["resource"].as_str().unwrap_or(""),
                    attrs["subresource"].as_str().unwrap_or("")
                ),
                e["responseObject"]["status"]["allowed"] == true,
            )
        })
        .collect();
    assert!(
        kubelet_checks.iter().any(|(_, allowed)| *allowed),
        "the kubelet never allowed the agent's token: {kubelet_checks:?}"
    );
    // fine-grained kubelet authorization: the kubelet asks for nodes/pods first and, allowed,
    // never for nodes/proxy; the agent's ClusterRole is exactly what the kubelet asked and what
    // the agent's watch of its node's pending pods used
    let asked: std::collections::BTreeSet<String> = kubelet_checks
        .iter()
        .map(|(resource, allowed)| {
            assert!(
                allowed,
                "the kubelet refused the agent {resource}: {kubelet_checks:?}"
            );
            format!("get {resource}")
        })
        .collect();
    assert_eq!(
        agent_used,
        ["list pods", "watch pods"].map(str::to_owned).into(),
        "the agent's own API use: its watch of the node's pending pods (list, then watch)"
    );
    assert_eq!(
        asked
            .union(&agent_used)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        granted(kubectl, "athenz-agent"),
        "what the kubelet required of the agent and what the agent used (left) against its ClusterRole (right)"
    );
    eprintln!("the kubelet's checks of the agent's token: {kubelet_checks:?}");
    eprintln!(
        "the callback's API use: {used:?}; outside its ClusterRole, allowed to every authenticated user: {non_resource:?}"
    );
}
