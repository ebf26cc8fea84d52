//! A rotation of ZTS's CA on the real node, as an operator does it (docs/design.md §6): the next
//! root added to the install's `athenz-zts-ca` bundle, ZTS moved to it (its serving certificate
//! and its signer), then the old root removed. Every pod of every mode keeps refreshing under the
//! new CA and the features pod keeps fetching role certificates and tokens, with no pod and no
//! daemon restarted.

use athenz_devstack::cluster::Layout;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE, ZTS_FAULTS_FILE};
use athenz_devstack::cluster::scenario::{PodIdentity, Scenario};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the kubelet keeps each pod's ConfigMap volumes on the node.
const KUBELET_PODS: &str = "/var/lib/kubelet/pods";

/// How long a bundle change may take to reach every pod's copy (the kubelet's sync, then its
/// ConfigMap cache).
const BUNDLE_WAIT: Duration = Duration::from_secs(240);

/// How long every pod may take to refresh once (three-minute certificates, refreshed before
/// they are two-thirds through, plus the retry of one that met the move).
const REFRESH_WAIT: Duration = Duration::from_secs(300);

/// Every pod's uid with its containers' restart counts, in every namespace.
fn restarts(scenario: &Scenario) -> BTreeMap<String, (String, i64)> {
    let pods = scenario.kubectl().get_json(&["pods", "-A"]).unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let name = format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap(),
                p["metadata"]["name"].as_str().unwrap()
            );
            let restarts = ["initContainerStatuses", "containerStatuses"]
                .iter()
                .flat_map(|k| p["status"][k].as_array().cloned().unwrap_or_default())
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            (
                p["metadata"]["uid"].as_str().unwrap().to_owned(),
                (name, restarts),
            )
        })
        .collect()
}

/// Every copy of the `athenz-zts-ca` ConfigMap the kubelet keeps for a pod of the install.
fn bundle_copies(scenario: &Scenario) -> Vec<(String, PathBuf)> {
    let mut copies = Vec::new();
    for ns in [NODE_NAMESPACE, CONTROL_NAMESPACE] {
        let pods = scenario.kubectl().get_json(&["pods", "-n", ns]).unwrap();
        for pod in pods["items"].as_array().unwrap() {
            let uid = pod["metadata"]["uid"].as_str().unwrap();
            for volume in pod["spec"]["volumes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                if volume["configMap"]["name"] == "athenz-zts-ca" {
                    copies.push((
                        format!("{ns}/{}", pod["metadata"]["name"].as_str().unwrap()),
                        Path::new(KUBELET_PODS)
                            .join(uid)
                            .join("volumes/kubernetes.io~configmap")
                            .join(volume["name"].as_str().unwrap())
                            .join("ca.pem"),
                    ));
                }
            }
        }
    }
    assert!(
        copies.len() >= 4,
        "the install's pods mount no bundle: {copies:?}"
    );
    copies
}

