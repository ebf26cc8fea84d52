#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use serde_json::{Value, json};

const AGENT: &str = "system:serviceaccount:athenz-system:athenz-agent";

/// A review as the API server sends one for `kubectl get pods --field-selector ...` by a
/// pod-bound token (shape: the SubjectAccessReview v1 API, the webhook authorizer's
/// `resourceAttributesFrom`).
fn review(user: &str, verb: &str, requirements: Value, node: Option<&str>) -> Value {
    let mut extra = json!({
        "authentication.kubernetes.io/credential-id": ["JTI=7ee52be0-9045-4653-aa5e-0da57b8dccdc"],
        "authentication.kubernetes.io/pod-name": ["athenz-agent-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["e87dbbd6-3d7e-45db-aafb-72b24627dff5"],
    });
    if let Some(node) = node {
        extra[NODE_NAME_EXTRA] = json!([node]);
        extra["authentication.kubernetes.io/node-uid"] = json!(["497e9d9a-47aa"]);
    }
    let mut attributes = json!({"verb": verb, "version": "v1", "resource": "pods"});
    if !requirements.is_null() {
        attributes["fieldSelector"] = json!({ "requirements": requirements });
    }
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {"creationTimestamp": null},
        "spec": {
            "resourceAttributes": attributes,
            "user": user,
            "uid": "0b4f8f5e-2b7c-4d9e-9d44-3a3f1d1c2b1a",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:athenz-system", "system:authenticated"],
            "extra": extra
        },
        "status": {"allowed": false}
    })
}

fn own_node_selector(node: &str) -> Value {
    json!([
        {"key": "spec.nodeName", "operator": "In", "values": [node]},
        {"key": "status.phase", "operator": "In", "values": ["Pending"]}
    ])
}

fn decide_value(review: &Value) -> Result<Decision, BadReview> {
    decide(AGENT, &serde_json::to_vec(review).unwrap())
}

fn denied(review: &Value) -> String {
    match decide_value(review).unwrap() {
        Decision::Denied(reason) => reason,
        other => panic!("not denied: {other:?} for {review}"),
    }
}

#[test]
fn the_agent_watching_its_own_node_is_left_to_rbac() {
    for verb in ["list", "watch"] {
        let r = review(AGENT, verb, own_node_selector("node-a"), Some("node-a"));
        assert_eq!(decide_value(&r).unwrap(), Decision::OwnNode);
    }
    // `=` and `==` as a client might spell them (the API server sends In)
    for op in ["=", "=="] {
        let sel = json!([{"key": "spec.nodeName", "operator": op, "values": ["node-a"]}]);
        let r = review(AGENT, "list", sel, Some("node-a"));
        assert_eq!(decide_value(&r).unwrap(), Decision::OwnNode);
    }
    let answer = Decision::OwnNode.answer();
    assert_eq!(
        serde_json::to_value(&answer).unwrap(),
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
               "status": {"allowed": false, "denied": false}})
    );
}

#[test]
fn the_agent_reaching_beyond_its_node_is_denied_with_the_reason() {
    let other = review(AGENT, "list", own_node_selector("node-b"), Some("node-a"));
    let reason = denied(&other);
    assert!(reason.contains("spec.nodeName=node-a"), "{reason}");
    assert!(reason.contains("node-b"), "{reason}");
    let none = review(AGENT, "watch", Value::Null, Some("node-a"));
    assert!(denied(&none).contains("no field selector"));
    let not_equal = json!([{"key": "spec.nodeName", "operator": "NotIn", "values": ["node-b"]}]);
    assert!(denied(&review(AGENT, "list", not_equal, Some("node-a"))).contains("NotIn"));
    let bang = json!([{"key": "spec.nodeName", "operator": "!=", "values": ["node-a"]}]);
    denied(&review(AGENT, "list", bang, Some("node-a")));
    let two = json!([{"key": "spec.nodeName", "operator": "In", "values": ["node-a", "node-b"]}]);
    denied(&review(AGENT, "list", two, Some("node-a")));
    let phase_only = json!([{"key": "status.phase", "operator": "In", "values": ["Pending"]}]);
    assert!(
        denied(&review(AGENT, "list", phase_only, Some("node-a")))
            .contains("no spec.nodeName requirement")
    );
    let empty = json!([{"key": "spec.nodeName", "operator": "In", "values": []}]);
    denied(&review(AGENT, "list", empty, Some("node-a")));
    let answer = Decision::Denied("why".into()).answer();
    assert_eq!(
        serde_json::to_value(&answer).unwrap()["status"],
        json!({"allowed": false, "denied": true, "reason": "why"})
    );
}

