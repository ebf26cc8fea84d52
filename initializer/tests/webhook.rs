//! The webhook over real TLS with AdmissionReviews shaped exactly as the API server sends them:
//! the returned patch, applied with json-patch to the original object, adds exactly the identity
//! pieces and changes nothing else; skips, refusals and malformed reviews.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::daemon::Shutdown;
use athenz_initializer::Config;
use athenz_testbed::pki::LeafSpec;
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::time::Duration;

mod common;
use common::*;

/// With the CSI driver's files mode the patch adds the CSI volume (Kubernetes' `csi` volume
/// source, as the API takes it) and a read-only mount in each app container: no container.
#[tokio::test]
async fn csi_files_mode_adds_only_the_volume_and_its_mounts() {
    let w = start_with_template("volume: csi-files\nallowedVolumes: [csi-files]\n").await;
    let original = pod_object("media-sports");
    let response = w
        .review(&review(
            "705ab4f5-6393-11e8-b7cc-42010a800003",
            "CREATE",
            "media-sports",
            original.clone(),
        ))
        .await;
    let patched = apply(&response, &original);
    let volumes = patched["spec"]["volumes"].as_array().unwrap();
    let ours = volumes
        .iter()
        .find(|v| v["name"] == "athenz-identity")
        .unwrap();
    assert_eq!(
        *ours,
        serde_json::json!({
            "name": "athenz-identity",
            "csi": {"driver": "csi.athenz.io", "readOnly": true, "volumeAttributes": {"mode": "files"}}
        })
    );
    assert_eq!(
        volumes.len(),
        original["spec"]["volumes"].as_array().map_or(0, Vec::len) + 1
    );
    assert_eq!(
        patched["spec"]["initContainers"],
        original["spec"]["initContainers"]
    );
    let containers = patched["spec"]["containers"].as_array().unwrap();
    assert_eq!(
        containers.len(),
        original["spec"]["containers"].as_array().unwrap().len()
    );
    for c in containers {
        let mounts = c["volumeMounts"].as_array().unwrap();
        assert!(mounts.contains(&serde_json::json!({
            "name": "athenz-identity", "mountPath": "/var/run/athenz", "readOnly": true
        })));
    }
    // a second pass changes nothing
    let again = w
        .review(&review(
            "705ab4f5-6393-11e8-b7cc-42010a800004",
            "CREATE",
            "media-sports",
            patched,
        ))
        .await;
    assert_no_patch(&again);
}

