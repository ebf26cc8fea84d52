//! `athenz-devstack cluster scale` at a small size: the real API server, etcd and controllers,
//! kwok keeping its fake nodes Ready and playing their pods' start, the release's initializer in
//! the pods' path (every measured pod admitted through it, as the API server times it), every
//! node's simulated agent holding its pod watch, the release's callback confirming every pod of
//! each measured window for ZTS's stand-in (the run fails if one is refused), a second callback
//! with its cache full, and the control plane measured with our parts stopped and running; two
//! points (docs/benchmarks.md, "A cluster at Kubernetes' limits", has the large ones).
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
            "--points=20:300,40:600",
            "--window-pods=100",
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
    assert_eq!(points.len(), 2, "{points:#?}");
    let mut etcd_before = 0.0;
    for (point, (nodes, pods)) in points.iter().zip([(20, 300), (40, 600)]) {
        assert_eq!(point["nodes"], nodes);
        assert_eq!(point["pods"], pods);
        // every node's agent holds its watch (the controllers hold a few more)
        let watches = point["pod_watches"].as_f64().unwrap();
        assert!(
            watches >= f64::from(nodes),
            "{watches} pod watches for {nodes} agents"
        );
        assert!(point["creation"]["p50"].as_f64().unwrap() > 0.0, "{point}");
        assert!(
            point["confirmation"]["p50"].as_f64().unwrap() > 0.0,
            "{point}"
        );
        // every measured pod passed through the webhook, and only those: the control window's
        // namespace is not opted in
        assert_eq!(point["webhook"]["calls"], 100.0, "{point}");
        let p99 = point["webhook"]["p99_ms"].as_f64().unwrap();
        assert!(p99 > 0.0 && p99 <= point["webhook"]["p99_at_most_ms"].as_f64().unwrap());
        assert!(
            point["control_creation"]["p50"].as_f64().unwrap() > 0.0,
            "{point}"
        );
        // the full cache holds every injected pod: the fills' and the measured windows'
        let full = &point["full_cache"];
        // each point so far made a control window of 100 pods
        let control_pods = 100.0 * f64::from(if nodes == 20 { 1 } else { 2 });
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
                point[share].as_f64().unwrap().is_finite(),
                "{share}: {point}"
            );
        }
        for (span, ours) in [
            ("at_rest_without_ours", false),
            ("creating_without_ours", false),
            ("at_rest", true),
            ("creating", true),
        ] {
            let processes: Vec<&str> = point[span]
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
            for of_ours in ["athenz-callback", "athenz-initializer"] {
                assert_eq!(processes.contains(&of_ours), ours, "{span}: {processes:?}");
            }
        }
        let etcd = point["etcd_db_bytes"].as_f64().unwrap();
        assert!(etcd > etcd_before, "etcd grows with the cluster: {etcd}");
        etcd_before = etcd;
    }
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}
