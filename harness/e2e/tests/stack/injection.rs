//! The initializer's injection end to end, through the real binaries of `athenz-devstack up`:
//! its patch applied to a pod as the API server would, the flex volume mounted by the real
//! driver, the injected SIA container run with exactly its command, arguments and environment.
//!
//! Needs root (bind mounts) and the `athenz-devstack` binary, which `cargo test --workspace`
//! builds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_devstack::kube::NewPod;
use athenz_devstack::node;
use std::path::Path;

mod common;
use common::{Devstack, openssl_verifies};

/// The initializer's patch, applied to a pod as the API server would, gives a pod whose flex
/// volume the real driver mounts and whose injected SIA container, run with exactly its command,
/// arguments and environment, gets the identity; and its settings are the SIA's own defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initializer_injection_is_what_the_driver_and_sia_expect() {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;
    let stack = Devstack::start();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-i", "namespace": "media-sports", "labels": {"app": "web"},
                     "annotations": {"athenz.io/volume": "flex"}},
        "spec": {"serviceAccountName": "web", "nodeName": stack.info.node_name,
                 "containers": [{"name": "app", "image": "registry.example/app:1"}]}
    });
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0f6a3e3c-9a51-4d5e-8f57-0b6e4c1e0001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "media-sports", "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin"},
            "object": pod, "oldObject": null, "dryRun": false
        }
    });
    let root = reqwest::Certificate::from_pem(&std::fs::read(&stack.info.zts.ca).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([root])
        .build()
        .unwrap();
    let answer: serde_json::Value = client
        .post(format!("{}/mutate", stack.info.initializer.url))
        .json(&review)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{answer}");
    use base64::Engine;
    let patch: json_patch::Patch = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    let patched: Pod = serde_json::from_value(patched).unwrap();
    let spec = patched.spec.clone().unwrap();
    // the label the callback's pod cache selects, added beside the pod's own (the patch path
    // escapes its '/')
    let labels = patched.metadata.labels.clone().unwrap();
    assert_eq!(
        labels
            .get(athenz_core::volume_mode::INJECTED_LABEL)
            .map(String::as_str),
        Some("flex")
    );
    assert_eq!(labels.get("app").map(String::as_str), Some("web"));

    // The flex volume: the driver kubelet will exec is the one the agent installs, and the volume
    // name is the one whose mount dir the devstack (as kubelet) uses.
    let flex = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.flex_volume.is_some())
        .expect("a flex volume");
    assert_eq!(flex.name, node::VOLUME_NAME);
    let driver = &flex.flex_volume.as_ref().unwrap().driver;
    assert_eq!(driver.replace('/', "~"), "athenz~volume-driver");

    // The SIA containers: init first, its settings equal to the SIA's defaults.
    let init_containers = spec.init_containers.clone().unwrap();
    let sia = &init_containers[0];
    assert_eq!(sia.name, "athenz-sia-init");
    let env = |name: &str| {
        sia.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
            .unwrap_or_else(|| panic!("{name} is not set"))
    };
    let defaults = match <athenz_sia::Cli as clap::Parser>::try_parse_from(["athenz-sia", "init"])
        .unwrap()
        .command
    {
        athenz_sia::Command::Init(s) => s,
        athenz_sia::Command::Refresh(_) | athenz_sia::Command::Status(_) => unreachable!(),
    };
    assert_eq!(Path::new(&env("ID_FILE")), defaults.id_file);
    assert_eq!(Path::new(&env("ENDPOINT")), defaults.endpoint);
    assert_eq!(Path::new(&env("OUT_DIR")), defaults.out_dir);
    let mounts = sia.volume_mounts.clone().unwrap();
    let mount_path = |volume: &str| {
        mounts
            .iter()
            .find(|m| m.name == volume)
            .unwrap_or_else(|| panic!("no mount of {volume}"))
            .mount_path
            .clone()
    };
    let identity_path = mount_path(node::VOLUME_NAME);
    assert_eq!(env("ID_FILE"), format!("{identity_path}/id"));
    assert_eq!(
        env("ENDPOINT"),
        format!("{identity_path}/connect/agent.sock")
    );
    let credentials_volume = mounts
        .iter()
        .find(|m| m.mount_path == env("OUT_DIR"))
        .expect("OUT_DIR is a mounted volume")
        .name
        .clone();
    let emptydir = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == credentials_volume)
        .and_then(|v| v.empty_dir.clone())
        .expect("the credentials are an emptyDir");
    assert_eq!(emptydir.medium.as_deref(), Some("Memory"));
    // the app sees the credentials read-only, and not the agent's socket
    let app = &spec.containers[0];
    let app_mounts = app.volume_mounts.clone().unwrap();
    assert!(
        app_mounts
            .iter()
            .any(|m| m.name == credentials_volume && m.read_only == Some(true))
    );
    assert!(app_mounts.iter().all(|m| m.name != node::VOLUME_NAME));

    // Now for real: the patched pod is created, kubelet mounts its flex volume, and the init
    // container's own command, arguments and environment get the identity (the pod's paths
    // mapped onto this node's: the identity volume is the working directory).
    let created = stack.kube.create_pod(&patched).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    stack
        .kube
        .report_running(created, "10.1.0.71")
        .await
        .unwrap();
    let volume = node::mount(
        &stack.info,
        &stack.kubelet_root(),
        &NewPod {
            namespace: "media-sports".into(),
            name: "web-i".into(),
            service_account: "web".into(),
            ip: "10.1.0.71".into(),
        },
        &uid,
    )
    .await
    .unwrap();
    let map = |value: String| {
        if let Some(rest) = value.strip_prefix(&format!("{identity_path}/")) {
            rest.to_owned()
        } else if value == env("OUT_DIR") {
            volume.credentials_dir.display().to_string()
        } else {
            value
        }
    };
    let command = sia.command.clone().unwrap();
    assert_eq!(command[0], "athenz-sia");
    // as a process of the pod (in its cgroup), as the container runtime starts it
    let mut argv = stack.info.sia.clone();
    argv.extend(command[1..].iter().cloned());
    argv.extend(sia.args.iter().flatten().cloned());
    let argv = node::in_pod(&stack.info, &uid, &argv).unwrap();
    let status = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(
            sia.env
                .iter()
                .flatten()
                .filter_map(|e| Some((e.name.clone(), map(e.value.clone()?)))),
        )
        .current_dir(&volume.mount_dir)
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let cert = openssl_verifies(&stack.info, &volume);
    assert_eq!(cert.common_name, "media.sports.web");
    node::unmount(&stack.info, &volume).await.unwrap();
}