#[tokio::test]
async fn injects_exactly_the_identity_and_nothing_else() {
    let w = start(true).await;
    let original = pod_object("media-sports");
    let response = w
        .review(&review(
            "705ab4f5-6393-11e8-b7cc-42010a800002",
            "CREATE",
            "media-sports",
            original.clone(),
        ))
        .await;
    let patched = apply(&response, &original);
    // the result is a valid Pod
    let pod: Pod = serde_json::from_value(patched.clone()).unwrap();
    let spec = pod.spec.as_ref().unwrap();

    let volumes = spec.volumes.as_ref().unwrap();
    assert_eq!(volumes.len(), 3);
    let flex = volumes[1].flex_volume.as_ref().unwrap();
    assert_eq!(
        (
            volumes[1].name.as_str(),
            flex.driver.as_str(),
            flex.read_only
        ),
        ("athenz-identity", "athenz/volume-driver", Some(true))
    );
    assert_eq!(volumes[2].name, "athenz-credentials");
    assert_eq!(
        volumes[2].empty_dir.as_ref().unwrap().medium.as_deref(),
        Some("Memory")
    );

    let inits = spec.init_containers.as_ref().unwrap();
    let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["athenz-sia-init", "athenz-sia-refresh", "migrate"]);
    assert_eq!(inits[0].args.as_deref(), Some(&["init".to_owned()][..]));
    assert_eq!(inits[1].args.as_deref(), Some(&["refresh".to_owned()][..]));
    assert_eq!(inits[1].restart_policy.as_deref(), Some("Always"));
    assert_eq!(inits[0].restart_policy, None);
    let env: Vec<(String, Option<String>, Option<String>)> = inits[0]
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                e.value.clone(),
                e.value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .map(|f| f.field_path.clone()),
            )
        })
        .collect();
    assert_eq!(
        env,
        [
            (
                "ID_FILE".into(),
                Some("/var/athenz/identity/id".into()),
                None
            ),
            (
                "ENDPOINT".into(),
                Some("/var/athenz/identity/connect/agent.sock".into()),
                None
            ),
            ("OUT_DIR".into(), Some("/var/run/athenz".into()), None),
            ("GROUP".into(), Some("1001".into()), None),
            (
                "POD_NAMESPACE".into(),
                None,
                Some("metadata.namespace".into())
            ),
            ("POD_NAME".into(), None, Some("metadata.name".into())),
            ("POD_UID".into(), None, Some("metadata.uid".into())),
        ]
    );
    let sia_mounts = inits[0].volume_mounts.as_ref().unwrap();
    assert_eq!(sia_mounts[0].mount_path, "/var/athenz/identity");
    assert_eq!(sia_mounts[0].read_only, Some(true));
    assert_eq!(sia_mounts[1].mount_path, "/var/run/athenz");
    assert_eq!(sia_mounts[1].read_only, None);
    for c in &spec.containers {
        let last = c.volume_mounts.as_ref().unwrap().last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.mount_path.as_str(), last.read_only),
            ("athenz-credentials", "/var/run/athenz", Some(true)),
            "{}",
            c.name
        );
    }

    // the label the callback's pod cache selects, beside the pod's own
    assert_eq!(
        patched["metadata"]["labels"][athenz_core::volume_mode::INJECTED_LABEL],
        "flex"
    );

    // nothing else changed: strip exactly the additions and get the original back, byte for byte
    let mut stripped = patched.clone();
    stripped["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(athenz_core::volume_mode::INJECTED_LABEL);
    let spec = stripped["spec"].as_object_mut().unwrap();
    spec.get_mut("volumes")
        .unwrap()
        .as_array_mut()
        .unwrap()
        .truncate(1);
    spec.get_mut("initContainers")
        .unwrap()
        .as_array_mut()
        .unwrap()
        .drain(0..2);
    let containers = spec.get_mut("containers").unwrap().as_array_mut().unwrap();
    let web_mounts = containers[0]["volumeMounts"].as_array_mut().unwrap();
    web_mounts.pop();
    containers[1]
        .as_object_mut()
        .unwrap()
        .remove("volumeMounts");
    assert_eq!(stripped, original);

    // a second pass over the injected pod changes nothing
    let second = w
        .review(&review("uid-2", "CREATE", "media-sports", patched))
        .await;
    assert_no_patch(&second);
}

#[tokio::test]
async fn classic_sidecar_is_a_container() {
    let w = start(false).await;
    let original = pod_object("media-sports");
    let patched = apply(
        &w.review(&review("uid-c", "CREATE", "media-sports", original.clone()))
            .await,
        &original,
    );
    let pod: Pod = serde_json::from_value(patched).unwrap();
    let spec = pod.spec.unwrap();
    let inits: Vec<String> = spec
        .init_containers
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(inits, ["athenz-sia-init", "migrate"]);
    let containers: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
    assert_eq!(containers, ["web", "log-shipper", "athenz-sia-refresh"]);
    // the refresher does not mount the credentials read-only: it writes them
    let refresher = &spec.containers[2];
    assert!(
        refresher
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .all(|m| m.read_only != Some(true) || m.name == "athenz-identity")
    );
}

#[tokio::test]
async fn pods_that_did_not_ask_are_left_alone() {
    let w = start(true).await;
    let mut opted_out = pod_object("media-sports");
    opted_out["metadata"]["annotations"] = json!({"athenz.io/identity": "false"});
    assert_no_patch(
        &w.review(&review("u1", "CREATE", "media-sports", opted_out))
            .await,
    );
    assert_no_patch(
        &w.review(&review(
            "u2",
            "CREATE",
            "kube-system",
            pod_object("kube-system"),
        ))
        .await,
    );
    assert_no_patch(
        &w.review(&review(
            "u3",
            "UPDATE",
            "media-sports",
            pod_object("media-sports"),
        ))
        .await,
    );
    let mut deployment = review(
        "u4",
        "CREATE",
        "media-sports",
        json!({"kind": "Deployment"}),
    );
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    assert_no_patch(&w.review(&deployment).await);
    // "true" or any other value is not an opt-out
    let mut opted_in = pod_object("media-sports");
    opted_in["metadata"]["annotations"] = json!({"athenz.io/identity": "true"});
    let response = w
        .review(&review("u5", "CREATE", "media-sports", opted_in))
        .await;
    assert_eq!(response["patchType"], "JSONPatch");
}

