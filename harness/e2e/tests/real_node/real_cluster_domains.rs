//! Domains an Athenz shop already has, on a real node (docs/design.md §3): with the release
//! installed with `deploy/components/domain-annotations` and `DOMAIN_ANNOTATION_ALLOW=acme.*` (as
//! docs/operating.md "Domain names" tells an operator), a namespace `payments-prod` annotated
//! `athenz.io/domain: acme.payments` gets certificates for `acme.payments.<service account>` in
//! csi-socket mode and in csi-files mode (issued when the pod is bound, so the agent's watch reads
//! the annotation too), the callback confirming each; a namespace that claims a domain the list
//! does not allow gets none, and the pod's init says which rule refused it.
//!
//! Then, on the same cluster, admission through a ZTS outage (`admission`): the initializer's own
//! CA in its Secret and the webhook's caBundle, the bound on its grant, and with ZTS frozen and
//! the initializer's pods deleted, a new opted-in Deployment admitted within 30 s and its pods'
//! identities within 60 s of ZTS's return.
//!
//! Needs root, `harness/real-node/kube/build.sh`'s binaries and the image (`deploy/image.sh`);
//! fails naming what is missing, never skips. Runs with the dev ZTS (the Athenz ZTS registrar
//! of `cluster up --zts athenz` registers the mapping's domains, not annotations').

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use athenz_devstack::cluster::scenario::{Scenario, Workload};
use athenz_devstack::cluster::tenant_pods::restricted_pod;
use std::time::{Duration, Instant};

#[path = "real_cluster_domains/admission.rs"]
mod admission;
mod common;
use common::cluster::{require_prerequisites, start_cluster};
use common::release::build_image;

/// What the operator allows namespaces to claim.
const ALLOW: &str = "acme.*";
/// How long a refused pod's init may take to say why.
const REFUSAL: Duration = Duration::from_secs(120);

#[test]
fn a_namespace_gets_the_domain_its_allowed_annotation_names_and_no_other() {
    require_prerequisites();
    let archive = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-domains-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    let archive_arg = archive.display().to_string();
    let (_guard, info) = start_cluster(
        &state_dir,
        &[
            "--image-archive",
            &archive_arg,
            "--component",
            "domain-annotations",
        ],
        Duration::from_secs(600),
    );
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().expect("cluster.json names the ZTS");
    let scenario = Scenario::new(&layout, &zts.ca);
    Scenario::import_app_image(&layout).unwrap();
    let kubectl = scenario.kubectl();

    // the operator allows acme.* in both copies of the settings; the readers restart to take it
    let patch = format!(r#"{{"data":{{"DOMAIN_ANNOTATION_ALLOW":"{ALLOW}"}}}}"#);
    for ns in [CONTROL_NAMESPACE, NODE_NAMESPACE] {
        kubectl
            .run(&[
                "-n",
                ns,
                "patch",
                "configmap",
                "athenz-cluster",
                "--type=merge",
                "-p",
                &patch,
            ])
            .unwrap();
    }
    for (ns, workload) in [
        (CONTROL_NAMESPACE, "deployment/athenz-callback"),
        (NODE_NAMESPACE, "daemonset/athenz-agent"),
    ] {
        kubectl
            .run(&["-n", ns, "rollout", "restart", workload])
            .unwrap();
        kubectl
            .wait_rolled_out(ns, workload, Duration::from_secs(180))
            .unwrap();
    }

    // payments-prod names acme.payments: both modes get it
    let ns = "payments-prod";
    scenario.ensure_namespace(ns, true).unwrap();
    kubectl
        .run(&[
            "annotate",
            "namespace",
            ns,
            "athenz.io/domain=acme.payments",
        ])
        .unwrap();
    assert_eq!(scenario.namespace_domain(ns).unwrap(), "acme.payments");
    let socket = Workload {
        namespace: ns,
        service_account: "api",
        mode: VolumeMode::CsiSocket,
        service: false,
    };
    let pods = scenario.deploy(&socket).unwrap();
    for pod in &pods {
        let identity = scenario
            .check_identity(ns, pod, VolumeMode::CsiSocket)
            .unwrap();
        assert_eq!(identity.principal, "acme.payments.api", "{identity:#?}");
        assert!(
            identity
                .dns_names
                .iter()
                .any(|n| n.starts_with("api.acme-payments.")),
            "{identity:#?}"
        );
    }
    let files = Workload {
        namespace: ns,
        service_account: "ledger",
        mode: VolumeMode::CsiFiles,
        service: false,
    };
    scenario.ensure_service_account(ns, "ledger").unwrap();
    kubectl
        .apply_manifest(
            &restricted_pod(&files).to_string(),
            "pod payments-prod/ledger",
        )
        .unwrap();
    scenario
        .wait_pod_ready(ns, "ledger", Duration::from_secs(180))
        .unwrap();
    let identity = scenario
        .check_identity(ns, "ledger", VolumeMode::CsiFiles)
        .unwrap();
    assert_eq!(identity.principal, "acme.payments.ledger", "{identity:#?}");
    eprintln!(
        "{ns} (athenz.io/domain: acme.payments): {} csi-socket pods and a csi-files pod issued acme.payments.*",
        pods.len()
    );

    // a namespace claiming a domain the list does not allow gets nothing, and says why
    let sneaky = "sneaky";
    scenario.ensure_namespace(sneaky, true).unwrap();
    kubectl
        .run(&[
            "annotate",
            "namespace",
            sneaky,
            "athenz.io/domain=bank.vault",
        ])
        .unwrap();
    scenario.ensure_service_account(sneaky, "stats").unwrap();
    let claim = Workload {
        namespace: sneaky,
        service_account: "stats",
        mode: VolumeMode::CsiSocket,
        service: false,
    };
    kubectl
        .apply_manifest(&restricted_pod(&claim).to_string(), "pod sneaky/stats")
        .unwrap();
    let said = format!("DOMAIN_ANNOTATION_ALLOW ({ALLOW}) does not allow");
    let deadline = Instant::now() + REFUSAL;
    let log = loop {
        let log = kubectl
            .run(&["-n", sneaky, "logs", "stats", "-c", "athenz-sia-init"])
            .unwrap_or_default();
        if log.contains(&said) {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "the claim of bank.vault was not refused naming the rule within {REFUSAL:?}: {log}"
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let line = log.lines().find(|l| l.contains(&said)).unwrap_or_default();
    eprintln!("{sneaky} (athenz.io/domain: bank.vault) refused: {line}");
    assert!(line.contains("bank.vault"), "{line}");
    let ready = kubectl
        .run(&[
            "-n",
            sneaky,
            "get",
            "pod",
            "stats",
            "-o",
            "jsonpath={.status.containerStatuses[0].ready}",
        ])
        .unwrap();
    assert_ne!(
        ready.trim(),
        "true",
        "the claiming pod must not run with an identity"
    );

    admission::goes_on_through_a_zts_outage(&scenario, &layout);
}
