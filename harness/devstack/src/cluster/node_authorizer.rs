//! `cluster up --node-authorizer`: the API server authorizes with deploy/node-authorizer's
//! AuthorizationConfiguration (Node, the node authorizer's webhook, RBAC; docs/design.md §6)
//! instead of `--authorization-mode=Node,RBAC`, and the node authorizer runs on the host as one
//! of the cluster's processes, on loopback, before the API server starts: this executable under
//! the daemon's name (the same code as the image's `athenz-daemons` link), with its certificates
//! from the cluster CA ([`super::pki::NodeAuthorizerPki`]); `components` starts it, and `cluster
//! down` stops it with the rest. This module is what they share: the files and the command line.

use anyhow::bail;
use std::path::{Path, PathBuf};

/// The daemon's name: its process, its log and its link.
pub const NODE_AUTHORIZER: &str = "athenz-node-authorizer";
/// The principal (client certificate CN) the API server presents to it.
pub const APISERVER_PRINCIPAL: &str = "kubernetes.kube-apiserver";
/// The AuthorizationConfiguration an administrator applies, as shipped.
pub const SHIPPED_CONFIG: &str =
    include_str!("../../../../deploy/node-authorizer/authorization-config.yaml");
/// The webhook kubeconfig's path in [`SHIPPED_CONFIG`], replaced with this cluster's.
pub const SHIPPED_KUBECONFIG: &str = "/etc/kubernetes/athenz-node-authorizer/kubeconfig.yaml";

/// How the API server authorizes.
#[derive(Debug, Clone)]
pub enum Authorization {
    /// `--authorization-mode=Node,RBAC`.
    NodeRbac,
    /// `--authorization-config=<file>` (the node authorizer's chain).
    Config(PathBuf),
}

impl Authorization {
    /// The API server's flag.
    pub fn flag(&self) -> String {
        match self {
            Self::NodeRbac => "--authorization-mode=Node,RBAC".to_owned(),
            Self::Config(file) => format!("--authorization-config={}", file.display()),
        }
    }
}

/// [`SHIPPED_CONFIG`] with the webhook's kubeconfig at `kubeconfig`; fails if the shipped file
/// no longer names its kubeconfig where this expects it (exactly once).
pub fn authorization_config(kubeconfig: &Path) -> anyhow::Result<String> {
    let found = SHIPPED_CONFIG.matches(SHIPPED_KUBECONFIG).count();
    if found != 1 {
        bail!(
            "deploy/node-authorizer/authorization-config.yaml names {SHIPPED_KUBECONFIG} {found} \
             times, not once"
        );
    }
    let path = kubeconfig.display().to_string();
    if path.contains(['\n', '"', '\'', ':', '#']) {
        bail!("{path}: a path YAML would need quoted cannot go into the configuration");
    }
    Ok(SHIPPED_CONFIG.replace(SHIPPED_KUBECONFIG, &path))
}

/// The webhook's kubeconfig: the authorizer at `https://127.0.0.1:<port>/authorize`, the
/// cluster CA, the API server's client certificate.
pub fn webhook_kubeconfig(port: u16, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: athenz-node-authorizer
  cluster:
    server: https://127.0.0.1:{port}/authorize
    certificate-authority: {ca}
users:
- name: kube-apiserver
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: athenz-node-authorizer
  context:
    cluster: athenz-node-authorizer
    user: kube-apiserver
current-context: athenz-node-authorizer
",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    )
}

/// The authorizer's command line: on `port` and `ops` of loopback, serving `serving` (a
/// certificate and key), allowing [`APISERVER_PRINCIPAL`] certified by `client_ca`, scoping the
/// agents of `agent_namespace`.
pub fn args(
    port: u16,
    ops: u16,
    serving: (&Path, &Path),
    client_ca: &Path,
    agent_namespace: &str,
) -> Vec<String> {
    vec![
        format!("--listen=127.0.0.1:{port}"),
        format!("--ops-listen=127.0.0.1:{ops}"),
        format!("--tls-cert={}", serving.0.display()),
        format!("--tls-key={}", serving.1.display()),
        format!("--client-ca={}", client_ca.display()),
        format!("--allowed-principals={APISERVER_PRINCIPAL}"),
        format!("--agent-user=system:serviceaccount:{agent_namespace}:athenz-agent"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_configuration_gets_this_clusters_kubeconfig() {
        let text =
            authorization_config(Path::new("/tmp/state/node-authorizer/kubeconfig.yaml")).unwrap();
        assert!(!text.contains(SHIPPED_KUBECONFIG));
        assert!(text.contains("kubeConfigFile: /tmp/state/node-authorizer/kubeconfig.yaml"));
        // the chain as docs/operating.md describes it: Node, the webhook, RBAC
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- type: "))
            .collect();
        assert_eq!(types, ["Node", "Webhook", "RBAC"]);
        for needed in [
            "apiVersion: apiserver.config.k8s.io/v1\n",
            "failurePolicy: Deny",
            "subjectAccessReviewVersion: v1",
            "matchConditionSubjectAccessReviewVersion: v1",
            "type: KubeConfigFile",
            &format!(
                "request.user == 'system:serviceaccount:{}:athenz-agent'",
                super::super::install::NODE_NAMESPACE
            ),
        ] {
            assert!(text.contains(needed), "{needed}");
        }
        assert!(authorization_config(Path::new("/tmp/a: b")).is_err());
        assert_eq!(
            Authorization::Config("/s/a.yaml".into()).flag(),
            "--authorization-config=/s/a.yaml"
        );
    }

    #[test]
    fn the_kubeconfig_names_the_authorizers_route_on_loopback() {
        let text = webhook_kubeconfig(
            20001,
            Path::new("/p/ca.crt"),
            Path::new("/p/c.crt"),
            Path::new("/p/c.key"),
        );
        assert!(text.contains("server: https://127.0.0.1:20001/authorize\n"));
        assert!(text.contains("client-key: /p/c.key\n"));
    }
}