/// Puts `bundle` in both namespaces' `athenz-zts-ca` and waits until every pod's copy, and the
/// agent's published copy for the SIAs, hold it.
fn publish_bundle(scenario: &Scenario, bundle: &str) {
    let patch = serde_json::json!({"data": {"ca.pem": bundle}}).to_string();
    for ns in [NODE_NAMESPACE, CONTROL_NAMESPACE] {
        scenario
            .kubectl()
            .run(&[
                "patch",
                "configmap",
                "-n",
                ns,
                "athenz-zts-ca",
                "--type",
                "merge",
                "-p",
                &patch,
            ])
            .unwrap();
    }
    let wanted = athenz_core::crypto::pem_certificates(bundle).unwrap();
    let published = Path::new(athenz_core::volume::DEFAULT_AGENT_DIR).join("zts-ca.pem");
    let started = Instant::now();
    let mut copies: Vec<(String, PathBuf)> = bundle_copies(scenario);
    copies.push(("the agent's copy for the pods".into(), published));
    for (whose, path) in copies {
        while athenz_core::tls::read_certs_file(&path).ok().as_ref() != Some(&wanted) {
            assert!(
                started.elapsed() < BUNDLE_WAIT,
                "{whose}: {} did not get the {}-certificate bundle",
                path.display(),
                wanted.len()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    eprintln!(
        "the {}-certificate bundle reached every copy in {:.1} s",
        wanted.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Waits until every pod of `identities` holds a certificate issued since `since` (a new serial)
/// that verifies to the root in `judge`'s CA file alone; returns them.
fn every_pod_refreshed_under(
    judge: &Scenario,
    since: &[PodIdentity],
    step: &str,
) -> Vec<PodIdentity> {
    let started = Instant::now();
    since
        .iter()
        .map(|before| {
            loop {
                match judge.check_identity(&before.namespace, &before.pod, before.mode) {
                    Ok(now) if now.serial != before.serial => break now,
                    other => {
                        assert!(
                            started.elapsed() < REFRESH_WAIT,
                            "{step}: {}/{} ({:?}) did not refresh under the new CA: {:?}",
                            before.namespace,
                            before.pod,
                            before.mode,
                            other.map(|i| i.serial)
                        );
                        std::thread::sleep(Duration::from_secs(5));
                    }
                }
            }
        })
        .collect()
}

/// The rotation, on the running cluster, for `identities` (pods of every mode still running);
/// returns the scenario that judges identities by the new root from then on.
pub fn rotate_the_zts_ca_with_nothing_restarted(
    scenario: &Scenario,
    layout: &Layout,
    identities: &[PodIdentity],
) -> Scenario {
    let kubectl = scenario.kubectl();
    let zts_dir = layout.athenz.join("zts");
    let old_root = std::fs::read_to_string(zts_dir.join("ca.pem")).unwrap();
    let next_root = std::fs::read_to_string(zts_dir.join("next-ca.pem")).unwrap();
    let original = kubectl
        .get_json(&["configmap", "-n", NODE_NAMESPACE, "athenz-zts-ca"])
        .unwrap()["data"]["ca.pem"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        athenz_core::crypto::pem_certificates(&original).unwrap(),
        athenz_core::crypto::pem_certificates(&old_root).unwrap(),
        "the install's bundle is the dev ZTS's root"
    );
    // kept in the state dir: the rest of the test judges by it
    let next_only = layout.dir.join("zts-ca-after-rotation.pem");
    std::fs::write(&next_only, &next_root).unwrap();
    let next_judge = Scenario::new(layout, &next_only);
    let before = restarts(scenario);
    let started = Instant::now();

    // 1. both roots everywhere; 2. ZTS moved to the next CA
    publish_bundle(scenario, &format!("{original}{next_root}"));
    let faults = serde_json::json!({"zts_next_ca": true}).to_string();
    let faults_file = zts_dir.join(ZTS_FAULTS_FILE);
    std::fs::write(faults_file.with_extension("tmp"), faults).unwrap();
    std::fs::rename(faults_file.with_extension("tmp"), &faults_file).unwrap();
    let moved = every_pod_refreshed_under(&next_judge, identities, "both roots trusted");
    eprintln!(
        "every pod refreshed under the next CA {:.1} s after the rotation began",
        started.elapsed().as_secs_f64()
    );

    // 3. the old root removed: every pod refreshes again, the features pod fetches a role
    // certificate and a token under the new CA
    publish_bundle(scenario, &next_root);
    every_pod_refreshed_under(&next_judge, &moved, "the old root removed");
    let removed_at = Instant::now();
    loop {
        match next_judge.check_features() {
            Ok(features) => {
                super::check_features(&features);
                break;
            }
            Err(e) => {
                assert!(
                    removed_at.elapsed() < REFRESH_WAIT,
                    "the features pod's role certificate and token under the new CA: {e:#}"
                );
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    }

    // nothing restarted: every pod that ran before runs still, with the same restart counts
    let after = restarts(scenario);
    for (uid, (name, count)) in &before {
        match after.get(uid) {
            Some((_, now)) => assert_eq!(now, count, "{name} restarted during the rotation"),
            None => panic!("{name} was replaced during the rotation"),
        }
    }
    eprintln!(
        "ZTS's CA rotated in {:.1} s: {} pods refreshed twice under the new CA, none restarted",
        started.elapsed().as_secs_f64(),
        identities.len()
    );
    next_judge
}
