//! `athenz-devstack chaos` and `load` as a user runs them: each fault against its bounds, and
//! what an identity costs the shared parts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{DEVSTACK, json_run};
use std::process::Command;

/// Chaos, four faults on two flex pods and one files-mode pod: the SIA killed mid-write (a
/// reader checking every set), ZTS answering 503 (through the faults file ZTS follows), the
/// kubelet listing no pods (through the one the Kubernetes stand-ins follow) and a full tmpfs;
/// each within its bounds, each having met a renewal, reported row by row.
#[test]
fn chaos_reports_each_fault_against_its_bounds() {
    let (out, report) = json_run(&[
        "chaos",
        "--pods=2",
        "--files-pods=1",
        "--faults=sia-killed-mid-write,zts-503,kubelet-omitting-pods,disk-full",
        "--sia-kills=60",
        "--json",
    ]);
    assert!(out.status.success(), "{report}");
    assert_eq!(report["passed"], true, "{report}");
    let faults = report["faults"].as_array().unwrap();
    let names: Vec<&str> = faults
        .iter()
        .map(|f| f["fault"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "sia-killed-mid-write",
            "zts-503",
            "kubelet-omitting-pods",
            "disk-full"
        ]
    );
    for f in faults {
        assert_eq!(f["torn_sets"], 0, "{f}");
        assert_eq!(f["pods_expired"], 0, "{f}");
        assert!(f["recovery_seconds"].as_f64().unwrap() <= f["bound_seconds"].as_f64().unwrap());
    }
    let detail = faults[0]["detail"].as_str().unwrap();
    assert!(detail.starts_with("60 inits, "), "{detail}");
    assert!(detail.ends_with("nothing left behind"), "{detail}");
    assert!(!detail.contains(" 0 killed mid-run"), "{detail}");
    for f in &faults[1..3] {
        let detail = f["detail"].as_str().unwrap();
        assert!(detail.contains("for 15 s;"), "{detail}");
        assert!(!detail.contains(" 0 renewals failed"), "{detail}");
        assert!(detail.ends_with(" 0 sidecar exits"), "{detail}");
    }
    let detail = faults[3]["detail"].as_str().unwrap();
    assert!(detail.contains("a rotation failed"), "{detail}");
    assert!(detail.ends_with("nothing left behind"), "{detail}");
}

