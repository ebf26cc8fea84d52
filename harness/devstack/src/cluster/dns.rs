//! Cluster DNS: CoreDNS (built from its own Go module by `harness/real-node/kube/build.sh`) as a conformant
//! cluster runs it: a Deployment in `kube-system` behind the `kube-dns` Service at
//! [`super::CLUSTER_DNS`], reading Services and EndpointSlices with the `system:coredns` RBAC
//! CoreDNS's own deployment gives it. The agent (host network, `ClusterFirstWithHostNet`) finds
//! the jwt-service by its Service name through it, and the dev ZTS the callback.
//!
//! It answers only `cluster.local` (and reverse lookups): this host has no upstream to forward to.

use super::images::{self, ImageSpec};
use super::kubectl::Kubectl;
use super::{CLUSTER_DNS, Layout};
use std::time::Duration;

/// CoreDNS's image, built here from the binary.
pub const COREDNS_IMAGE: &str = "localhost/athenz-devstack/coredns:v1.15.0";
/// How long CoreDNS may take to be Ready (the image is local: seconds).
const COREDNS_READY: Duration = Duration::from_secs(90);

/// The manifests: RBAC, the Corefile, the Deployment and the `kube-dns` Service.
fn manifest() -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
  - kind: ServiceAccount
    name: coredns
    namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {{
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }}
        cache 5
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 1
  selector:
    matchLabels: {{k8s-app: kube-dns}}
  template:
    metadata:
      labels: {{k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
        - name: coredns
          image: {COREDNS_IMAGE}
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {{name: dns, containerPort: 53, protocol: UDP}}
            - {{name: dns-tcp, containerPort: 53, protocol: TCP}}
          livenessProbe:
            httpGet: {{path: /health, port: 8080}}
          readinessProbe:
            httpGet: {{path: /ready, port: 8181}}
          resources:
            requests: {{cpu: 10m, memory: 32Mi}}
            limits: {{memory: 128Mi}}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{drop: [ALL], add: [NET_BIND_SERVICE]}}
          volumeMounts:
            - {{name: config, mountPath: /etc/coredns, readOnly: true}}
      volumes:
        - name: config
          configMap: {{name: coredns}}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  clusterIP: {CLUSTER_DNS}
  selector: {{k8s-app: kube-dns}}
  ports:
    - {{name: dns, port: 53, protocol: UDP}}
    - {{name: dns-tcp, port: 53, protocol: TCP}}
"#
    )
}

/// Builds and imports CoreDNS's image, applies its manifests and waits until it is Ready.
pub fn deploy(layout: &Layout, kubectl: &Kubectl) -> anyhow::Result<()> {
    let binary = layout.bin("coredns");
    if !binary.is_file() {
        anyhow::bail!(
            "{} is missing: harness/real-node/kube/build.sh builds CoreDNS beside Kubernetes",
            binary.display()
        );
    }
    let archive = images::build_once(
        &layout.images,
        &ImageSpec {
            name: COREDNS_IMAGE.to_owned(),
            files: vec![(binary, "/coredns".to_owned())],
            entrypoint: vec!["/coredns".to_owned()],
        },
    )?;
    images::import(layout, &archive)?;
    kubectl.apply_manifest(&manifest(), "CoreDNS")?;
    kubectl.wait_rolled_out("kube-system", "deployment/coredns", COREDNS_READY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_puts_coredns_at_the_address_kubelet_gives_pods() {
        let text = manifest();
        assert_eq!(text.split("\n---\n").count(), 6);
        assert!(text.contains(&format!("clusterIP: {CLUSTER_DNS}\n")));
        assert!(text.contains(&format!("image: {COREDNS_IMAGE}\n")));
        // the braces of the Corefile survived the format string
        assert!(text.contains("    .:53 {\n"));
    }
}
