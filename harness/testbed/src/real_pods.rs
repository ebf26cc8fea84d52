//! Pods the size real nodes list. A kubelet's `GET /pods` returns every pod in full — spec with
//! several containers (env, probes, resources, mounts), the volumes an admission chain adds,
//! status with container statuses and conditions, and the API server's `managedFields` — about
//! 8–15 KB of JSON each. A stand-in serving three-field pods would flatter every list parser, so
//! benchmarks and tests create these instead.
//!
//! The shape follows `kubectl get pod -o json` of a Deployment pod with the identity containers
//! injected (deploy/'s initializer template), a log shipper sidecar and the default tolerations.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// What varies between pods; the rest is the same Deployment's template.
#[derive(Debug, Clone)]
pub struct RealPod<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// Service account (the Athenz service).
    pub service_account: &'a str,
    /// Node it is scheduled on.
    pub node: &'a str,
}

fn env(app: &str, namespace: &str) -> Value {
    json!([
        {"name": "APP_NAME", "value": app},
        {"name": "APP_ENV", "value": "production"},
        {"name": "LOG_LEVEL", "value": "info"},
        {"name": "HTTP_PORT", "value": "8080"},
        {"name": "METRICS_PORT", "value": "9090"},
        {"name": "JAVA_TOOL_OPTIONS", "value": "-XX:MaxRAMPercentage=75.0 -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -Dfile.encoding=UTF-8"},
        {"name": "ATHENZ_CERT_FILE", "value": "/var/run/athenz/service.cert.pem"},
        {"name": "ATHENZ_KEY_FILE", "value": "/var/run/athenz/service.key.pem"},
        {"name": "ATHENZ_CA_FILE", "value": "/var/run/athenz/ca.cert.pem"},
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability.svc.cluster.local:4317"},
        {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": format!("service.namespace={namespace},deployment.environment=production")},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": format!("{app}-db"), "key": "password"}}},
        {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"containerName": "app", "divisor": "1m", "resource": "limits.cpu"}}}
    ])
}

fn probe(path: &str, initial: u32) -> Value {
    json!({
        "httpGet": {"path": path, "port": 8080, "scheme": "HTTP"},
        "initialDelaySeconds": initial, "periodSeconds": 10, "timeoutSeconds": 2,
        "successThreshold": 1, "failureThreshold": 3
    })
}

fn mounts(extra: &[(&str, &str, bool)]) -> Value {
    let mut list: Vec<Value> = extra
        .iter()
        .map(|(name, path, ro)| json!({"name": name, "mountPath": path, "readOnly": ro}))
        .collect();
    list.push(json!({"name": "kube-api-access-7xk2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}));
    Value::Array(list)
}

fn restricted() -> Value {
    json!({
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
        "runAsUser": 10001, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
    })
}

fn spec(p: &RealPod<'_>, app: &str) -> Value {
    json!({
        "volumes": [
            {"name": "athenz-identity", "flexVolume": {"driver": "athenz/identity"}},
            {"name": "athenz-files", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "config", "configMap": {"name": format!("{app}-config"), "defaultMode": 420}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "kube-api-access-7xk2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}}
        ],
        "initContainers": [{
            "name": "athenz-sia-init", "image": "registry.example/athenz-sia:1.4.2",
            "args": ["init"], "resources": {"limits": {"cpu": "100m", "memory": "16Mi"}, "requests": {"cpu": "10m", "memory": "8Mi"}},
            "volumeMounts": mounts(&[("athenz-identity", "/var/athenz/identity", false), ("athenz-files", "/var/run/athenz", false)]),
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
            "imagePullPolicy": "IfNotPresent", "securityContext": restricted()
        }],
        "containers": [
            {
                "name": "app", "image": format!("registry.example/{app}:2026.11.3"),
                "command": ["/app/bin/server"], "args": ["--config=/etc/app/config.yaml", "--port=8080"],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}, {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "env": env(app, p.namespace),
                "resources": {"limits": {"cpu": "2", "memory": "2Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}},
                "volumeMounts": mounts(&[("athenz-files", "/var/run/athenz", true), ("config", "/etc/app", true), ("tmp", "/tmp", false)]),
                "livenessProbe": probe("/healthz", 30), "readinessProbe": probe("/readyz", 5), "startupProbe": probe("/healthz", 0),
                "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 5"]}}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent", "securityContext": restricted()
            },
            {
                "name": "athenz-sia", "image": "registry.example/athenz-sia:1.4.2", "args": ["refresh"],
                "resources": {"limits": {"cpu": "100m", "memory": "16Mi"}, "requests": {"cpu": "10m", "memory": "8Mi"}},
                "volumeMounts": mounts(&[("athenz-identity", "/var/athenz/identity", false), ("athenz-files", "/var/run/athenz", false)]),
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
                "imagePullPolicy": "IfNotPresent", "securityContext": restricted()
            },
            {
                "name": "log-shipper", "image": "registry.example/fluent-bit:3.2.1",
                "args": ["--config=/fluent-bit/etc/fluent-bit.yaml"],
                "env": [{"name": "FLUENT_HOST", "value": "logs.observability.svc.cluster.local"}, {"name": "FLUENT_PORT", "value": "24224"}],
                "resources": {"limits": {"cpu": "200m", "memory": "128Mi"}, "requests": {"cpu": "20m", "memory": "32Mi"}},
                "volumeMounts": mounts(&[("tmp", "/var/log/app", true)]),
                "livenessProbe": {"tcpSocket": {"port": 2020}, "periodSeconds": 20, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent", "securityContext": restricted()
            }
        ],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": p.service_account, "serviceAccount": p.service_account,
        "nodeName": p.node, "securityContext": {"fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}
        }]}},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ],
        "priority": 0, "enableServiceLinks": false, "preemptionPolicy": "PreemptLowerPriority"
    })
}

