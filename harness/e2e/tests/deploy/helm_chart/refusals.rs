//! What the chart refuses, each naming the value: an install that could not work, values its
//! schema does not allow (keys as values: `keys.rs`; egress to any address: `egress.rs`).

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
        // a platform the image does not hold: its pods would wait on such nodes for ever
        (
            vec!["--set", "image.architectures={s390x}"],
            "architectures",
        ),
        (vec!["--set", "image.architectures=null"], "architectures"),
        (vec!["--set", "image.architectures={}"], "architectures"),
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
