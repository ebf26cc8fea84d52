//! The alert rules of `deploy/monitoring/prometheus-rule.yaml` behave as their runbook says,
//! judged by Prometheus's own rule engine: `promtool test rules` runs each unit test file of
//! `deploy/monitoring/tests/` (Prometheus's rule test format: input series, the alerts expected
//! at each time, their labels and annotations) against the rule file's `spec`. promtool comes
//! from Debian's `prometheus` package (harness/setup installs it); a missing promtool fails the
//! test naming the package.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
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

/// `promtool <args>` in `dir`: whether it passed, and what it printed.
fn promtool_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// `promtool test rules <tests>` in `dir`.
fn test_rules(dir: &Path, tests: &[String]) -> (bool, String) {
    let args: Vec<&str> = ["test", "rules"]
        .into_iter()
        .chain(tests.iter().map(String::as_str))
        .collect();
    promtool_in(dir, &args)
}

#[test]
fn the_rules_pass_promtools_check() {
    let (dir, _) = test_dir();
    let (passed, said) = promtool_in(dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(passed, "{said}");
}

/// One agent stopped on a three-node cluster fires the per-node alert for that node alone; a
/// node whose agent pod is gone fires the DaemonSet's; none scraped fires the cluster's.
#[test]
fn the_per_node_agent_alerts_fire_for_the_node_whose_agent_is_down() {
    let (dir, tests) = test_dir();
    assert!(tests.contains(&"agents.test.yaml".to_owned()), "{tests:?}");
    assert!(
        tests.contains(&"initializer.test.yaml".to_owned()),
        "{tests:?}"
    );
    let (passed, said) = test_rules(dir.path(), &tests);
    assert!(passed && said.contains("SUCCESS"), "{said}");
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
    let (passed, said) = test_rules(dir.path(), &tests);
    assert!(!passed, "promtool passed a broken rule: {said}");
    assert!(said.contains("alertname: AthenzAgentDown"), "{said}");
}
