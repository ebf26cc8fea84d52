//! The docs cannot fall behind the binaries: every flag a binary's `--help` lists (and every
//! subcommand's) is on that binary's page in `docs/binaries/`, and README.md stays the short page
//! a newcomer reads first. `--help` and `--version` themselves are documented once, for all, in
//! `docs/binaries/README.md`. (`athenz-daemons`' own flags: `daemons/tests/cli.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

mod common;
/// The devstack binary: it runs every component under its name.
use common::devstack_binary as devstack;

fn repo() -> PathBuf {
    athenz_testbed::bins::repo_root()
}

/// `<name> <args> --help`: its text.
fn help(name: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(devstack())
        .arg0(name)
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The long flags of a help text's option lines (`  -k, --key <KEY>`, `      --json`).
fn flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = match line.strip_prefix('-') {
                Some(short) if !short.starts_with('-') => short.split_once(", ")?.1,
                _ => line,
            };
            let flag = line.strip_prefix("--")?;
            let name: String = flag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

/// The subcommands a clap help text lists under `Commands:` (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// Every flag of `name` (and of each subcommand, and `extra` subcommands clap does not list).
fn all_flags(name: &str, extra: &[&str]) -> BTreeSet<String> {
    let top = help(name, &[]);
    let mut all = flags(&top);
    let mut subs = subcommands(&top);
    subs.extend(extra.iter().map(|s| s.to_string()));
    for sub in subs {
        all.extend(flags(&help(name, &[&sub])));
    }
    all
}

#[test]
fn every_flag_each_binary_lists_is_on_its_page() {
    let binaries: [(&str, &[&str]); 9] = [
        ("athenz-volume-driver", &[]),
        ("athenz-identity-agent", &["status"]),
        ("athenz-sia", &[]),
        ("athenz-control-sia", &[]),
        ("athenz-jwt-service", &[]),
        ("athenz-callback", &[]),
        ("athenz-initializer", &[]),
        ("athenz-node-authorizer", &[]),
        ("athenz-devstack", &[]),
    ];
    let (mut missing, mut checked) = (Vec::new(), 0);
    for (name, extra) in binaries {
        let page_path = repo().join(format!("docs/binaries/{name}.md"));
        let page = std::fs::read_to_string(&page_path)
            .unwrap_or_else(|e| panic!("{}: {e}", page_path.display()));
        let shared = std::fs::read_to_string(repo().join("docs/binaries/README.md")).unwrap();
        let listed = all_flags(name, extra);
        checked += listed.len();
        for flag in listed {
            // a flag of the settings every TLS daemon shares may be documented once, there
            let on_page = |text: &str| {
                text.match_indices(&flag).any(|(at, _)| {
                    !text[at + flag.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                })
            };
            if !on_page(&page) && !on_page(&shared) {
                missing.push(format!("{name} {flag}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "flags --help lists that docs/binaries/ does not: {missing:#?}"
    );
    // the reader found the flags (the driver alone has none but --help and --version)
    assert!(
        checked > 100,
        "only {checked} flags read from the help texts"
    );
}

#[test]
fn the_flag_reader_reads_clap_and_the_drivers_help() {
    let text = "Options:\n  -k, --key <KEY>  a key\n      --json  as JSON\n  -h, --help  help\n  -V, --version\n";
    assert_eq!(
        flags(text),
        BTreeSet::from(["--key".to_owned(), "--json".to_owned()])
    );
    let text = "Commands:\n  init     a\n  refresh  b\n  help     c\n\nOptions:\n";
    assert_eq!(subcommands(text), ["init", "refresh"]);
    // the driver's and the agent's real help texts have flags to read
    assert!(flags(&help("athenz-identity-agent", &[])).contains("--agent-dir"));
    assert!(subcommands(&help("athenz-sia", &[])).contains(&"init".to_owned()));
}

#[test]
fn the_readme_is_a_newcomers_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move detail to docs/"
    );
    // it names the test command CI runs, and every page it links to exists
    assert!(
        readme
            .lines()
            .any(|l| l == "harness/setup && cargo test --workspace --locked")
    );
    for link in readme.split("](").skip(1) {
        let target = link.split([')', '#']).next().unwrap();
        if target.starts_with("http") || target.is_empty() {
            continue;
        }
        assert!(repo().join(target).exists(), "README.md links to {target}");
    }
    for page in [
        "SECURITY.md",
        "CHANGELOG.md",
        "docs/architecture.md",
        "docs/operating.md",
        "docs/benchmarks.md",
        "docs/development.md",
    ] {
        assert!(readme.contains(page), "README.md does not point to {page}");
    }
}

/// Every metric the alert rules (`deploy/monitoring/prometheus-rule.yaml`) query is one the
/// metrics reference in docs/operating.md lists (which the real-node test holds to what each
/// daemon serves), and every alert explains itself.
#[test]
fn the_alert_rules_query_documented_metrics() {
    let text =
        std::fs::read_to_string(repo().join("deploy/monitoring/prometheus-rule.yaml")).unwrap();
    let rule: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    let documented: BTreeSet<String> = athenz_devstack::cluster::runbook::metrics_reference(
        athenz_devstack::cluster::runbook::OPERATING,
    )
    .into_values()
    .flatten()
    .collect();
    // the jobs the PodMonitors make (the Prometheus Operator's `<namespace>/<name>`)
    let monitors_text =
        std::fs::read_to_string(repo().join("deploy/monitoring/pod-monitors.yaml")).unwrap();
    let monitors: Vec<String> = serde_saphyr::from_multiple::<serde_json::Value>(&monitors_text)
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "PodMonitor")
        .map(|d| {
            format!(
                "{}/{}",
                d["metadata"]["namespace"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert!(monitors.len() >= 5, "{monitors:?}");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert!(rules.len() >= 8, "{} rules", rules.len());
    for alert in rules {
        let name = alert["alert"].as_str().unwrap();
        let expr = alert["expr"].as_str().unwrap();
        let queried: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("athenz_"))
            .collect();
        // a target alert queries Prometheus's own `up` of one of our PodMonitors' jobs (all
        // gone, or one down); the agents' DaemonSet alert, kube-state-metrics' counts of it
        let our_job = monitors
            .iter()
            .any(|job| expr.contains(&format!("up{{job=\"{job}\"}}")));
        let target =
            our_job && (expr.starts_with("absent(up{job=\"") || expr.starts_with("up{job=\""));
        let daemonset = expr.contains("kube_daemonset_status_desired_number_scheduled{namespace=\"athenz-system\",daemonset=\"athenz-agent\"}");
        assert!(
            !queried.is_empty() || target || daemonset,
            "{name} queries none of our metrics nor a job of deploy/monitoring: {expr}"
        );
        // every alert says in a line what broke, and links its runbook entry on the page
        assert!(
            alert["annotations"]["summary"]
                .as_str()
                .is_some_and(|s| !s.is_empty() && !s.contains('\n')),
            "{name} has no one-line summary"
        );
        let runbook = alert["annotations"]["runbook_url"].as_str().unwrap_or("");
        assert_eq!(
            runbook,
            format!(
                "https://github.com/athenz-k8s-identity/athenz-k8s-identity/blob/main/docs/operating.md#{}",
                name.to_lowercase()
            ),
            "{name}'s runbook_url"
        );
        assert!(
            athenz_devstack::cluster::runbook::OPERATING.contains("\n## Runbook\n")
                && athenz_devstack::cluster::runbook::OPERATING
                    .contains(&format!("\n### {name}\n")),
            "docs/operating.md's Runbook has no entry for {name}"
        );
        for metric in queried {
            assert!(
                documented.contains(metric),
                "{name} queries {metric}, which docs/operating.md does not list"
            );
        }
        assert!(
            alert["annotations"]["description"]
                .as_str()
                .is_some_and(|d| d.len() > 40),
            "{name} has no description"
        );
        assert!(alert["labels"]["severity"].is_string(), "{name}");
    }
}

/// Every query of the Grafana dashboard (`deploy/monitoring/dashboard.yaml`) names metrics
/// docs/operating.md lists (a histogram's `_bucket` series by its family's name) or the `up` of
/// one of our PodMonitors' jobs, and every panel has a query.
#[test]
fn the_dashboard_queries_documented_metrics() {
    let text = std::fs::read_to_string(repo().join("deploy/monitoring/dashboard.yaml")).unwrap();
    let config: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(config["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: serde_json::Value =
        serde_json::from_str(config["data"]["athenz-k8s-identity.json"].as_str().unwrap()).unwrap();
    let documented: BTreeSet<String> = athenz_devstack::cluster::runbook::metrics_reference(
        athenz_devstack::cluster::runbook::OPERATING,
    )
    .into_values()
    .flatten()
    .collect();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let queried: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("athenz_"))
                .collect();
            assert!(
                !queried.is_empty() || expr.starts_with("up{job=\"athenz-system/"),
                "{title} queries none of our metrics: {expr}"
            );
            for metric in queried {
                let family = metric.strip_suffix("_bucket").unwrap_or(metric);
                assert!(
                    documented.contains(family),
                    "{title} queries {metric}, which docs/operating.md does not list"
                );
            }
        }
    }
}