/// `managedFields` as the API server records them: which manager set which field, as a tree
/// mirroring the object (the largest part of many real pods).
fn managed_fields(app: &str) -> Value {
    let container = |name: &str| {
        json!({format!("k:{{\"name\":\"{name}\"}}"): {
            ".": {}, "f:args": {}, "f:env": {".": {}, "k:{\"name\":\"APP_NAME\"}": {".": {}, "f:name": {}, "f:value": {}},
                "k:{\"name\":\"LOG_LEVEL\"}": {".": {}, "f:name": {}, "f:value": {}}, "k:{\"name\":\"POD_NAME\"}": {".": {}, "f:name": {}, "f:valueFrom": {".": {}, "f:fieldRef": {}}}},
            "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {".": {}, "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
            "f:securityContext": {".": {}, "f:allowPrivilegeEscalation": {}, "f:capabilities": {".": {}, "f:drop": {}}, "f:readOnlyRootFilesystem": {}, "f:runAsNonRoot": {}, "f:runAsUser": {}},
            "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}, "f:volumeMounts": {".": {}, "k:{\"mountPath\":\"/var/run/athenz\"}": {".": {}, "f:mountPath": {}, "f:name": {}, "f:readOnly": {}}}
        }})
    };
    let mut containers = serde_json::Map::new();
    for name in ["app", "athenz-sia", "log-shipper"] {
        if let Value::Object(c) = container(name) {
            containers.extend(c);
        }
    }
    let status_container = |name: &str| {
        json!({"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
               "k:{\"type\":\"Initialized\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
               "k:{\"type\":\"PodReadyToStartContainers\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
               "k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
               "name": name})
    };
    json!([
        {
            "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-23T08:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:annotations": {".": {}, "f:checksum/config": {}, "f:prometheus.io/port": {}, "f:prometheus.io/scrape": {}},
                    "f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:team": {}, "f:version": {}},
                    "f:ownerReferences": {".": {}, format!("k:{{\"uid\":\"{app}\"}}"): {}}},
                "f:spec": {"f:affinity": {".": {}, "f:podAntiAffinity": {".": {}, "f:preferredDuringSchedulingIgnoredDuringExecution": {}}},
                    "f:containers": containers, "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                    "f:securityContext": {".": {}, "f:fsGroup": {}, "f:seccompProfile": {".": {}, "f:type": {}}}, "f:serviceAccount": {},
                    "f:serviceAccountName": {}, "f:terminationGracePeriodSeconds": {},
                    "f:volumes": {".": {}, "k:{\"name\":\"athenz-files\"}": {".": {}, "f:emptyDir": {".": {}, "f:medium": {}, "f:sizeLimit": {}}, "f:name": {}},
                        "k:{\"name\":\"config\"}": {".": {}, "f:configMap": {".": {}, "f:defaultMode": {}, "f:name": {}}, "f:name": {}},
                        "k:{\"name\":\"tmp\"}": {".": {}, "f:emptyDir": {}, "f:name": {}}}}
            }
        },
        {
            "manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-23T08:00:04Z",
            "fieldsType": "FieldsV1", "subresource": "status",
            "fieldsV1": {"f:status": {"f:conditions": status_container("conditions"), "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {},
                "f:initContainerStatuses": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {".": {}, "k:{\"ip\":\"10.0.0.1\"}": {".": {}, "f:ip": {}}}, "f:startTime": {}}}
        }
    ])
}

