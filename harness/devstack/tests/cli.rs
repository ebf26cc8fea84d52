//! `athenz-devstack` as a user runs it: the demo (text and JSON), the standalone dev ZTS, and
//! bad arguments. (This file also makes `cargo test --workspace` build the binary the end-to-end
//! tests in `harness/e2e/tests/stack/e2e.rs` launch.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::DEVSTACK;

#[test]
fn demo_issues_refreshes_refuses_and_cleans_up() {
    let out = Command::new(DEVSTACK)
        .args(["demo", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 3);
    let names: Vec<&str> = pods
        .iter()
        .map(|p| p["identity"]["common_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "media.sports.web",
            "media.sports.api",
            "finance.ledger.ledger"
        ]
    );
    for pod in pods {
        // leaf, intermediate, root: verified by the demo before it reports
        assert_eq!(pod["identity"]["chain"].as_array().unwrap().len(), 3);
    }
    assert_ne!(
        report["refresh"]["old_serial"],
        report["refresh"]["new_serial"]
    );
    assert_eq!(report["refresh"]["sidecar_exited_cleanly"], true);
    assert_refused_as_deleted(&report, "finance-ledger/ledger-0");
    // authorization: a token for the role the pod is in, bound to its certificate; a refusal
    // naming the role it is not in; a token from its sidecar's token server
    let authz = &report["authorization"];
    assert_eq!(authz["granted"], serde_json::json!(["readers"]));
    assert_eq!(authz["bound_to_certificate"], true);
    let refusal = authz["refusal"].as_str().unwrap();
    assert!(
        refusal.starts_with("403") && refusal.contains("not included in the requested role(s)"),
        "{refusal}"
    );
    assert!(
        authz["token_server"]
            .as_str()
            .unwrap()
            .starts_with("token_type \"Bearer\""),
        "{authz}"
    );
    assert_eq!(report["volumes_left"], 0);
}

/// Files mode: the agent writes and rotates the pod's files through its CSI driver, nothing runs
/// in the pod; a deleted pod's next rotation is refused and kubelet sees the volume abnormal.
#[test]
fn demo_in_csi_files_mode_runs_nothing_in_the_pod() {
    let out = Command::new(DEVSTACK)
        .args(["demo", "--json", "--volume", "csi-files"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["volume"], "csi-files");
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 3);
    for pod in pods {
        assert_eq!(pod["identity"]["chain"].as_array().unwrap().len(), 3);
        // files mode's certificate names no pod IP unless the volume asks for it (`ipSAN`)
        assert_eq!(
            pod["identity"]["ip_addresses"].as_array().unwrap().len(),
            0,
            "{pod}"
        );
    }
    assert_eq!(report["refresh"]["by"], "the agent");
    assert_eq!(report["authorization"], serde_json::Value::Null);
    assert_eq!(
        report["refresh"]["sidecar_exited_cleanly"],
        serde_json::Value::Null
    );
    assert_ne!(
        report["refresh"]["old_serial"],
        report["refresh"]["new_serial"]
    );
    assert_refused_as_deleted(&report, "finance-ledger/ledger-0");
    let cross = report["refused_cross_node"]["refusal"].as_str().unwrap();
    assert!(
        cross.contains("403") && cross.contains("pod_node"),
        "{cross}"
    );
    assert_eq!(report["volumes_left"], 0);
}

/// The deleted pod's renewal was refused because the pod is going or gone, by any of the three
/// checks that can see it. The demo deletes as `kubectl delete` does, gracefully first: while the
/// pod is terminating the agent refuses it as being deleted; once it is removed, the agent's own
/// kubelet pod list (reused for up to a second) no longer has it; when that list still predates
/// the deletion, the callback behind ZTS refuses (the Kubernetes API no longer has the pod).
/// Which one answers depends only on when the renewal runs; any other refusal, or none, fails.
fn assert_refused_as_deleted(report: &serde_json::Value, pod: &str) {
    let refusal = report["refused_after_delete"]["refusal"].as_str().unwrap();
    let terminating =
        refusal.contains("403") && refusal.contains(&format!("pod {pod} is being deleted"));
    let by_agent = refusal.contains(&format!("{pod} is not on this node"));
    let by_callback = refusal.contains("403")
        && refusal.contains("pod_exists")
        && refusal.contains(&format!("pod {pod} does not exist"));
    assert!(terminating || by_agent || by_callback, "{refusal}");
}

#[test]
fn demo_prints_for_people() {
    let out = Command::new(DEVSTACK).arg("demo").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "CN       media.sports.web",
        "DNS      web.media-sports.athenz.cloud",
        "URI      spiffe://media.sports/sa/web",
        "(verified)",
        "refresh: athenz-sia refresh replaced",
        "its refresh was refused",
        "authorization: web-5d8f7 is in media.sports:role.readers",
        "(not a member): 403",
        "volumes left on the node: 0",
        "demo complete",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

#[test]
fn standalone_zts_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(DEVSTACK)
        .args(["zts", "--state-dir"])
        .arg(dir.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let info = dir.path().join("zts.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !info.exists() {
        assert!(Instant::now() < deadline, "zts.json never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let info: serde_json::Value = serde_json::from_slice(&std::fs::read(&info).unwrap()).unwrap();
    let url = info["url"].as_str().unwrap();
    assert!(url.starts_with("https://127.0.0.1:") && url.ends_with("/zts/v1"));
    let ca = std::fs::read(info["ca"].as_str().unwrap()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // it answers, over TLS its CA verifies: its status asks for credentials, as Athenz's does
    let status: serde_json::Value = runtime.block_on(async {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
            .build()
            .unwrap()
            .get(format!("{url}/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    assert_eq!(status["code"], 401, "{status}");
    assert_eq!(status["message"], "Invalid credentials");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

/// Athenz's own ZTS where it was never built: the command names what is missing and how to
/// build it, and writes no zts.json.
#[test]
fn athenz_zts_not_built_is_named_with_its_build_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(DEVSTACK)
        .args(["zts", "--server", "athenz", "--state-dir"])
        .arg(dir.path())
        .env("ATHENZ_ZTS_HOME", dir.path().join("no-build"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-build/webapps/zts.war is missing")
            && err.contains("harness/peers/athenz/zts/build --source"),
        "{err}"
    );
    assert!(!dir.path().join("zts.json").exists());
}

#[test]
fn bad_arguments_are_named() {
    let out = Command::new(DEVSTACK)
        .args(["bench", "--pods", "1", "--key", "ed25519"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--key") && err.contains("ed25519"), "{err}");

    let out = Command::new(DEVSTACK)
        .args([
            "zts",
            "--state-dir",
            "/tmp",
            "--config",
            "/nonexistent/zts.json",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/zts.json"), "{err}");
}

/// As a normal user it re-runs itself in a user + mount namespace; where the kernel refuses one,
/// it fails saying what it needs.
#[test]
fn a_normal_user_gets_a_user_namespace_or_a_clear_refusal() {
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "env",
                "HOME=/tmp",
            ])
            .args(args)
            .current_dir("/tmp")
            .output()
            .expect("setpriv (util-linux) is needed")
    };
    let kernel_allows = as_nobody(&["unshare", "--user", "--map-root-user", "--mount", "true"])
        .status
        .success();
    let out = as_nobody(&[DEVSTACK, "demo", "--json"]);
    if kernel_allows {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["pods"].as_array().unwrap().len(), 3);
        assert_eq!(report["volumes_left"], 0);
    } else {
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("needs root") && err.contains("user namespace"),
            "{err}"
        );
    }
}

/// `bench` with pods arriving one by one at real size runs the whole path for each volume kind
/// asked for and reports the daemons against their own cryptography (a smoke run: 3 pods; the
/// figures are for people).
#[test]
fn bench_reports_arrivals_of_real_size_pods() {
    let out = Command::new(DEVSTACK)
        .args([
            "bench",
            "--pods",
            "3",
            "--arrival",
            "20ms",
            "--pod-size",
            "real",
            "--volume",
            "flex,csi-files",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let reports: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let volumes: Vec<&str> = reports
        .iter()
        .map(|r| r["volume"].as_str().unwrap())
        .collect();
    assert_eq!(volumes, ["flex", "csi-files"]);
    for report in &reports {
        assert_eq!(report["pods"], 3);
        assert_eq!(report["arrival_ms"], 20.0);
        assert_eq!(report["pod_size"], "real");
        let daemons = report["daemons"].as_array().unwrap();
        let names: Vec<&str> = daemons
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "agent",
                "jwt-service",
                "callback",
                "agent + jwt-service + callback"
            ]
        );
        for d in daemons {
            assert!(d["floor_ms"].as_f64().unwrap() > 0.0, "{d}");
        }
        assert!(report["latency_ms"]["p50"].as_f64().unwrap() > 0.0);
        assert!(report["system"]["ratio"].as_f64().unwrap() > 0.0);
        // the agent's own upstream histogram, read from its metrics page: one registration
        // with ZTS per pod at least, each taking some time
        let registrations = &report["agent_upstreams"]["zts_register"];
        assert!(
            registrations["calls"].as_u64().unwrap() >= 3,
            "{}",
            report["agent_upstreams"]
        );
        assert!(registrations["mean_ms"].as_f64().unwrap() > 0.0);
    }
    // flex pays a driver and a SIA process per pod; files mode none
    assert!(reports[0]["per_pod_process_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(reports[1]["per_pod_process_ms"], 0.0);
    // unmounting is measured apart: flex execs the driver once more per pod, files mode nothing
    // (the agent unpublishes; its share may be under the clock tick with 3 pods)
    assert!(
        reports[0]["unmount"]["per_pod_process_ms"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{}",
        reports[0]["unmount"]
    );
    assert_eq!(reports[1]["unmount"]["per_pod_process_ms"], 0.0);
    for report in &reports {
        assert!(report["unmount"]["agent_ms"].as_f64().unwrap() >= 0.0);
    }
    // the node's share is the agent plus the per-pod processes, against the whole floor
    for report in &reports {
        let agent = report["daemons"][0]["cpu_per_identity_ms"]
            .as_f64()
            .unwrap();
        let per_pod = report["per_pod_process_ms"].as_f64().unwrap();
        let node = &report["node"];
        let cpu = node["cpu_per_identity_ms"].as_f64().unwrap();
        assert!((cpu - (agent + per_pod)).abs() < 1e-9, "{node}");
        assert_eq!(node["floor_ms"], report["crypto_floor"]["total_ms"]);
        assert!(
            node["floor_ms"].as_f64().unwrap() > report["system"]["floor_ms"].as_f64().unwrap(),
            "the whole floor holds ZTS's steps too: {report}"
        );
        assert!(node["ratio"].as_f64().unwrap() > 0.0);
    }
    // where mount -> files went: the driver, the SIA as it reports its own time, and its start;
    // each part lies within the whole (the slowest part no slower than the slowest pod)
    let flex = &reports[0]["latency_parts_ms"];
    let total_max = reports[0]["latency_ms"]["max"].as_f64().unwrap();
    for part in ["mount", "sia", "sia_process_start"] {
        let p50 = flex[part]["p50"].as_f64().unwrap();
        let max = flex[part]["max"].as_f64().unwrap();
        assert!(p50 > 0.0 && max <= total_max, "{part}: {flex}");
    }
    let files = &reports[1]["latency_parts_ms"];
    assert_eq!(
        files["mount"]["max"], reports[1]["latency_ms"]["max"],
        "{files}"
    );
    assert_eq!(files["sia"], serde_json::Value::Null);
    assert_eq!(files["sia_process_start"], serde_json::Value::Null);

    let out = Command::new(DEVSTACK)
        .args(["bench", "--pods", "1", "--arrival", "soon"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--arrival") && err.contains("soon"), "{err}");
}

/// A short soak: one-minute certificates refreshed several times by every pod's sidecar while
/// the daemons are sampled; it passes, counts the refreshes it saw in the pods' files, and writes
/// the series as CSV.
#[test]
fn soak_samples_every_daemon_and_sees_the_pods_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("series.csv");
    let out = Command::new(DEVSTACK)
        .args([
            "soak",
            // the warm-up covers each pod's first refresh (at 70 % of the minute: ZTS does not
            // backdate a certificate), so the baseline is a refresher that has refreshed; the
            // second refresh (84 s) is then judged against it
            "--duration=105s",
            "--pods=3",
            "--sample=15s",
            "--warmup=45s",
            "--json",
        ])
        .arg(format!("--csv={}", csv.display()))
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success(), "{report}");
    assert_eq!(report["passed"], true, "{report}");
    assert_eq!(report["lifetime_seconds"], 60);
    assert_eq!(report["expired_reads"], 0);
    assert_eq!(report["torn_reads"], 0);
    // 75 s of one-minute certificates: every pod refreshed at least once
    assert!(report["rotations_seen"].as_u64().unwrap() >= 3, "{report}");
    let series = report["series"].as_object().unwrap();
    for name in [
        "agent",
        "zts",
        "callback",
        "jwt-service",
        "sia-refresh (max)",
    ] {
        let points = series[name].as_array().unwrap();
        assert!(points.len() >= 5, "{name}: {points:?}");
        assert!(points.iter().all(|p| p["rss_kib"].as_u64().unwrap() > 0
            && p["fds"].as_u64().unwrap() > 0
            && p["threads"].as_u64().unwrap() > 0));
    }
    let rows: usize = series.values().map(|p| p.as_array().unwrap().len()).sum();
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("process,at_seconds,rss_kib,fds,threads\n"));
    assert_eq!(text.lines().count(), rows + 1);
}