#[test]
fn a_credential_naming_no_node_is_denied() {
    let r = review(AGENT, "list", own_node_selector("node-a"), None);
    assert!(denied(&r).contains("names no node"));
    let mut empty = r.clone();
    empty["spec"]["extra"][NODE_NAME_EXTRA] = json!([""]);
    denied(&empty);
    let mut two = r.clone();
    two["spec"]["extra"][NODE_NAME_EXTRA] = json!(["node-a", "node-b"]);
    denied(&two);
    let mut null = r.clone();
    null["spec"]["extra"][NODE_NAME_EXTRA] = Value::Null;
    denied(&null);
    let mut no_extra = r;
    no_extra["spec"].as_object_mut().unwrap().remove("extra");
    denied(&no_extra);
}

#[test]
fn everything_else_is_no_opinion() {
    let selector = own_node_selector("node-b");
    for r in [
        review(
            "system:serviceaccount:default:default",
            "list",
            selector.clone(),
            Some("node-a"),
        ),
        review(
            "system:serviceaccount:athenz-system:athenz-agentx",
            "list",
            Value::Null,
            None,
        ),
        review("kubernetes-admin", "watch", Value::Null, None),
        review(AGENT, "get", Value::Null, Some("node-a")),
        review(AGENT, "delete", Value::Null, Some("node-a")),
    ] {
        assert_eq!(decide_value(&r).unwrap(), Decision::NotGoverned, "{r}");
    }
    // the kubelet's nodes/pods, another group's pods, a non-resource request
    let mut sub = review(AGENT, "get", Value::Null, Some("node-a"));
    sub["spec"]["resourceAttributes"] =
        json!({"verb": "get", "resource": "nodes", "subresource": "pods", "name": "node-a"});
    assert_eq!(decide_value(&sub).unwrap(), Decision::NotGoverned);
    let mut log = review(AGENT, "list", Value::Null, Some("node-a"));
    log["spec"]["resourceAttributes"]["subresource"] = json!("log");
    assert_eq!(decide_value(&log).unwrap(), Decision::NotGoverned);
    let mut metrics = review(AGENT, "list", Value::Null, Some("node-a"));
    metrics["spec"]["resourceAttributes"]["group"] = json!("metrics.k8s.io");
    assert_eq!(decide_value(&metrics).unwrap(), Decision::NotGoverned);
    let mut path = review(AGENT, "get", Value::Null, Some("node-a"));
    let spec = path["spec"].as_object_mut().unwrap();
    spec.remove("resourceAttributes");
    spec.insert(
        "nonResourceAttributes".into(),
        json!({"path": "/healthz", "verb": "get"}),
    );
    assert_eq!(decide_value(&path).unwrap(), Decision::NotGoverned);
}

