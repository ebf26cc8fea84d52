//! docs/operating.md as the install's script: the shell blocks of its sections ("Install",
//! "Uninstall") are what `cluster up` and the real-cluster test run, verbatim, and its "Metrics"
//! tables are what the test holds each daemon's `/metrics` to. The page is compiled in, so the
//! binary runs the steps of the docs it was built with.

use std::collections::{BTreeMap, BTreeSet};

/// docs/operating.md.
pub const OPERATING: &str = include_str!("../../../../docs/operating.md");

/// The text of the `## <heading>` section of `doc` (up to the next `## `), if there is one.
fn section<'a>(doc: &'a str, heading: &str) -> Option<&'a str> {
    let start = doc.find(&format!("\n## {heading}\n"))? + 1;
    let body = &doc[start..];
    let end = body[3..].find("\n## ").map_or(body.len(), |at| at + 4);
    Some(&body[..end])
}

/// The ```` ```sh ```` blocks of section `heading`, in order, with those tagged
/// ```` ```sh <variant> ```` for this `variant` (e.g. `helm`) and none tagged for another (other
/// fences, e.g. `console`, are for reading, not running).
pub fn shell_blocks(doc: &str, heading: &str, variant: &str) -> Vec<String> {
    let Some(text) = section(doc, heading) else {
        return Vec::new();
    };
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let runs = |info: &str| info == "sh" || info == format!("sh {variant}");
        match (&mut current, line.trim_end()) {
            (None, fence) if fence.strip_prefix("```").is_some_and(runs) => {
                current = Some(String::new());
            }
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// README.md, whose install lines must be the page's (a newcomer pastes them).
pub const README: &str = include_str!("../../../../README.md");

/// The first `helm upgrade --install` command of `doc`'s shell blocks, its continuation lines
/// joined and its white space collapsed, so two pages' commands compare as a shell reads them.
pub fn helm_install_command(doc: &str) -> Option<String> {
    let mut in_block = false;
    let mut command: Option<String> = None;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block && line.trim_start().starts_with("```sh");
            continue;
        }
        if !in_block {
            continue;
        }
        let code = line.split(" #").next().unwrap_or(line).trim();
        match &mut command {
            None if code.starts_with("helm upgrade --install") => command = Some(String::new()),
            None => continue,
            Some(_) => {}
        }
        let text = command.get_or_insert_with(String::new);
        let (part, continues) = match code.strip_suffix('\\') {
            Some(part) => (part, true),
            None => (code, false),
        };
        text.push_str(part);
        text.push(' ');
        if !continues {
            break;
        }
    }
    command.map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The metric names the "Metrics" section lists, by the daemon whose `### <daemon>` table lists
/// them (a name is a table row's first cell, in backquotes).
pub fn metrics_reference(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    metric_rows(doc)
        .into_iter()
        .map(|(daemon, rows)| (daemon, rows.into_keys().collect()))
        .collect()
}

/// The names the "Metrics" section lists that are labelled families (the table's third cell,
/// the labels, is not empty): such a family is served from its first sample on, so a daemon
/// that has not yet, e.g., refused anything, does not serve it yet.
pub fn labelled_metrics(doc: &str) -> BTreeSet<String> {
    metric_rows(doc)
        .into_values()
        .flatten()
        .filter(|(_, labelled)| *labelled)
        .map(|(name, _)| name)
        .collect()
}

/// Each daemon's rows: metric name → whether it has labels.
fn metric_rows(doc: &str) -> BTreeMap<String, BTreeMap<String, bool>> {
    let mut reference: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    let Some(text) = section(doc, "Metrics") else {
        return reference;
    };
    let mut daemon = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("### ") {
            daemon = Some(name.trim().to_owned());
        } else if let (Some(daemon), Some(row)) = (&daemon, line.strip_prefix("| `"))
            && let Some((name, rest)) = row.split_once('`')
        {
            let labels = rest.split('|').nth(2).unwrap_or("").trim();
            reference
                .entry(daemon.clone())
                .or_default()
                .insert(name.to_owned(), !labels.is_empty());
        }
    }
    reference
}

