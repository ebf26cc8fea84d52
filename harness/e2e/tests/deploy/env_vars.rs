//! Every environment variable the manifests set is one its binary reads.

use super::*;

/// Every environment variable the manifests set on a component is one its binary reads (as
/// `--help` lists them), so a misspelt setting cannot be silently ignored.
#[test]
fn every_environment_variable_is_read_by_its_binary() {
    let o = objects();
    let mut specs: Vec<k8s_openapi::api::core::v1::PodSpec> = o
        .deployments
        .values()
        .map(|d| d.spec.clone().unwrap().template.spec.unwrap())
        .collect();
    specs.extend(
        o.daemon_sets
            .values()
            .map(|d| d.spec.clone().unwrap().template.spec.unwrap()),
    );
    let cluster = o.config_maps["athenz-cluster"].data.clone().unwrap();
    let devstack = athenz_testbed::bins::built("athenz-devstack");
    let bin = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for spec in specs {
        // ours (the sig-storage sidecars are not)
        for container in containers(&spec)
            .into_iter()
            .filter(|c| c.image.as_deref() == Some(IMAGE.as_str()))
        {
            let command = container.command.clone().unwrap();
            let link = bin.path().join(&command[0]);
            if !link.exists() {
                std::os::unix::fs::symlink(&devstack, &link).unwrap();
            }
            let mut help_args: Vec<String> = command[1..].to_vec();
            help_args.push("--help".into());
            let out = std::process::Command::new(&link)
                .args(&help_args)
                .output()
                .unwrap();
            let help = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{command:?} --help: {help}");
            let mut names: Vec<String> = container
                .env
                .iter()
                .flatten()
                .map(|e| e.name.clone())
                .collect();
            if container.env_from.is_some() {
                // the shared settings are read by some components only; each must be read by one
                names.extend(
                    cluster
                        .keys()
                        .filter(|k| help.contains(&format!("[env: {k}=")))
                        .cloned(),
                );
            }
            for name in names {
                // variables only used to build others ($(NODE_IP)) are not settings
                if name == "NODE_IP" {
                    continue;
                }
                assert!(
                    help.contains(&format!("[env: {name}="))
                        || help.contains(&format!("[env: {name}]")),
                    "{} ({command:?}) sets {name}, which the binary does not read",
                    container.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 40, "{checked}");
    // and each shared setting is read by at least one component
    let all_help: String = [
        "athenz-identity-agent",
        "athenz-callback",
        "athenz-control-sia",
        "athenz-initializer",
    ]
    .iter()
    .map(|b| {
        let link = bin.path().join(b);
        let args: &[&str] = if *b == "athenz-control-sia" {
            &["init", "--help"]
        } else {
            &["--help"]
        };
        String::from_utf8_lossy(
            &std::process::Command::new(link)
                .args(args)
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned()
    })
    .collect();
    for key in cluster.keys() {
        assert!(
            all_help.contains(&format!("[env: {key}")),
            "no component reads {key}"
        );
    }
}
