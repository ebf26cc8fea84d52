//! The pods and Deployments the scenario creates, as a tenant writes them (the webhook adds the
//! rest): the app container, a pod of a namespace enforcing Pod Security `restricted`, a
//! Deployment of an opted-in namespace, each naming its mode with `athenz.io/volume` where it
//! asks for one.

use super::scenario::{APP_IMAGE, BUSYBOX, Workload};
use athenz_core::volume_mode::VolumeMode;

/// The user the restricted pods' app containers run as, and their fsGroup (the files-mode key's
/// group).
const APP_USER: u32 = 65532;

/// The app container: sleeps; reads its files when exec'd.
pub fn app_container() -> serde_json::Value {
    serde_json::json!({
        "name": "app",
        "image": APP_IMAGE,
        "imagePullPolicy": "Never",
        "command": [BUSYBOX, "sleep", "3600"],
    })
}

/// A pod of `workload` (a CSI mode) as a tenant of a `restricted` namespace writes it: the app
/// runs as a non-root user with no privilege escalation, no capabilities and the runtime's
/// seccomp profile; the pod asks for its mode with `athenz.io/volume`; its fsGroup is the key's
/// group in files mode. The webhook adds the rest.
pub fn restricted_pod(workload: &Workload) -> serde_json::Value {
    let mode = workload.mode.name();
    let mut app = app_container();
    app["securityContext"] = serde_json::json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": true,
        "runAsUser": APP_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    let sa = workload.service_account;
    let mut annotations = serde_json::Map::new();
    annotations.insert(
        athenz_initializer::mutate::VOLUME_ANNOTATION.to_owned(),
        mode.into(),
    );
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sa,
            "namespace": workload.namespace,
            "labels": {"app": sa},
            "annotations": annotations,
        },
        "spec": {
            "serviceAccountName": sa,
            "terminationGracePeriodSeconds": 2,
            "securityContext": {"fsGroup": APP_USER},
            "containers": [app],
        }
    })
}

/// A Deployment of two app pods running as `sa`, asking for `mode` when given (else the
/// template's); the webhook adds the rest.
pub fn app_deployment(ns: &str, sa: &str, mode: Option<VolumeMode>) -> String {
    let annotations = match mode {
        Some(mode) => serde_json::json!({
            athenz_initializer::mutate::VOLUME_ANNOTATION: mode.name()
        }),
        None => serde_json::json!({}),
    };
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": sa, "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": sa}},
            "template": {
                "metadata": {"labels": {"app": sa}, "annotations": annotations},
                "spec": {
                    "serviceAccountName": sa,
                    "terminationGracePeriodSeconds": 2,
                    "containers": [app_container()],
                }
            }
        }
    })
    .to_string()
}