fn container_status(name: &str, image: &str, n: usize) -> Value {
    json!({
        "name": name, "state": {"running": {"startedAt": "2026-11-23T08:00:03Z"}}, "lastState": {},
        "ready": true, "restartCount": 0, "image": image,
        "imageID": format!("{image}@sha256:{:064x}", n),
        "containerID": format!("containerd://{:064x}", n.wrapping_mul(2_654_435_761)),
        "started": true,
        "volumeMounts": [{"name": "athenz-files", "mountPath": "/var/run/athenz", "readOnly": true, "recursiveReadOnly": "Disabled"}]
    })
}

/// The conditions of a pod the kubelet has just started, every one true since now (in whole
/// seconds, as the API server keeps times): its sandbox's (`PodReadyToStartContainers`) among
/// them, which the agent compares with the node's boot.
pub fn running_conditions() -> Value {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    json!([
        condition("PodReadyToStartContainers"),
        condition("Initialized"),
        condition("Ready"),
        condition("ContainersReady"),
        condition("PodScheduled")
    ])
}

/// The pod's status once kubelet runs it with `ip`: its conditions (its sandbox's among them,
/// `PodReadyToStartContainers`) turned true now, as the kubelet reports a pod it has just
/// started.
pub fn real_status(pod_ip: &str, host_ip: &str) -> Value {
    let conditions = running_conditions();
    json!({
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": "2026-11-23T08:00:01Z", "qosClass": "Burstable",
        "initContainerStatuses": [{
            "name": "athenz-sia-init", "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                "startedAt": "2026-11-23T08:00:02Z", "finishedAt": "2026-11-23T08:00:02Z",
                "containerID": "containerd://5d1c0a3b4e2f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"}},
            "lastState": {}, "ready": true, "restartCount": 0, "image": "registry.example/athenz-sia:1.4.2",
            "imageID": "registry.example/athenz-sia@sha256:0b6f3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b",
            "containerID": "containerd://5d1c0a3b4e2f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d", "started": false
        }],
        "containerStatuses": [
            container_status("app", "registry.example/app:2026.11.3", 1),
            container_status("athenz-sia", "registry.example/athenz-sia:1.4.2", 2),
            container_status("log-shipper", "registry.example/fluent-bit:3.2.1", 3)
        ]
    })
}

/// A pod as a user's Deployment creates it (metadata, spec, `managedFields`; no status yet).
pub fn real_pod(p: &RealPod<'_>) -> Result<Pod, serde_json::Error> {
    // a Deployment's pod is named <deployment>-<hash>-<suffix>; the app is the first part
    let app = p.name.split('-').next().unwrap_or(p.name);
    let value = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": p.name, "namespace": p.namespace, "generateName": format!("{app}-7d9f8b6c5d-"),
            "labels": {"app": app, "pod-template-hash": "7d9f8b6c5d", "team": "platform", "version": "2026.11.3",
                "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "storefront"},
            "annotations": {"checksum/config": "9f2c4e1a7b3d5f60817263544a5b6c7d8e9f00112233445566778899aabbccdd",
                "prometheus.io/port": "9090", "prometheus.io/scrape": "true",
                "kubectl.kubernetes.io/restartedAt": "2026-11-20T10:12:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-7d9f8b6c5d"),
                "uid": "3f1e2d4c-5b6a-4978-8a9b-0c1d2e3f4a5b", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed_fields(app)
        },
        "spec": spec(p, app)
    });
    serde_json::from_value(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_pod_lists_at_real_size() {
        let mut pod = real_pod(&RealPod {
            namespace: "media-sports",
            name: "web-7d9f8b6c5d-x2x9q",
            service_account: "web",
            node: "node-1",
        })
        .unwrap();
        pod.status = Some(serde_json::from_value(real_status("10.2.0.7", "192.168.1.10")).unwrap());
        let size = serde_json::to_vec(&pod).unwrap().len();
        assert!(
            (8_000..=15_000).contains(&size),
            "a listed pod is {size} bytes"
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.containers.len(), 3);
        assert_eq!(spec.service_account_name.as_deref(), Some("web"));
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(pod.status.unwrap().pod_ip.as_deref(), Some("10.2.0.7"));
    }
}
