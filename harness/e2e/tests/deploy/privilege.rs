//! Privilege: which namespace holds what, and where keys are (never the agent's).

use super::*;

/// Namespaces by privilege (Pod Security Standards): the agent alone in a `privileged`
/// namespace that holds no Secret; the control plane, its Secrets' consumers, in one that
/// enforces `restricted`, whose pods pass it.
#[test]
fn namespaces_are_split_by_privilege() {
    let docs = documents();
    let namespace_level = |name: &str| {
        docs.iter()
            .find(|(_, d)| d["kind"] == "Namespace" && d["metadata"]["name"] == name)
            .map(|(_, d)| {
                d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .unwrap_or_else(|| panic!("no Namespace {name}"))
    };
    let o = objects();
    let agent_ns = o.daemon_sets["athenz-agent"]
        .metadata
        .namespace
        .clone()
        .unwrap();
    assert_eq!(namespace_level(&agent_ns), "privileged");
    for (name, deployment) in &o.deployments {
        let ns = deployment.metadata.namespace.clone().unwrap();
        assert_ne!(ns, agent_ns, "{name} shares the privileged namespace");
        assert_eq!(namespace_level(&ns), "restricted", "{name}");
        // what "restricted" requires of every container
        let spec = deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        let pod_sc = spec.security_context.as_ref().unwrap();
        assert_eq!(pod_sc.run_as_non_root, Some(true), "{name}");
        assert_eq!(
            pod_sc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault",
            "{name}"
        );
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(
                sc.allow_privilege_escalation,
                Some(false),
                "{name}/{}",
                c.name
            );
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_owned()][..]),
                "{name}/{}",
                c.name
            );
            assert_ne!(sc.privileged, Some(true));
        }
        for v in spec.volumes.iter().flatten() {
            assert!(
                v.secret.is_some() || v.config_map.is_some() || v.empty_dir.is_some(),
                "{name}: volume {} is not of a restricted type",
                v.name
            );
        }
    }
    // no Secret is mounted in the agent's namespace
    let agent = o.daemon_sets["athenz-agent"]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    assert!(agent.volumes.iter().flatten().all(|v| v.secret.is_none()));
}

/// docs/design.md §4.9, §6: no secret is shared between nodes. No file in deploy/ holds a private
/// key, the agent mounts no Secret and no Secret named for the agent is referred to anywhere.
#[test]
fn no_file_holds_or_mounts_a_key_for_the_agent() {
    let mut files = vec![
        deploy_dir().join("kustomization.yaml"),
        deploy_dir().join("Dockerfile"),
        deploy_dir().join("overlays/local/kustomization.yaml"),
    ];
    files.extend(
        std::fs::read_dir(deploy_dir().join("base"))
            .unwrap()
            .map(|e| e.unwrap().path()),
    );
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            !text.contains("PRIVATE KEY-----"),
            "{} holds a private key",
            file.display()
        );
        assert!(
            !text.contains("athenz-agent-key"),
            "{} refers to an agent key Secret",
            file.display()
        );
    }
    let o = objects();
    let spec = o.daemon_sets["athenz-agent"]
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap();
    for volume in spec.volumes.iter().flatten() {
        assert!(
            volume.secret.is_none(),
            "the agent mounts Secret volume {}",
            volume.name
        );
        for source in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            assert!(
                source.secret.is_none(),
                "the agent projects a Secret in {}",
                volume.name
            );
        }
    }
    for container in containers(&spec) {
        for var in container.env.iter().flatten() {
            assert!(
                var.value_from
                    .as_ref()
                    .is_none_or(|f| f.secret_key_ref.is_none()),
                "{} reads a Secret into {}",
                container.name,
                var.name
            );
            assert!(
                !var.name.contains("KEY_FILE"),
                "{}: {}",
                container.name,
                var.name
            );
        }
        assert!(
            container
                .env_from
                .iter()
                .flatten()
                .all(|e| e.secret_ref.is_none())
        );
    }
}