#[tokio::test]
async fn a_pod_that_cannot_be_patched_is_refused_with_a_reason() {
    let w = start(true).await;
    let mut clash = pod_object("media-sports");
    clash["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "x", "mountPath": "/var/run/athenz"}]);
    let response = w
        .review(&review("u6", "CREATE", "media-sports", clash))
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("already mounts something at /var/run/athenz"),
        "{message}"
    );
}

#[tokio::test]
async fn malformed_reviews_are_400_and_huge_ones_413() {
    let w = start(true).await;
    let good = review("u7", "CREATE", "media-sports", pod_object("media-sports"));
    let mut wrong_version = good.clone();
    wrong_version["apiVersion"] = "admission.k8s.io/v1beta1".into();
    let mut no_uid = good.clone();
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let mut empty_uid = good.clone();
    empty_uid["request"]["uid"] = "".into();
    let mut not_a_pod = good.clone();
    not_a_pod["request"]["object"] = json!({"spec": {"containers": "nope"}});
    for (body, needle) in [
        (b"{".to_vec(), "not an AdmissionReview"),
        (
            serde_json::to_vec(&wrong_version).unwrap(),
            "admission.k8s.io/v1",
        ),
        (serde_json::to_vec(&no_uid).unwrap(), "uid"),
        (serde_json::to_vec(&empty_uid).unwrap(), "no uid"),
        (serde_json::to_vec(&not_a_pod).unwrap(), "not a Pod"),
        (b"[]".to_vec(), "not an AdmissionReview"),
    ] {
        let (status, body) = w.post(body).await;
        assert_eq!(status, 400, "{needle}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(needle),
            "{needle}: {body}"
        );
    }
    let mut huge = good.clone();
    huge["request"]["object"]["metadata"]["annotations"] =
        json!({"big": "x".repeat(3 * 1024 * 1024)});
    let (status, body) = w.post(serde_json::to_vec(&huge).unwrap()).await;
    assert_eq!(status, 413, "{body}");
}

#[tokio::test]
async fn tls_is_required_and_templates_are_checked_at_start() {
    let w = start(true).await;
    let plain = w.url.replace("https://", "http://");
    let result = reqwest::Client::new()
        .post(&plain)
        .timeout(Duration::from_secs(5))
        .body("{}")
        .send()
        .await;
    assert!(
        result.is_err() || !result.unwrap().status().is_success(),
        "plain HTTP was served"
    );

    let dir = tempfile::tempdir().unwrap();
    let files =
        w.ca.write_service_cert(dir.path(), "wh", &LeafSpec::service("wh", &[]))
            .unwrap();
    for (yaml, needle) in [
        ("image: x\nunknownField: 1\n", "unknown field"),
        ("image: ''\n", "template field image"),
        (
            "image: x\ncredentialsMountPath: relative/path\n",
            "template field credentialsMountPath",
        ),
        (
            "image: x\nidentityMountPath: /a\ncredentialsMountPath: /a/b\n",
            "credentialsMountPath",
        ),
        ("image: x\nimagePullPolicy: Sometimes\n", "imagePullPolicy"),
        ("image: [1, 2\n", "template"),
        ("volume: nfs\nimage: x\n", "unknown variant"),
        (
            "image: x\nvolume: flex\nallowedVolumes: [csi-socket]\n",
            "allowedVolumes: must include volume (flex)",
        ),
        ("volume: csi-socket\n", "template field image"),
        (
            "volume: csi-files\nallowedVolumes: [csi-files]\nimage: x\n",
            "template field volume: csi-files runs nothing in the pod",
        ),
        (
            "volume: csi-files\nallowedVolumes: [csi-files]\ngroup: app\n",
            "the key's group is the pod's fsGroup",
        ),
    ] {
        let template = dir.path().join("t.yaml");
        std::fs::write(&template, yaml).unwrap();
        let config = Config::try_parse_from([
            "athenz-initializer",
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
            &format!("--tls-cert={}", files.cert.display()),
            &format!("--tls-key={}", files.key.display()),
            &format!("--template={}", template.display()),
        ])
        .unwrap();
        let err = athenz_initializer::start(config, Shutdown::new())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("--template (TEMPLATE_FILE)") && err.contains(needle),
            "{needle}: {err}"
        );
    }
}
