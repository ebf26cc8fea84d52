//! The alert rules of `deploy/monitoring/prometheus-rule.yaml` behave as their runbook says,
//! judged by Prometheus's own rule engine: `promtool test rules` runs each unit test file of
//! `deploy/monitoring/tests/` (Prometheus's rule test format: input series, the alerts expected
//! at each time, their labels and annotations) against the rule file's `spec`. promtool comes
//! from Debian's `prometheus` package (harness/setup installs it); a missing promtool fails the
//! test naming the package.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn deploy() -> PathBuf {
    athenz_testbed::bins::repo_root().join("deploy")
}

/// `promtool`, or a failure naming where it comes from.
fn promtool() -> PathBuf {
    let path = PathBuf::from("/usr/bin/promtool");
    assert!(
        path.is_file(),
        "promtool is missing: install Debian's prometheus package (harness/setup does)"
    );
    path
}

/// A directory holding `rules.yaml` (the PrometheusRule's `spec`; JSON is YAML) and a copy of
/// every unit test file.
fn test_dir() -> (tempfile::TempDir, Vec<String>) {
    let text = std::fs::read_to_string(deploy().join("monitoring/prometheus-rule.yaml")).unwrap();
    let rule: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_json::to_vec(&rule["spec"]).unwrap(),
    )
    .unwrap();
    let mut tests = Vec::new();
    for entry in std::fs::read_dir(deploy().join("monitoring/tests")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".test.yaml") {
            std::fs::copy(entry.path(), dir.path().join(&name)).unwrap();
            tests.push(name);
        }
    }
    tests.sort();
    (dir, tests)
}

#[test]
fn the_rules_pass_promtools_check() {
    let (dir, _) = test_dir();
    let out = Command::new(promtool())
        .args(["check", "rules", "rules.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One agent stopped on a three-node cluster fires the per-node alert for that node alone; a
/// node whose agent pod is gone fires the DaemonSet's; none scraped fires the cluster's.
#[test]
fn the_per_node_agent_alerts_fire_for_the_node_whose_agent_is_down() {
    let (dir, tests) = test_dir();
    assert!(tests.contains(&"agents.test.yaml".to_owned()), "{tests:?}");
    let out = Command::new(promtool())
        .args(["test", "rules"])
        .args(&tests)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.contains("SUCCESS"), "{said}");
}

/// The unit tests can fail: a rule file whose per-node alert no longer selects a stopped agent
/// (its expression broken as an edit might) fails them.
#[test]
fn a_broken_per_node_rule_fails_the_unit_tests() {
    let (dir, tests) = test_dir();
    let rules = std::fs::read_to_string(dir.path().join("rules.yaml")).unwrap();
    let broken = rules.replace(
        r#"up{job=\"athenz-system/athenz-agent\"} == 0"#,
        r#"up{job=\"athenz-system/athenz-agent\"} == 2"#,
    );
    assert_ne!(broken, rules, "the per-node expression was not found");
    std::fs::write(dir.path().join("rules.yaml"), broken).unwrap();
    let out = Command::new(promtool())
        .args(["test", "rules"])
        .args(&tests)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "promtool passed a broken rule: {said}"
    );
    assert!(said.contains("alertname: AthenzAgentDown"), "{said}");
}
