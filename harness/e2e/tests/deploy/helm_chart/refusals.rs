//! What the chart refuses, each naming the value: an install that could not work, keys as
//! values outside the control plane's namespace, values its schema does not allow.

use super::kustomize::key;
use super::render::{
    BASE_URL_VALUE, INSTALL_ZTS_URL, helm_template, helm_template_error, helm_template_error_bare,
};

/// An install that could not work is refused, naming the value: the defaults alone (no ZTS URL,
/// no CA), the documentation's example URL, and names that disagree with each other.
#[test]
fn an_install_that_could_not_work_is_refused_by_name() {
    let err = helm_template_error_bare(&[]);
    assert!(err.contains("ztsUrl: give your ZTS's base URL"), "{err}");
    let url = format!("ztsUrl={INSTALL_ZTS_URL}");
    let err = helm_template_error_bare(&["--set", &url]);
    assert!(err.contains("ztsCa: give the Athenz CA bundle"), "{err}");
    let not_a_ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_a_ca.path(), "not a certificate").unwrap();
    let bad_ca = format!("ztsCa={}", not_a_ca.path().display());
    // (Helm applies --set-file after --set: this replaces the required CA)
    let err = helm_template_error(&["--set-file", &bad_ca]);
    assert!(err.contains("ztsCa: give the Athenz CA bundle"), "{err}");

    // with both given, what must agree with what
    for (args, named) in [
        (vec!["--set", BASE_URL_VALUE], "example host"),
        (
            vec!["--set", "adminDomain=acme.k8s"],
            "controlPlaneNamespace \"k8s-admin\": must be adminDomain \"acme.k8s\" with dashes for dots, \"acme-k8s\"",
        ),
        (
            vec!["--set", "provider=k8s.admin.provider"],
            "provider \"k8s.admin.provider\": must be \"k8s.admin.athenz-callback\"",
        ),
        (
            vec!["--set", "agentNamespace=k8s-admin"],
            "agentNamespace \"k8s-admin\": must differ",
        ),
        (
            vec![
                "--namespace",
                "k8s-admin",
                "--set",
                "serviceKeys.athenz-callback=a key",
                "--set",
                "existingSecrets.athenz-callback-key=mine",
            ],
            "serviceKeys.athenz-callback and existingSecrets.athenz-callback-key",
        ),
        (
            vec!["--set", "domainAnnotationAllow[0]=acme.*"],
            "domainAnnotationAllow: set components.domainAnnotations too",
        ),
    ] {
        let err = helm_template_error(&args);
        assert!(err.contains(named), "{args:?}: {err}");
    }
    // the three named together, as an operator of another admin domain sets them, install
    let other = helm_template(&[
        "--set",
        "adminDomain=acme.k8s",
        "--set",
        "controlPlaneNamespace=acme-k8s",
        "--set",
        "provider=acme.k8s.athenz-callback",
    ]);
    assert!(other.contains_key(&key("Deployment", "acme-k8s", "athenz-callback")));
}

/// Private keys as values only in a release of the control plane's namespace (Helm keeps values
/// in its release Secret there); the defaults need no key at all.
#[test]
fn keys_as_values_are_refused_outside_the_control_planes_namespace() {
    for (args, value) in [
        (
            vec!["--set", "serviceKeys.athenz-callback=a key"],
            "serviceKeys",
        ),
        (
            vec!["--set-string", "jwtSigningKeys.v1\\.pem=a key"],
            "jwtSigningKeys",
        ),
    ] {
        let err = helm_template_error(&[&["--namespace", "default"][..], &args[..]].concat());
        assert!(
            err.contains("serviceKeys / jwtSigningKeys") && err.contains("\"default\""),
            "{value}: {err}"
        );
    }
    // by default no key passes through the chart: the one Secret it makes is the initializer's
    // CA's, shipped without data (the initializer fills it in the cluster)
    let defaults = helm_template(&["--namespace", "default"]);
    let secrets: Vec<_> = defaults
        .iter()
        .filter(|((kind, _, _), _)| kind == "Secret")
        .collect();
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    let ((_, _, name), secret) = secrets[0];
    assert_eq!(name, "athenz-initializer-ca");
    assert!(
        secret.get("data").is_none() && secret.get("stringData").is_none(),
        "{secret}"
    );
}

/// values.schema.json refuses what the chart cannot use, naming it.
#[test]
fn the_schema_refuses_unknown_and_malformed_values() {
    for (args, named) in [
        (vec!["--set", "imagee.tag=1"], "imagee"),
        (vec!["--set", "image.digest=sha256:short"], "digest"),
        (vec!["--set", "ztsUrl=http://zts.example/zts/v1"], "ztsUrl"),
        (
            vec!["--set", "kubeletAuthorization=nodes/*"],
            "kubeletAuthorization",
        ),
        (vec!["--set", "components.flex=true"], "flex"),
        (vec!["--set", "agent.extraEnv[0].value=x"], "name"),
        (
            vec!["--set", "networkPolicies.ztsCidrs[0]=zts.example"],
            "ztsCidrs",
        ),
        (
            vec!["--set", "controlPlaneNamespace=K8s_Admin"],
            "controlPlaneNamespace",
        ),
    ] {
        let err = helm_template_error(&args);
        assert!(err.contains(named), "{args:?}: {err}");
    }
}