/// `load` on two nodes (each with its agent) and ten real-size pods, 40 identities a second for
/// 3 s: every JWT signed with the node's own certificate and every confirmation over a new
/// mutual-TLS connection answered, each identity costing the API one request (the callback's pod
/// read) and each node registration one TokenReview, as the API stand-in counts them.
#[test]
fn load_reports_what_an_identity_costs_the_shared_parts() {
    let (out, report) = json_run(&[
        "load",
        "--nodes=2",
        "--pods-per-node=5",
        "--rate=40",
        "--seconds=3",
        "--json",
    ]);
    assert!(out.status.success(), "{report}");
    let callback = &report["callback"];
    assert_eq!(callback["replica"]["answered"], 120, "{report}");
    assert_eq!(callback["replica"]["failed"], 0, "{report}");
    assert!(
        callback["confirmations_per_core_second"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(callback["p99_ms"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["jwt_service"]["answered"], 120, "{report}");
    for route in ["issue", "refresh"] {
        let per = report["api_requests_per_identity"][route].as_f64().unwrap();
        assert!((0.99..=1.0).contains(&per), "{route}: {per} {report}");
    }
    assert!(report["node_renewals"].as_u64().unwrap() >= 2, "{report}");
    let reviews = report["tokenreviews_per_node_renewal"].as_f64().unwrap();
    assert!(reviews > 0.0 && reviews <= 1.0, "{report}");
    // a node registration: its TokenReview, the node and the agent's pod read
    assert_eq!(report["api_requests_per_node_renewal"], 3.0, "{report}");
    assert_eq!(report["api_requests"]["GET pods"], 120, "{report}");
}

/// Chaos's day-two faults on two flex pods and one files-mode pod: the API server
/// down while a pod starts (the callback answers 504, the pod gets its identity once the API is
/// back, nothing expires), and the agent replaced by another build while pods renew and start
/// (the old one drains what it had and exits by itself; every pod whole through the new one),
/// the jwt-service's and callback's two replicas each rolled one at a time behind their
/// Services, and the node rebooted (every pod back with a new IP, no certificate for an old one).
#[test]
fn chaos_day_two_faults_hold_their_bounds() {
    let (out, report) = json_run(&[
        "chaos",
        "--pods=2",
        "--files-pods=1",
        "--faults=api-server-unreachable,agent-upgraded,control-plane-rolled,node-rebooted",
        "--json",
    ]);
    assert!(out.status.success(), "{report}");
    assert_eq!(report["passed"], true, "{report}");
    let faults = report["faults"].as_array().unwrap();
    assert_eq!(faults[0]["fault"], "api-server-unreachable", "{report}");
    for f in faults {
        assert_eq!(f["torn_sets"], 0, "{f}");
        assert_eq!(f["pods_expired"], 0, "{f}");
        assert!(f["recovery_seconds"].as_f64().unwrap() <= f["bound_seconds"].as_f64().unwrap());
    }
    let detail = faults[0]["detail"].as_str().unwrap();
    assert!(detail.contains("refusing connections for 15 s"), "{detail}");
    assert!(!detail.contains("answered 504 0 times"), "{detail}");
    assert!(detail.contains("s after the API was back"), "{detail}");
    assert_eq!(faults[1]["fault"], "agent-upgraded", "{report}");
    let detail = faults[1]["detail"].as_str().unwrap();
    assert!(detail.contains("exited by itself"), "{detail}");
    assert!(
        !detail.contains(" 0 calls answered while draining"),
        "{detail}"
    );
    assert!(detail.contains("3/3 starting pods got theirs"), "{detail}");
    assert!(
        !detail.contains(" 0 pods renewed through the new agent"),
        "{detail}"
    );
}

/// Chaos's faults that need a real runtime, on three flex pods run by runc: the SIA's init
/// container killed by the runtime mid-request and restarted, the sidecars killed and restarted
/// as new containers of their pods (still served), a container given another pod's volume and a
/// process in no pod given one (both refused by the agent's peer check).
#[test]
fn chaos_faults_with_a_real_runtime_hold_their_bounds() {
    let (out, report) = json_run(&[
        "chaos",
        "--runtime=runc",
        "--pods=3",
        "--files-pods=1",
        "--faults=init-container-killed,sidecar-restarted,foreign-volume,host-process",
        "--sia-kills=100",
        "--json",
    ]);
    assert!(out.status.success(), "{report}");
    assert_eq!(report["passed"], true, "{report}");
    let faults = report["faults"].as_array().unwrap();
    let detail = |i: usize| faults[i]["detail"].as_str().unwrap().to_owned();
    assert!(
        detail(0).starts_with("10 init containers killed by runc"),
        "{}",
        detail(0)
    );
    assert!(detail(0).contains("0 restarts failed"), "{}", detail(0));
    assert!(detail(0).ends_with("nothing left behind"), "{}", detail(0));
    assert!(
        detail(1).contains("3 restarted") && detail(1).contains("3 as new containers"),
        "{}",
        detail(1)
    );
    assert!(
        detail(2).contains("3 refused (403 naming both pods)"),
        "{}",
        detail(2)
    );
    assert!(!detail(2).contains("not as bound"), "{}", detail(2));
    assert!(detail(3).contains("3 refused (403"), "{}", detail(3));
    for f in faults {
        assert_eq!(f["torn_sets"], 0, "{f}");
        assert_eq!(f["pods_expired"], 0, "{f}");
    }
}

/// The runtime faults need a runtime: with pods as processes, naming one is an error that says
/// so.
#[test]
fn chaos_runtime_faults_without_a_runtime_are_refused() {
    let out = Command::new(DEVSTACK)
        .args([
            "chaos",
            "--runtime=process",
            "--pods=1",
            "--files-pods=0",
            "--faults=foreign-volume",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--runtime runc or crun"), "{err}");
}