/// The metric names a Prometheus text exposition serves, as they are queried: a counter's
/// samples are `<name>_total` (OpenMetrics), every other family's samples carry its name.
pub fn served_metrics(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| {
            if kind.trim() == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's Helm line is the page's, which the real-cluster installers' test runs after
    /// the page's other steps: pasted, it installs (with the values the chart requires).
    #[test]
    fn the_readmes_helm_command_is_the_one_the_page_runs() {
        let page = shell_blocks(OPERATING, "Install with Helm", "helm").concat();
        let from_page = helm_install_command(&format!("```sh\n{page}```\n")).unwrap();
        let from_readme = helm_install_command(README).expect("README.md has a helm command");
        assert_eq!(from_readme, from_page);
        for required in ["namespaces.create=false", "ztsUrl=", "ztsCa="] {
            assert!(from_page.contains(required), "{required}: {from_page}");
        }
        assert_eq!(
            helm_install_command("```sh\nhelm upgrade --install a b \\\n  --set x=1 # why\n```\n"),
            Some("helm upgrade --install a b --set x=1".to_owned())
        );
        assert_eq!(
            helm_install_command("`helm upgrade --install a` in prose"),
            None
        );
    }

    #[test]
    fn the_install_and_uninstall_sections_have_their_scripts() {
        let install = shell_blocks(OPERATING, "Install", "kustomize");
        assert_eq!(install.len(), 2, "{install:#?}");
        assert!(install[1].contains("kubectl apply -k"));
        let helm = shell_blocks(OPERATING, "Install with Helm", "helm");
        assert_eq!(helm.len(), 1, "{helm:#?}");
        assert!(helm[0].contains("helm upgrade --install"));
        // each installer's uninstall: the webhook, its own removal, the node's files
        for (variant, removal) in [
            ("kustomize", "kubectl delete -k"),
            ("helm", "helm uninstall"),
        ] {
            let uninstall = shell_blocks(OPERATING, "Uninstall", variant);
            assert_eq!(uninstall.len(), 3, "{variant}: {uninstall:#?}");
            assert!(uninstall[0].contains("mutatingwebhookconfiguration"));
            assert!(uninstall[1].contains(removal), "{variant}: {uninstall:#?}");
            assert!(uninstall[2].contains("rm -rf /var/athenz"));
        }
        // a console block is not run
        assert!(shell_blocks(OPERATING, "Upgrade and rollback", "kustomize").is_empty());
        assert!(shell_blocks(OPERATING, "No such section", "kustomize").is_empty());
    }

    /// The page's way to open the seals a killed agent left closed, run as written (its volumes
    /// dir moved into a temporary one) on a sealed files-mode tmpfs beside a plain directory:
    /// the tmpfs takes writes again; the directory is skipped (real mounts: needs root).
    #[test]
    fn the_pages_seal_opening_opens_a_sealed_tmpfs() {
        use athenz_core::volume_mount::seal::is_sealed;
        use nix::mount::{MsFlags, mount, umount};
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts a tmpfs and must run as root"
        );
        let blocks = shell_blocks(OPERATING, "Upgrade and rollback", "node");
        assert_eq!(blocks.len(), 1, "{blocks:#?}");
        let tmp = tempfile::tempdir().unwrap();
        let volumes = tmp.path().join("volumes");
        let (sealed, plain) = (volumes.join("a/files"), volumes.join("b/files"));
        std::fs::create_dir_all(&sealed).unwrap();
        std::fs::create_dir_all(&plain).unwrap();
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(
            Some("athenz-identity"),
            &sealed,
            Some("tmpfs"),
            flags,
            Some("size=65536"),
        )
        .unwrap();
        mount(
            None::<&str>,
            &sealed,
            None::<&str>,
            flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .unwrap();
        assert!(is_sealed(&sealed).unwrap());
        let script = blocks[0].replace("/var/athenz/volumes", volumes.to_str().unwrap());
        assert_ne!(script, blocks[0], "the block names the default volumes dir");
        let out = std::process::Command::new("sh")
            .args(["-ec", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(!is_sealed(&sealed).unwrap(), "opened");
        std::fs::write(sealed.join("next-set"), b"x").unwrap();
        umount(&sealed).unwrap();
    }

    #[test]
    fn blocks_and_tables_are_read_exactly() {
        let doc = "intro\n## A\n```sh\necho one\n```\n```console\nnot run\n```\n```sh\necho two\n\
                   ```\n## Metrics\n### d1\n| metric | type |\n|---|---|\n| `m_total` | counter |\n\
                   ### d2\n| `g` | gauge |\n## After\n| `not_a_metric` | x |\n";
        assert_eq!(shell_blocks(doc, "A", "x"), ["echo one\n", "echo two\n"]);
        let reference = metrics_reference(doc);
        assert_eq!(
            labelled_metrics(doc),
            BTreeSet::new(),
            "no labels cell: none"
        );
        let labelled = "x\n## Metrics\n### d\n| `a_total` | counter | `route` | what |\n\
                        | `b` | gauge | | what |\n";
        assert_eq!(
            labelled_metrics(labelled),
            BTreeSet::from(["a_total".to_owned()])
        );
        assert_eq!(reference["d1"], BTreeSet::from(["m_total".to_owned()]));
        assert_eq!(reference["d2"], BTreeSet::from(["g".to_owned()]));
        assert_eq!(reference.len(), 2);
        // an unterminated block is not run
        assert!(shell_blocks("x\n## A\n```sh\nrm -rf /\n", "A", "x").is_empty());
        // a block tagged for another variant is not run
        let tagged = "x\n## A\n```sh helm\nhelm\n```\n```sh kustomize\nkubectl\n```\n";
        assert_eq!(shell_blocks(tagged, "A", "helm"), ["helm\n"]);
        assert_eq!(shell_blocks(tagged, "A", "kustomize"), ["kubectl\n"]);
    }

    #[test]
    fn served_names_are_the_queried_ones() {
        let text = "# HELP a_total x\n# TYPE a counter\na_total 1\n# TYPE b gauge\nb 2\n\
                    # TYPE c histogram\nc_bucket{le=\"1\"} 0\n# EOF\n";
        assert_eq!(
            served_metrics(text),
            BTreeSet::from(["a_total".to_owned(), "b".to_owned(), "c".to_owned()])
        );
    }

    #[test]
    fn the_reference_covers_the_four_daemons_and_the_control_sia() {
        let reference = metrics_reference(OPERATING);
        let daemons: Vec<_> = reference.keys().cloned().collect();
        assert_eq!(
            daemons,
            [
                "athenz-callback",
                "athenz-control-sia",
                "athenz-identity-agent",
                "athenz-initializer",
                "athenz-jwt-service"
            ]
        );
        assert!(reference.values().all(|names| names.len() >= 3));
    }
}
