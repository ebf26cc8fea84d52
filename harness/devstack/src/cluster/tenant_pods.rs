//! The pods and Deployments the scenario creates, as a tenant writes them (the webhook adds the
//! rest): the app container, a pod of a namespace enforcing Pod Security `restricted`, a
//! Deployment of an opted-in namespace, each naming its mode with `athenz.io/volume` where it
//! asks for one; and the [`Scenario`]'s methods that create them.

use super::scenario::{APP_IMAGE, BUSYBOX, CREDENTIALS, RESTRICTED_NAMESPACE, Scenario, Workload};
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use std::time::Duration;

/// The user the restricted pods' app containers run as, and their fsGroup (the files-mode key's
/// group).
const APP_USER: u32 = 65532;
/// How long a workload may take to be Ready (a first pod also waits for its image's layers).
const READY: Duration = Duration::from_secs(120);

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

impl Scenario {
    /// Creates `workload` (its namespace and service account first) and waits until its pods
    /// are Ready; returns their names.
    pub fn deploy(&self, workload: &Workload) -> anyhow::Result<Vec<String>> {
        let ns = workload.namespace;
        let sa = workload.service_account;
        let restricted = ns == RESTRICTED_NAMESPACE;
        if restricted {
            self.ensure_restricted_namespace(ns)?;
        } else {
            self.ensure_namespace(ns, true)?;
        }
        self.ensure_service_account(ns, sa)?;
        if workload.service {
            // before the pods: the agent looks the Service up when it issues
            self.kubectl().apply_manifest(
                &serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": sa, "namespace": ns},
                    "spec": {"selector": {"app": sa}, "ports": [{"port": 443}]},
                })
                .to_string(),
                &format!("service {ns}/{sa}"),
            )?;
        }
        match restricted {
            false => {
                let asked = (workload.mode == VolumeMode::Flex).then_some(VolumeMode::Flex);
                self.kubectl().apply_manifest(
                    &app_deployment(ns, sa, asked),
                    &format!("deployment {ns}/{sa}"),
                )?;
                self.kubectl()
                    .wait_rolled_out(ns, &format!("deployment/{sa}"), READY)?;
                self.pods_of(ns, sa)
            }
            true => {
                let pod = restricted_pod(workload).to_string();
                self.kubectl()
                    .apply_manifest(&pod, &format!("pod {ns}/{sa}"))?;
                self.wait_pod_ready(ns, sa, READY)?;
                Ok(vec![sa.to_owned()])
            }
        }
    }

    /// A pod named `name` running `container` (named `app`) as `sa` in `ns`, with its identity
    /// in `mode`: flex as it is before the webhook (the namespace must be opted in), csi-socket
    /// as the webhook makes it with the installed template set to `volume: csi-socket`,
    /// csi-files with the CSI volume mounted at `/var/run/athenz`; `None`: no identity.
    pub fn pod_json(
        &self,
        ns: &str,
        name: &str,
        sa: &str,
        mode: Option<VolumeMode>,
        container: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": sa}},
            "spec": {
                "serviceAccountName": sa,
                "terminationGracePeriodSeconds": 2,
                "containers": [container],
            }
        }))
        .context("the app pod")?;
        match mode {
            None => {}
            Some(VolumeMode::Flex) => {
                pod.metadata.annotations = Some(
                    [(
                        athenz_initializer::mutate::VOLUME_ANNOTATION.to_owned(),
                        VolumeMode::Flex.name().to_owned(),
                    )]
                    .into(),
                );
            }
            Some(VolumeMode::CsiSocket) => {
                // as the installed initializer reads it, with the install's image and ZTS
                let install = self.installed_settings()?;
                let mut template = self.installed_template()?.with_install(&install)?;
                template.volume = VolumeMode::CsiSocket;
                pod = athenz_initializer::mutate::inject(&template, &pod)
                    .map_err(|e| anyhow::anyhow!("injecting the csi-socket template: {e:?}"))?;
            }
            Some(VolumeMode::CsiFiles) => {
                // written by hand as docs/operating.md shows, with the label that has the
                // callback's pod cache hold it
                pod.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(
                        athenz_core::volume_mode::INJECTED_LABEL.to_owned(),
                        VolumeMode::CsiFiles.name().to_owned(),
                    );
                if let Some(spec) = pod.spec.as_mut() {
                    spec.volumes = Some(vec![serde_json::from_value(serde_json::json!({
                        "name": "athenz-identity",
                        "csi": {"driver": "csi.athenz.io", "readOnly": true,
                                "volumeAttributes": {"mode": "files"}}
                    }))?]);
                    spec.containers[0].volume_mounts = Some(vec![serde_json::from_value(
                        serde_json::json!({"name": "athenz-identity", "mountPath": CREDENTIALS,
                                           "readOnly": true}),
                    )?]);
                }
            }
        }
        serde_json::to_value(&pod).context("encoding the pod")
    }
}
