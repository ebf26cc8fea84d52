//! Our release on a real node (docs/design.md §5.1): `cluster up` installs it as an operator does
//! (the image from `deploy/image.sh` imported, `kubectl apply -k deploy/overlays/local`), and the
//! real kubelet and API server judge the driver, CSI, webhook, RBAC, tokens and manifests:
//!
//! - the four workloads run from the image, Ready;
//! - pods in flex (webhook, two namespaces), csi-socket and csi-files mode read a certificate
//!   naming their pod, verified to the ZTS CA ([`Scenario::run_all`]);
//! - the sidecar refreshes a flex pod's certificate and the agent rotates a files-mode one;
//! - ZTS's CA rotated (both roots, ZTS moved, the old root removed): every pod refreshes twice
//!   under the new CA and fetches roles and tokens, nothing restarted (`real_cluster/ca_rotation.rs`);
//! - the API server's audit log shows the callback used exactly what its ClusterRole grants,
//!   no request of ours was refused, and the kubelet allowed the agent's token;
//! - a namespace that would map into the admin domain is refused, the SIA's log says why;
//! - containerd killed and restarted: a new pod still gets its identity;
//! - a pod with the identity volume but no webhook (csi-files, a namespace not opted in) gets
//!   its identity like any other: opting in is the webhook's convenience, Athenz's `launch`
//!   grant per domain is the control;
//! - a files-mode volume is read-only to the app whatever `readOnly` says (`real_cluster/read_only.rs`);
//! - a terminating pod's SIA is refused; the webhook down stops pod creation in opted-in
//!   namespaces only (failurePolicy Fail, as documented); the agent deleted while a pod waits
//!   for its identity is restarted by its DaemonSet and the pod still gets it.
//!
//! The faults are in `real_cluster/faults.rs`, the audit log's verdict in `real_cluster/audit.rs`.
//!
//! Needs root, `harness/real-node/kube/build.sh`'s binaries, buildah, cargo-auditable (the image) and the
//! node's tools; it fails naming what is missing, never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::install::{self, WORKLOADS};
use athenz_devstack::cluster::kubectl::Kubectl;
use athenz_devstack::cluster::runbook;
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario, Workload};
use std::time::{Duration, Instant};

#[path = "real_cluster/audit.rs"]
mod audit;
#[path = "real_cluster/ca_rotation.rs"]
mod ca_rotation;
mod common;
#[path = "real_cluster/faults.rs"]
mod faults;
#[path = "real_cluster/read_only.rs"]
mod read_only;
use common::cluster::{require_prerequisites, start_cluster};
use common::previous_release::{previous_image, previous_release};
use common::real_node::{
    agent_early_issues, callback_pod_cache_sizes, callback_pod_reads, check_metrics_reference,
    uninstall_as_documented, webhook_ca_bundle,
};
use common::release::{build_image, check_features};

