//! The initializer's own CA: its Secret shipped empty, its grant by name, the policy bounding it.

use super::*;

/// The initializer's own CA (docs/design.md §4.7): the base ships its Secret empty (no key in the
/// repository, nothing an apply could overwrite), the initializer's token reaches that Secret
/// and its webhook by name only, and the policy that bounds the webhook grant selects exactly
/// that token and that webhook.
#[test]
fn the_initializer_reaches_its_ca_secret_and_its_webhook_alone() {
    let o = objects();
    let names: Vec<_> = o
        .secrets
        .iter()
        .map(|s| s.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(names, ["athenz-initializer-ca"]);
    let secret = &o.secrets[0];
    assert!(secret.data.is_none() && secret.string_data.is_none());
    assert_eq!(secret.metadata.namespace.as_deref(), Some("k8s-admin"));

    let [role] = &o.roles[..] else {
        panic!("one Role: {:?}", o.roles)
    };
    let rules = role.rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["secrets".to_owned()][..])
    );
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["athenz-initializer-ca".to_owned()][..])
    );
    assert_eq!(rules[0].verbs, ["get", "update"]);
    let webhook_rule = o.cluster_roles["athenz-initializer"]
        .rules
        .clone()
        .unwrap_or_default();
    assert_eq!(webhook_rule.len(), 1);
    assert_eq!(
        webhook_rule[0].resource_names.as_deref(),
        Some(&["athenz-initializer".to_owned()][..])
    );
    assert_eq!(webhook_rule[0].verbs, ["get", "update"]);
    let bound = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects
            .iter()
            .flatten()
            .all(|s| s.name == "athenz-initializer")
    };
    assert!(o.role_bindings.iter().all(|b| bound(&b.subjects)));

    let [policy] = &o.policies[..] else {
        panic!("one ValidatingAdmissionPolicy")
    };
    let spec = policy.spec.clone().unwrap();
    let conditions = spec.match_conditions.unwrap_or_default();
    assert_eq!(
        conditions[0].expression,
        r#"request.userInfo.username == "system:serviceaccount:k8s-admin:athenz-initializer""#
    );
    let rules = spec
        .match_constraints
        .unwrap()
        .resource_rules
        .unwrap_or_default();
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["athenz-initializer".to_owned()][..])
    );
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let [binding] = &o.policy_bindings[..] else {
        panic!("one binding")
    };
    let binding = binding.spec.clone().unwrap();
    assert_eq!(binding.policy_name, policy.metadata.name);
    assert_eq!(binding.validation_actions, Some(vec!["Deny".to_owned()]));
    // the initializer's Deployment keeps the CA there and names that webhook
    let env = |name: &str| {
        o.deployments["athenz-initializer"]
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.containers[0].env.clone())
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value)
    };
    assert_eq!(
        env("SERVING_CA_SECRET").as_deref(),
        Some("athenz-initializer-ca")
    );
    assert_eq!(
        env("WEBHOOK_CONFIGURATION").as_deref(),
        Some("athenz-initializer")
    );
    assert_eq!(
        o.webhooks[0].metadata.name.as_deref(),
        Some("athenz-initializer")
    );
}
