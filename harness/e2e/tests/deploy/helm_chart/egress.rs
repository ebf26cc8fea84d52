//! The control plane's egress (components.networkPolicies): the pods that hold the signing keys
//! reach ZTS and the API server by address, or any address only when a value says so.

use super::kustomize::key;
use super::render::{helm_template, helm_template_error};
use serde_json::Value;
use std::collections::BTreeMap;

const ON: [&str; 2] = ["--set", "components.networkPolicies=true"];

/// The athenz-egress policy's rules: DNS, ZTS, the API server.
fn egress(chart: &BTreeMap<super::kustomize::Key, Value>) -> Vec<Value> {
    chart[&key("NetworkPolicy", "k8s-admin", "athenz-egress")]["spec"]["egress"]
        .as_array()
        .unwrap()
        .clone()
}

/// With the policies on and an address list empty the chart refuses to render, naming the empty
/// list and the value that would allow any address.
#[test]
fn egress_to_any_address_is_refused_naming_the_values() {
    for (given, empty) in [
        (
            vec![],
            "networkPolicies.ztsCidrs or networkPolicies.apiServerCidrs",
        ),
        (
            vec!["--set", "networkPolicies.ztsCidrs={192.0.2.10/32}"],
            "no networkPolicies.apiServerCidrs given",
        ),
        (
            vec!["--set", "networkPolicies.apiServerCidrs={198.51.100.0/24}"],
            "no networkPolicies.ztsCidrs given",
        ),
    ] {
        let err = helm_template_error(&[&ON[..], &given[..]].concat());
        for named in [
            "components.networkPolicies",
            empty,
            "networkPolicies.allowEgressToAnyAddress=true",
            "Network policies",
        ] {
            assert!(err.contains(named), "{given:?}: {named}: {err}");
        }
    }
    // off (the default), the addresses are not asked for
    let off = helm_template(&[]);
    assert!(!off.keys().any(|k| k.0 == "NetworkPolicy"));
}

/// `networkPolicies.allowEgressToAnyAddress=true` renders the rules by port alone, as written.
#[test]
fn egress_to_any_address_renders_only_when_allowed_by_name() {
    let chart = helm_template(
        &[
            &ON[..],
            &["--set", "networkPolicies.allowEgressToAnyAddress=true"],
        ]
        .concat(),
    );
    let rules = egress(&chart);
    assert_eq!(rules.len(), 3);
    for rule in &rules {
        assert!(rule.get("to").is_none(), "{rule}");
    }
    // one list given: that rule by address, the other by port
    let chart = helm_template(
        &[
            &ON[..],
            &[
                "--set",
                "networkPolicies.allowEgressToAnyAddress=true",
                "--set",
                "networkPolicies.ztsCidrs={192.0.2.10/32}",
            ],
        ]
        .concat(),
    );
    let rules = egress(&chart);
    assert_eq!(rules[1]["to"][0]["ipBlock"]["cidr"], "192.0.2.10/32");
    assert!(rules[2].get("to").is_none());
}

/// With both lists given the policy names exactly those addresses, ZTS's on ZTS's ports and the
/// API server's on its own; DNS stays by port.
#[test]
fn egress_with_addresses_names_them() {
    let chart = helm_template(
        &[
            &ON[..],
            &[
                "--set",
                "networkPolicies.ztsCidrs={192.0.2.10/32,2001:db8::10/128}",
                "--set",
                "networkPolicies.apiServerCidrs={198.51.100.0/24}",
            ],
        ]
        .concat(),
    );
    let rules = egress(&chart);
    let cidrs = |rule: &Value| -> Vec<String> {
        rule["to"]
            .as_array()
            .unwrap()
            .iter()
            .map(|to| to["ipBlock"]["cidr"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(rules[0].get("to").is_none(), "DNS by port");
    assert_eq!(cidrs(&rules[1]), ["192.0.2.10/32", "2001:db8::10/128"]);
    assert_eq!(
        rules[1]["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 4443}, {"protocol": "TCP", "port": 443}])
    );
    assert_eq!(cidrs(&rules[2]), ["198.51.100.0/24"]);
    assert_eq!(
        rules[2]["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 6443}])
    );
}