/// One cluster per host (`cluster up` holds the node's lock): the tests here take turns.
static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn our_release_on_a_real_node_gives_every_pod_its_identity_and_refuses_what_it_must() {
    let _node = ONE_NODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    require_prerequisites();
    let archive = build_image();
    let temp = tempfile::Builder::new()
        .prefix("athenz-real-")
        .tempdir()
        .unwrap();
    let state_dir = temp.path().join("state");
    // the previous release (its image built from its own commit, its manifests, installed with
    // its steps); upgraded below to this one's as docs/operating.md says
    let previous = previous_release();
    let previous_image = previous_image(&previous);
    let archive_arg = previous_image.display().to_string();
    let previous_deploy = previous.deploy.display().to_string();
    let previous_steps = previous.page.display().to_string();
    // three-minute certificates: the sidecar's refresh and the agent's files-mode rotation
    // come within the test
    let (guard, info) = start_cluster(
        &state_dir,
        &[
            "--image-archive",
            &archive_arg,
            "--cert-minutes",
            "3",
            "--deploy",
            &previous_deploy,
            "--steps",
            &previous_steps,
        ],
        Duration::from_secs(600),
    );
    let layout = Layout::existing(&state_dir).unwrap();
    let zts = info.zts.clone().expect("cluster.json names the dev ZTS");
    let image = info.image.clone().expect("cluster.json names the image");
    assert_eq!(
        image,
        format!(
            "ghcr.io/athenz-k8s-identity/athenz-k8s-identity:{}",
            previous.version
        ),
        "the overlay keeps deploy/base's image name"
    );
    assert!(
        info.overlay
            .as_ref()
            .unwrap()
            .ends_with("athenz/checkout/deploy/overlays/local")
    );
    let scenario = Scenario::new(&layout, &zts.ca);
    let kubectl = scenario.kubectl();

    // a pod of the previous release, then the upgrade: this release's deploy/ under the same
    // overlay, this release's steps; the pod keeps its identity, new pods get theirs (below)
    Scenario::import_app_image(&layout).unwrap();
    // (no mode annotation: whatever the previous release's template injects by default, which
    // it allows whatever its allowedVolumes say; csi-socket from 0.2.0, flex before)
    let before_upgrade = Workload {
        namespace: "news-feed",
        service_account: "before-upgrade",
        mode: VolumeMode::CsiSocket,
        service: false,
    };
    let old_pods = scenario.deploy(&before_upgrade).unwrap();
    // this release's image, as an operator pushes it before applying the new manifests
    athenz_devstack::cluster::images::import(&layout, &archive).unwrap();
    install::upgrade(
        install::Installer::Kustomize,
        kubectl,
        &install::checkout_dir(&layout.athenz),
        &athenz_testbed::bins::repo_root().join("deploy"),
        &zts.url,
        &zts.ca,
        &install::operator_keys_dir(&layout.athenz),
    )
    .unwrap_or_else(|e| panic!("upgrading from {}: {e:#}", previous.commit));
    for (namespace, workload) in WORKLOADS {
        kubectl
            .wait_rolled_out(namespace, workload, Duration::from_secs(180))
            .unwrap();
    }
    for pod in &old_pods {
        scenario
            .check_identity(before_upgrade.namespace, pod, before_upgrade.mode)
            .unwrap();
    }
    eprintln!("upgraded from {} (its deploy/ and steps)", previous.commit);

    // the four workloads, Running and Ready, from this release's image
    let image = athenz_devstack::cluster::images::archive_reference(&archive).unwrap();
    for (namespace, workload) in WORKLOADS {
        let pods = kubectl.get_json(&["pods", "-n", namespace]).unwrap();
        let pods = pods["items"].as_array().unwrap();
        let name = workload.split('/').nth(1).unwrap();
        let mine: Vec<_> = pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/name"].as_str() == Some(name))
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        assert!(!mine.is_empty(), "no pod of {workload}");
        for pod in mine {
            assert_eq!(pod["status"]["phase"], "Running", "{workload}: {pod}");
            for c in pod["status"]["containerStatuses"].as_array().unwrap() {
                assert_eq!(c["ready"], true, "{workload}: {c}");
                assert!(
                    c["image"].as_str().unwrap().ends_with(&image)
                        || c["image"].as_str().unwrap() == image,
                    "{workload} runs {} instead of {image}",
                    c["image"]
                );
            }
        }
    }

    // every mode, through the real kubelet and API server
    let started = Instant::now();
    let outcome = scenario.run_all().unwrap();
    let identities = outcome.identities.clone();
    let modes = |mode: VolumeMode| identities.iter().filter(|i| i.mode == mode).count();
    // flex only once the operator allowed it (a template change the initializer picked up with
    // no restart, pods admitted throughout: run_all's allow_volume)
    assert_eq!(
        modes(VolumeMode::Flex),
        2,
        "a Deployment of two pods asking for flex: {identities:#?}"
    );
    // the template's default, csi-socket: a Deployment of two pods with no annotation, one pod
    // naming it and the features pod, both under Pod Security "restricted"
    assert_eq!(modes(VolumeMode::CsiSocket), 4, "{identities:#?}");
    assert_eq!(modes(VolumeMode::CsiFiles), 1);
    for id in identities.iter().filter(|i| i.mode == VolumeMode::CsiFiles) {
        assert_eq!(id.namespace, RESTRICTED_NAMESPACE, "{id:#?}");
    }
    check_features(&outcome.features);
    // from here on, identities verify to the new root alone
    let scenario =
        ca_rotation::rotate_the_zts_ca_with_nothing_restarted(&scenario, &layout, &identities);
    let enforced = kubectl
        .get_json(&["namespace", RESTRICTED_NAMESPACE])
        .unwrap();
    assert_eq!(
        enforced["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    // ... which does enforce it: a flex pod there is refused by Pod Security, naming the volume
    let flex_there = faults::run_busybox(
        kubectl,
        RESTRICTED_NAMESPACE,
        "flex-in-restricted",
        &["--annotations=athenz.io/volume=flex"],
    );
    let refusal = format!(
        "{:#}",
        flex_there.expect_err("a flex pod was admitted under restricted")
    );
    assert!(
        refusal.contains("violates PodSecurity") && refusal.contains("athenz-identity"),
        "{refusal}"
    );
    let injected_namespaces: std::collections::BTreeSet<_> = identities
        .iter()
        .filter(|i| i.mode != VolumeMode::CsiFiles)
        .map(|i| i.namespace.clone())
        .collect();
    assert_eq!(
        injected_namespaces.len(),
        3,
        "the webhook served three namespaces"
    );
    for id in &identities {
        // the webhook's files-mode volume leaves `ipSAN` at its default: one issuance, no IP
        let names_pod_ip = id.mode != VolumeMode::CsiFiles;
        let mut expected: Vec<String> = names_pod_ip
            .then(|| id.pod_ip.clone())
            .into_iter()
            .chain(id.service_ip.clone())
            .collect();
        let mut got = id.ip_addresses.clone();
        expected.sort();
        got.sort();
        assert_eq!(got, expected, "{id:#?}");
    }
    assert!(
        identities.iter().any(|i| i.service_ip.is_some()),
        "no pod had a Service: the callback's service check never ran"
    );
    let scenario_seconds = started.elapsed().as_secs_f64();

    let doomed_pod = faults::a_terminating_pods_sia_is_refused(&scenario, &info);
    faults::the_webhook_down_stops_only_opted_in_namespaces(&scenario);
    faults::the_agent_deleted_while_a_pod_waits_is_replaced(&scenario);
    let evil = faults::a_namespace_in_the_admin_domain_is_refused(&scenario);
    faults::containerd_killed_is_restarted(&scenario, &info, &state_dir);
    read_only::a_files_volume_is_read_only_whatever_the_pod_spec_says(&scenario);

    // the sidecar refreshes a flex and a csi-socket pod's certificate (the flex Deployment's
    // pods but the one deleted above), the agent rotates a files-mode volume's
    let refreshed_at = Instant::now();
    for before in identities.iter().filter(|i| {
        (["media-sports", "news-feed"].contains(&i.namespace.as_str()) && i.pod != doomed_pod)
            || i.mode == VolumeMode::CsiFiles
    }) {
        loop {
            let now = scenario
                .check_identity(&before.namespace, &before.pod, before.mode)
                .unwrap();
            if now.serial != before.serial {
                break;
            }
            assert!(
                refreshed_at.elapsed() < Duration::from_secs(300),
                "{}/{} kept serial {} past its refresh time",
                before.namespace,
                before.pod,
                before.serial
            );
            std::thread::sleep(Duration::from_secs(5));
        }
    }

    audit::our_accounts_used_exactly_their_grants(kubectl, &state_dir);

    // docs/operating.md's metrics reference is what each daemon serves
    check_metrics_reference(kubectl);

    // the callback's pod cache answered from the real API server's watch (the audit check
    // above saw it list and watch), and what it could not answer was read
    let reads = callback_pod_reads(kubectl);
    eprintln!("the callback's pod reads by source: {reads:?}");
    assert!(
        reads.get("cache").copied().unwrap_or(0) > 0,
        "no confirmation was answered from the pod cache: {reads:?}"
    );
    each_pod_cache_holds_only_the_pending_pods(kubectl);

    // the injected csi-files pod's identity was issued when the pod was bound and only written
    // by the publish (docs/design.md §4.10): the agent's watch of its node's pending pods works
    // with the installed RBAC and in-cluster configuration
    let early = agent_early_issues(kubectl);
    eprintln!("the agents' early issuances by outcome: {early:?}");
    assert!(
        early.get("taken").copied().unwrap_or(0) >= 1,
        "no files-mode publish wrote an identity issued when its pod was bound: {early:?}"
    );
    assert_eq!(early.get("failed"), None, "{early:?}");

    // the install's steps run again (what an upgrade under the same overlay does): nothing
    // changes, the webhook keeps its CA bundle and a new pod is admitted and gets its identity
    let bundle_before = webhook_ca_bundle(kubectl);
    install::run_install_steps(
        install::Installer::Kustomize,
        runbook::OPERATING,
        kubectl,
        &install::checkout_dir(&layout.athenz),
        &zts.url,
        // the bundle since ZTS's CA rotation: its new root alone
        scenario.zts_ca(),
        &install::operator_keys_dir(&layout.athenz),
    )
    .unwrap();
    assert_eq!(webhook_ca_bundle(kubectl), bundle_before);
    // (the steps put the base's template back: the template's default mode, csi-socket)
    let after_reapply = Workload {
        namespace: "news-feed",
        service_account: "after-reapply",
        mode: VolumeMode::CsiSocket,
        service: false,
    };
    let pods = scenario.deploy(&after_reapply).unwrap();
    for pod in &pods {
        scenario
            .check_identity(after_reapply.namespace, pod, VolumeMode::CsiSocket)
            .unwrap();
    }

    // uninstalled as documented: the tenants' pods first, then the page's steps; nothing of
    // ours is left in the cluster or on the node
    uninstall_as_documented(
        kubectl,
        install::Installer::Kustomize,
        &install::checkout_dir(&layout.athenz),
        &[
            "media-sports",
            "news-feed",
            RESTRICTED_NAMESPACE,
            "shop-cart",
            evil,
        ],
        &info.nodes,
    );

    eprintln!(
        "real node: up with our release in {:.1} s; {} identities checked in {scenario_seconds:.1} s",
        guard.up_seconds,
        identities.len()
    );
    drop(guard);
}

/// The callback's pod cache holds only the injected pods pending on a node (the default
/// `--pod-cache-fields status.phase=Pending,spec.nodeName!=`): once a pod runs, the real API
/// server tells the watch it is gone and sends none of its later events.
fn each_pod_cache_holds_only_the_pending_pods(kubectl: &Kubectl) {
    let injected = |fields: &str| {
        kubectl
            .run(&[
                "get",
                "pods",
                "-A",
                "-l",
                athenz_core::volume_mode::INJECTED_LABEL,
                "--field-selector",
                fields,
                "-o",
                "name",
            ])
            .unwrap()
            .lines()
            .count() as u64
    };
    let running = injected("status.phase=Running");
    assert!(
        running > 0,
        "no injected pod runs, so a cache of every pod would pass"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = injected("status.phase=Pending,spec.nodeName!=");
        let held = callback_pod_cache_sizes(kubectl);
        eprintln!(
            "pod caches hold {held:?}; injected pods: {pending} pending on a node, {running} running"
        );
        if !held.is_empty() && held.iter().all(|&n| n == pending) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the callback's pod caches hold {held:?} pods, but {pending} injected pods are pending on a node ({running} run)"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}
