//! `athenz-devstack cluster scale` at a small size: the real API server, etcd and controllers,
//! kwok keeping its fake nodes Ready and playing their pods' start, the release's initializer in
//! the pods' path (every measured pod admitted through it, as the API server times it), every
//! node's agent pod and its simulated agent holding its pod watch on its pod's token, the
//! release's jwt-service signing each measured pod's JWT for its node's agent and the release's
//! callback confirming every pod of each measured window for ZTS's stand-in, and a sample of
//! the agents' registrations through its TokenReview (the run fails if one is refused), a
//! second callback with its cache full, and the control plane measured with our parts stopped
//! and running, twice; one small point (docs/benchmarks.md, "A cluster at Kubernetes'
//! limits", has the large ones). Each span waits for the API server's garbage collections at
//! its edges (a few seconds apart in a small cluster), which is most of the test's time.
//!
//! Needs root (the control plane's ports and state dir), `harness/real-node/kube/build.sh
//! --kwok`'s binaries and the release's (deploy/image.sh; CI builds both). It fails naming what is missing; it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::process::Command;

mod common;
use common::DEVSTACK;

#[test]
fn a_small_cluster_is_filled_watched_and_measured_at_each_point() {
    // the release's binaries (target/image/bin), as deploy/image.sh builds them
    common::release::build_image();
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(&*DEVSTACK)
        .args(["cluster", "scale", "--state-dir"])
        .arg(state.path())
        .args([
            "--points=30:400",
            "--window-pods=50",
            "--repeats=2",
            "--rate=50",
            "--rest-seconds=3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster scale failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let points: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let points = points.as_array().unwrap();
    assert_eq!(points.len(), 1, "{points:#?}");
    for (point, (nodes, pods)) in points.iter().zip([(30, 400)]) {
        assert_eq!(point["nodes"], nodes);
        assert_eq!(point["pods"], pods);
        assert_eq!(point["agent_pods"], nodes, "an agent pod a node: {point}");
        for latency in ["creation", "control_creation", "confirmation", "jwt"] {
            assert!(
                point[latency]["p50"].as_f64().unwrap() > 0.0,
                "{latency}: {point}"
            );
        }
        // a node agent's registration for every 10 pods of each measured window, each through
        // the callback's TokenReview of its pod's token
        assert_eq!(point["node_confirmations"], 10, "{point}");
        assert!(
            point["node_confirmation"]["p50"].as_f64().unwrap() > 0.0,
            "{point}"
        );
        // every measured pod passed through the webhook, and only those: the control windows'
        // namespace is not opted in
        assert_eq!(point["webhook"]["calls"], 100.0, "{point}");
        let p99 = point["webhook"]["p99_ms"].as_f64().unwrap();
        assert!(p99 > 0.0 && p99 <= point["webhook"]["p99_at_most_ms"].as_f64().unwrap());
        // the full cache holds every injected pod: the fills' and the measured windows'
        let full = &point["full_cache"];
        // the point made two control windows of 50 pods
        let control_pods = 100.0;
        assert_eq!(
            full["pods"].as_f64().unwrap(),
            f64::from(pods) - control_pods,
            "{full}"
        );
        // a few hundred pods are below two processes' resident-set noise: the figure per pod
        // is the large runs' (docs/benchmarks.md); here it must be a number and the full
        // cache's callback must have run
        assert!(
            full["bytes_per_pod"].as_f64().unwrap().is_finite(),
            "{full}"
        );
        assert!(full["rss_mib"].as_f64().unwrap() > 0.0, "{full}");
        assert!(full["list_seconds"].as_f64().unwrap() > 0.0, "{full}");
        for share in ["api_share_at_rest", "api_share_creating"] {
            assert!(
                point[share]["mean"].as_f64().unwrap().is_finite(),
                "{share}: {point}"
            );
            // two comparisons: a spread
            assert!(
                point[share]["standard_error"].as_f64().unwrap().is_finite(),
                "{share}: {point}"
            );
        }
        let comparisons = point["comparisons"].as_array().unwrap();
        assert_eq!(comparisons.len(), 2, "{point}");
        for comparison in comparisons {
            // every node's agent holds its watch (the controllers hold a few more)
            let watches = comparison["pod_watches"].as_f64().unwrap();
            assert!(
                watches >= f64::from(nodes),
                "{watches} pod watches for {nodes} agents"
            );
            for (span, ours) in [
                ("at_rest_without_ours", false),
                ("creating_without_ours", false),
                ("at_rest", true),
                ("creating", true),
            ] {
                let span_report = &comparison[span];
                // from the end of one of the API server's collections to another's
                assert!(
                    span_report["gc_cycles"].as_f64().unwrap() >= 1.0,
                    "{span}: {span_report}"
                );
                if span.starts_with("at_rest") {
                    assert!(
                        span_report["seconds"].as_f64().unwrap() >= 3.0,
                        "{span}: {span_report}"
                    );
                }
                let processes: Vec<&str> = span_report["processes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        assert!(p["rss_mib"].as_f64().unwrap() > 0.0, "{span}: {p}");
                        p["process"].as_str().unwrap()
                    })
                    .collect();
                for expected in ["etcd", "kube-apiserver", "kwok"] {
                    assert!(processes.contains(&expected), "{span}: {processes:?}");
                }
                for of_ours in [
                    "athenz-callback",
                    "athenz-initializer",
                    "athenz-jwt-service",
                ] {
                    assert_eq!(processes.contains(&of_ours), ours, "{span}: {processes:?}");
                }
            }
        }
        assert!(point["etcd_db_bytes"].as_f64().unwrap() > 0.0, "{point}");
    }
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}
