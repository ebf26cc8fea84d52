//! What the webhook's tests share: reviews and pods shaped as the API server sends them, the
//! webhook started over real TLS with a template, and its patch applied.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use athenz_core::daemon::Shutdown;
use athenz_initializer::Config;
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use base64::Engine;
use clap::Parser;
use serde_json::{Value, json};

/// A pod as the ReplicaSet controller creates it, in a review as the API server sends it
/// (shape from the Kubernetes "Dynamic Admission Control" documentation).
pub fn review(uid: &str, operation: &str, namespace: &str, object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "a7e0b5c2-1111-4222-8333-444455556666",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

pub fn pod_object(namespace: &str) -> Value {
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "web-7d9f-",
            "namespace": namespace,
            "labels": {"app": "web", "pod-template-hash": "7d9f"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
                "uid": "5d3f0a7e-1111-4222-8333-444455556666", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}], "defaultMode": 420}}],
            "initContainers": [{"name": "migrate", "image": "migrate:1", "resources": {},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "containers": [
                {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                 "resources": {}, "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true,
                 "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                 "imagePullPolicy": "IfNotPresent"},
                {"name": "log-shipper", "image": "fluent-bit:3", "resources": {},
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                 "imagePullPolicy": "IfNotPresent"}
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "web",
            "serviceAccount": "web",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {}
    })
}

pub const TEMPLATE: &str = r#"
volume: flex
image: registry.example/athenz-k8s-identity:1.0
imagePullPolicy: IfNotPresent
command: [athenz-sia]
nativeSidecar: NATIVE
group: "1001"
resources:
  requests: {cpu: 10m, memory: 16Mi}
  limits: {memory: 32Mi}
"#;

pub struct Webhook {
    pub url: String,
    pub ca: CertAuthority,
    pub shutdown: Shutdown,
    pub _dir: tempfile::TempDir,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

pub async fn start(native: bool) -> Webhook {
    start_with_template(&TEMPLATE.replace("NATIVE", &native.to_string())).await
}

pub async fn start_with_template(template_yaml: &str) -> Webhook {
    start_with(template_yaml, &[]).await.0
}

/// The webhook with `template_yaml` and `extra` flags; also where its ops endpoint and its
/// template file are.
pub async fn start_with(
    template_yaml: &str,
    extra: &[&str],
) -> (Webhook, std::net::SocketAddr, std::path::PathBuf) {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.yaml");
    std::fs::write(&template, template_yaml).unwrap();
    let ca = CertAuthority::new_root("Webhook Root").unwrap();
    let files = ca
        .write_service_cert(
            dir.path(),
            "webhook",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service("athenz-initializer.k8s-admin.svc", &[])
            },
        )
        .unwrap();
    let config = Config::try_parse_from(
        [
            "athenz-initializer",
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
            &format!("--tls-cert={}", files.cert.display()),
            &format!("--tls-key={}", files.key.display()),
            &format!("--template={}", template.display()),
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(extra.iter().map(|a| (*a).to_owned())),
    )
    .unwrap();
    let shutdown = Shutdown::new();
    let (bound, _) = athenz_initializer::start(config, shutdown.clone())
        .await
        .unwrap();
    (
        Webhook {
            url: format!("https://127.0.0.1:{}/mutate", bound.api.port()),
            ca,
            shutdown,
            _dir: dir,
        },
        bound.ops,
        template,
    )
}

impl Webhook {
    pub async fn post(&self, body: Vec<u8>) -> (u16, Value) {
        let ca = reqwest::Certificate::from_pem(self.ca.root_pem().as_bytes()).unwrap();
        let client = reqwest::Client::builder()
            .tls_certs_only([ca])
            .build()
            .unwrap();
        let resp = client.post(&self.url).body(body).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn review(&self, review: &Value) -> Value {
        let (status, body) = self.post(serde_json::to_vec(review).unwrap()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(body["response"]["uid"], review["request"]["uid"]);
        body["response"].clone()
    }
}

pub fn apply(response: &Value, object: &Value) -> Value {
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    patched
}

pub fn assert_no_patch(response: &Value) {
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    assert!(response.get("patchType").is_none(), "{response}");
}