#[test]
fn a_label_selector_is_no_field_selector() {
    let mut r = review(AGENT, "list", Value::Null, Some("node-a"));
    r["spec"]["resourceAttributes"]["labelSelector"] =
        json!({"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["node-a"]}]});
    assert!(denied(&r).contains("no field selector"));
    // a raw selector alone is not parsed here: the API server sends requirements
    let mut raw = review(AGENT, "list", Value::Null, Some("node-a"));
    raw["spec"]["resourceAttributes"]["fieldSelector"] =
        json!({"rawSelector": "spec.nodeName=node-a"});
    denied(&raw);
}

#[test]
fn unknown_fields_are_ignored_and_wrong_types_refused() {
    let mut r = review(AGENT, "list", own_node_selector("node-a"), Some("node-a"));
    r["spec"]["someFutureField"] = json!({"deep": [1, 2, 3]});
    r["spec"]["resourceAttributes"]["fieldSelector"]["requirements"][0]["future"] = json!(true);
    assert_eq!(decide_value(&r).unwrap(), Decision::OwnNode);
    let wrong: [(&str, Value); 5] = [
        ("/spec/user", json!(42)),
        ("/spec/extra", json!(["node-a"])),
        (
            "/spec/resourceAttributes/fieldSelector/requirements",
            json!({"key": "spec.nodeName"}),
        ),
        (
            "/spec/resourceAttributes/fieldSelector/requirements/0/values",
            json!("node-a"),
        ),
        ("/spec/resourceAttributes/verb", json!(["list"])),
    ];
    for (pointer, value) in wrong {
        let mut bad = r.clone();
        *bad.pointer_mut(pointer).unwrap() = value;
        assert!(
            matches!(decide_value(&bad), Err(BadReview::Shape(_))),
            "{pointer}"
        );
    }
}

#[test]
fn malformed_and_hostile_bodies_are_refused() {
    for body in [
        &b""[..],
        b"null",
        b"[]",
        b"{",
        b"\xff\xfe",
        b"{\"apiVersion\": 1}",
    ] {
        assert!(decide(AGENT, body).is_err(), "{body:?}");
    }
    let mut other_kind = review(AGENT, "list", Value::Null, Some("node-a"));
    other_kind["apiVersion"] = json!("authorization.k8s.io/v1beta1");
    assert!(matches!(
        decide_value(&other_kind),
        Err(BadReview::Kind(..))
    ));
    let mut no_spec = review(AGENT, "list", Value::Null, Some("node-a"));
    no_spec.as_object_mut().unwrap().remove("spec");
    assert_eq!(decide_value(&no_spec), Err(BadReview::NoSpec));
    // nesting: refused before parsing, however it is hidden
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(decide(AGENT, deep.as_bytes()), Err(BadReview::TooDeep));
    let mut nested = review(AGENT, "list", own_node_selector("node-a"), Some("node-a"));
    let mut v = json!(1);
    for _ in 0..20 {
        v = json!([v]);
    }
    nested["spec"]["unknown"] = v;
    assert_eq!(decide_value(&nested), Err(BadReview::TooDeep));
    // brackets inside strings are not nesting
    let mut quoted = review(AGENT, "list", own_node_selector("node-a"), Some("node-a"));
    quoted["spec"]["uid"] = json!("[[[[[[[[[[[[[[[[[[[[[[[[\\\"{{{{{{{{{{{{{{{{{{");
    assert_eq!(decide_value(&quoted).unwrap(), Decision::OwnNode);
}

#[test]
fn huge_arrays_cannot_hide_or_forge_the_node() {
    // the matching requirement past the ones looked at: denied (never allowed by accident)
    let mut many: Vec<Value> = (0..MAX_REQUIREMENTS)
        .map(|i| json!({"key": format!("metadata.name"), "operator": "In", "values": [format!("p{i}")]}))
        .collect();
    many.push(json!({"key": "spec.nodeName", "operator": "In", "values": ["node-a"]}));
    denied(&review(AGENT, "list", Value::Array(many), Some("node-a")));
    // many values: not exactly one
    let values: Vec<String> = (0..10_000).map(|i| format!("node-{i}")).collect();
    let wide = json!([{"key": "spec.nodeName", "operator": "In", "values": values}]);
    let reason = denied(&review(AGENT, "list", wide, Some("node-a")));
    assert!(reason.len() < 400, "the reason echoes too much: {reason}");
    // many node names in the extra: not one
    let mut r = review(AGENT, "list", own_node_selector("node-a"), Some("node-a"));
    r["spec"]["extra"][NODE_NAME_EXTRA] = json!(vec!["node-a"; 1000]);
    denied(&r);
}

#[test]
fn depth_counting_reads_strings_and_escapes() {
    assert!(depth_within(b"{\"a\": [[1]]}", 3));
    assert!(!depth_within(b"{\"a\": [[1]]}", 2));
    assert!(depth_within(br#"{"a": "[[[[\"[[["}"#, 1));
    assert!(depth_within(br#"{"a": "\\"}"#, 1));
    assert!(!depth_within(br#"{"a": "\\", "b": [[]]}"#, 2));
}
