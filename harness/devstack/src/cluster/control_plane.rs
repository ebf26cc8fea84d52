//! The control plane's command lines: the API server (with its audit policy), the
//! controller-manager and the scheduler, each given the cluster's certificates from [`ClusterPki`].
//! [`super::components`] starts them in order and waits for each.

use super::Layout;
use super::pki::ClusterPki;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// The API server's audit log, in the logs directory (JSON lines).
pub const AUDIT_LOG: &str = "audit.log";

/// `--flag=<path>`.
pub(super) fn flag(name: &str, value: impl AsRef<std::ffi::OsStr>) -> String {
    format!("--{name}={}", Path::new(value.as_ref()).display())
}

/// The API server: the node's address advertised (it refuses loopback), `Node,RBAC` (or the
/// node authorizer's chain, [`super::node_authorizer`]) with the cluster CA's client
/// certificates, NodeRestriction on top of the default admission plugins,
/// the service-account issuer a conformant cluster uses, the front proxy for aggregated APIs,
/// and aggregator routing to endpoints (webhooks work before kube-proxy does).
pub(super) fn apiserver_args(
    pki: &ClusterPki,
    node_ip: std::net::Ipv4Addr,
    port: u16,
    etcd: &str,
    audit: &Audit,
    authorization: &super::node_authorizer::Authorization,
) -> Vec<String> {
    vec![
        flag("audit-policy-file", &audit.policy),
        flag("audit-log-path", &audit.log),
        "--audit-log-format=json".to_owned(),
        format!("--advertise-address={node_ip}"),
        "--bind-address=0.0.0.0".to_owned(),
        format!("--secure-port={port}"),
        format!("--etcd-servers={etcd}"),
        "--allow-privileged=true".to_owned(),
        authorization.flag(),
        "--enable-admission-plugins=NodeRestriction".to_owned(),
        flag("client-ca-file", &pki.ca),
        flag("tls-cert-file", &pki.apiserver.cert),
        flag("tls-private-key-file", &pki.apiserver.key),
        flag(
            "kubelet-client-certificate",
            &pki.apiserver_kubelet_client.cert,
        ),
        flag("kubelet-client-key", &pki.apiserver_kubelet_client.key),
        flag("kubelet-certificate-authority", &pki.ca),
        "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
        flag("proxy-client-cert-file", &pki.front_proxy_client.cert),
        flag("proxy-client-key-file", &pki.front_proxy_client.key),
        flag("requestheader-client-ca-file", &pki.front_proxy_ca),
        "--requestheader-allowed-names=front-proxy-client".to_owned(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
        "--requestheader-group-headers=X-Remote-Group".to_owned(),
        "--requestheader-username-headers=X-Remote-User".to_owned(),
        format!("--service-account-issuer={}", super::SERVICE_ACCOUNT_ISSUER),
        flag("service-account-key-file", &pki.service_account_public),
        flag("service-account-signing-key-file", &pki.service_account_key),
        format!("--service-cluster-ip-range={}", super::SERVICE_CIDR),
        "--enable-aggregator-routing=true".to_owned(),
        "--v=1".to_owned(),
    ]
}

/// The API server's audit: the policy file and where the log goes.
pub(super) struct Audit {
    policy: PathBuf,
    log: PathBuf,
}

/// The audit policy (docs/design.md §5.1: the real API server judges our RBAC): every request of a
/// service account of ours (`athenz-system`, `k8s-admin`: who asked what, and the answer's code)
/// and of SPIRE's when `cluster bench` installs it (`spire`: its API requests per credential),
/// and every SubjectAccessReview with its answer (the kubelet asks one for each caller of its
/// API, so the log says what the kubelet required of the agent). Nothing else is logged.
pub(super) fn write_audit_policy(layout: &Layout) -> anyhow::Result<Audit> {
    let policy = layout.dir.join("audit-policy.yaml");
    let text = format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             \x20 - level: RequestResponse\n\
             \x20   resources: [{{group: authorization.k8s.io, resources: [subjectaccessreviews]}}]\n\
             \x20 - level: Metadata\n\
             \x20   userGroups: [\"system:serviceaccounts:{}\", \"system:serviceaccounts:{}\", \
             \"system:serviceaccounts:{}\"]\n\
             \x20 - level: None\n",
        super::install::NODE_NAMESPACE,
        super::install::CONTROL_NAMESPACE,
        super::spire::NAMESPACE
    );
    std::fs::write(&policy, text).with_context(|| format!("writing {}", policy.display()))?;
    Ok(Audit {
        policy,
        log: layout.logs.join(AUDIT_LOG),
    })
}

/// The controller-manager: every default controller, service-account tokens per controller,
/// the root CA for `kube-root-ca.crt`, the cluster CA as the CSR signer, pod ranges per node
/// when `node_cidrs` (a cluster of fake nodes has more nodes than the pods' network has /24s,
/// and kwok gives its pods addresses of its own).
pub(super) fn controller_manager_args(
    pki: &ClusterPki,
    port: u16,
    node_cidrs: bool,
) -> anyhow::Result<Vec<String>> {
    let kubeconfig = pki.kubeconfig("controller-manager")?;
    let mut args = vec![
        flag("kubeconfig", kubeconfig),
        flag("authentication-kubeconfig", kubeconfig),
        flag("authorization-kubeconfig", kubeconfig),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        flag("tls-cert-file", &pki.controller_manager_serving.cert),
        flag("tls-private-key-file", &pki.controller_manager_serving.key),
        flag("client-ca-file", &pki.ca),
        flag("requestheader-client-ca-file", &pki.front_proxy_ca),
        flag("cluster-signing-cert-file", &pki.ca),
        flag("cluster-signing-key-file", &pki.ca_key),
        "--controllers=*".to_owned(),
        "--leader-elect=false".to_owned(),
        flag("root-ca-file", &pki.ca),
        flag("service-account-private-key-file", &pki.service_account_key),
        "--use-service-account-credentials=true".to_owned(),
        format!("--allocate-node-cidrs={node_cidrs}"),
        format!("--service-cluster-ip-range={}", super::SERVICE_CIDR),
        "--cluster-name=athenz-devstack".to_owned(),
        "--v=1".to_owned(),
    ];
    if node_cidrs {
        args.push(format!("--cluster-cidr={}", super::CLUSTER_CIDR));
        args.push("--node-cidr-mask-size=24".to_owned());
    }
    Ok(args)
}

/// The scheduler, with its own kubeconfig and a serving certificate from the cluster CA.
pub(super) fn scheduler_args(pki: &ClusterPki, port: u16) -> anyhow::Result<Vec<String>> {
    let kubeconfig = pki.kubeconfig("scheduler")?;
    Ok(vec![
        flag("kubeconfig", kubeconfig),
        flag("authentication-kubeconfig", kubeconfig),
        flag("authorization-kubeconfig", kubeconfig),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        flag("tls-cert-file", &pki.scheduler_serving.cert),
        flag("tls-private-key-file", &pki.scheduler_serving.key),
        flag("client-ca-file", &pki.ca),
        "--leader-elect=false".to_owned(),
        "--v=1".to_owned(),
    ])
}
