//! The cluster's PKI, as kubeadm lays it out: a cluster CA (which the controller-manager also
//! signs with), the API server's serving and kubelet-client certificates, a front-proxy CA for
//! the aggregation layer, the service-account key pair, a client certificate per component with
//! the user and group Kubernetes reads from its CN and O, the kubelet's serving certificate for
//! the node's address, and a kubeconfig per client.

use super::Layout;
use super::nodes::NodeSpec;
use anyhow::Context;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, der_to_pem_labelled};
use athenz_testbed::pki::{CertAuthority, IssuedCert, LeafSpec, write_file};
use base64::Engine;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// The cluster's name in kubeconfigs.
const CLUSTER: &str = "athenz-devstack";
/// How long the cluster's certificates live: a development cluster may run for weeks.
const VALIDITY_DAYS: i64 = 365;

/// A certificate and key on disk.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The certificate, PEM.
    pub cert: PathBuf,
    /// Its key, PEM, 0600.
    pub key: PathBuf,
}

/// Every file of the PKI the components are given.
#[derive(Debug, Clone)]
pub struct ClusterPki {
    /// The cluster CA's certificate (every client CA, `--root-ca-file`, kubeconfigs).
    pub ca: PathBuf,
    /// The cluster CA's key (`--cluster-signing-key-file`).
    pub ca_key: PathBuf,
    /// The API server's serving certificate.
    pub apiserver: Pair,
    /// The API server's client certificate towards kubelets.
    pub apiserver_kubelet_client: Pair,
    /// The front-proxy CA (`--requestheader-client-ca-file`).
    pub front_proxy_ca: PathBuf,
    /// The API server's client certificate towards aggregated API servers.
    pub front_proxy_client: Pair,
    /// The service-account token signing key (PKCS#8).
    pub service_account_key: PathBuf,
    /// Its public key (`--service-account-key-file`).
    pub service_account_public: PathBuf,
    /// Each node's kubelet: its serving certificate and its kubeconfig, by node index.
    pub kubelets: Vec<KubeletCredentials>,
    /// The controller-manager's serving certificate (its /healthz).
    pub controller_manager_serving: Pair,
    /// The scheduler's serving certificate (its /healthz).
    pub scheduler_serving: Pair,
    /// The admin's client certificate (`system:masters`), for health checks.
    pub admin: Pair,
    /// Kubeconfigs by client: `admin` (also [`Layout::kubeconfig`]), `controller-manager`,
    /// `scheduler`, `kube-proxy`, `kubelet`.
    pub kubeconfigs: std::collections::BTreeMap<&'static str, PathBuf>,
    /// The node authorizer's certificates, when the cluster runs it.
    pub node_authorizer: Option<NodeAuthorizerPki>,
}

/// What the node authorizer (`cluster up --node-authorizer`) and the API server, its only
/// client, are given: its serving certificate for loopback, and the client certificate the API
/// server presents to it (CN [`super::node_authorizer::APISERVER_PRINCIPAL`], the principal the
/// authorizer allows), both from the cluster CA.
#[derive(Debug, Clone)]
pub struct NodeAuthorizerPki {
    pub serving: Pair,
    pub apiserver_client: Pair,
}

/// What one node's kubelet is given: a serving certificate for its name and address, and a
/// client certificate as `system:node:<name>` (group `system:nodes`, what NodeRestriction and
/// the Node authorizer read) in a kubeconfig.
#[derive(Debug, Clone)]
pub struct KubeletCredentials {
    pub serving: Pair,
    pub kubeconfig: PathBuf,
}

/// A further client that gets a kubeconfig (`kubeconfigs/<name>.conf`): a client certificate
/// whose CN is the user the API server sees and whose O, if any, its group.
#[derive(Debug, Clone)]
pub struct ExtraClient {
    pub name: &'static str,
    pub user: String,
    pub group: Option<&'static str>,
}

/// The clients that get a kubeconfig: (file name, CN, O).
fn clients() -> [(&'static str, String, Option<&'static str>); 4] {
    [
        (
            "admin",
            "kubernetes-admin".to_owned(),
            Some("system:masters"),
        ),
        (
            "controller-manager",
            "system:kube-controller-manager".to_owned(),
            None,
        ),
        ("scheduler", "system:kube-scheduler".to_owned(), None),
        ("kube-proxy", "system:kube-proxy".to_owned(), None),
    ]
}

fn spec(common_name: &str, dns: &[&str], ips: &[IpAddr]) -> LeafSpec {
    let mut spec = LeafSpec::service(common_name, dns);
    spec.ip_addresses = ips.to_vec();
    spec.validity = time::Duration::days(VALIDITY_DAYS);
    spec
}

/// Issues a leaf (with an O when given) and writes `<name>.crt` and `<name>.key`.
fn write_leaf(
    ca: &CertAuthority,
    dir: &Path,
    name: &str,
    spec: &LeafSpec,
    organization: Option<&str>,
) -> anyhow::Result<(Pair, IssuedCert)> {
    let issued = match organization {
        Some(o) => ca.issue_with_organization(spec, o, KeyAlgorithm::P256),
        None => ca.issue(spec, KeyAlgorithm::P256),
    }
    .with_context(|| format!("issuing the {name} certificate"))?;
    let pair = Pair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    write_file(&pair.cert, issued.chain_pem.as_bytes(), 0o644)?;
    write_file(&pair.key, issued.key_pem.expose().as_bytes(), 0o600)?;
    Ok((pair, issued))
}

impl ClusterPki {
    /// Makes the whole PKI under `layout.pki` and the kubeconfigs for `api_server`: the API
    /// server's certificate names the primary node (`nodes[0]`), and every node's kubelet gets
    /// its own credentials.
    /// With `node_authorizer`, also the node authorizer's certificates ([`NodeAuthorizerPki`]).
    pub fn create(
        layout: &Layout,
        nodes: &[NodeSpec],
        api_server: &str,
        node_authorizer: bool,
    ) -> anyhow::Result<Self> {
        Self::create_with_clients(layout, nodes, api_server, node_authorizer, &[])
    }

    /// [`Self::create`], with a kubeconfig for each of `extra` too (named by its `name` in
    /// [`ClusterPki::kubeconfigs`]).
    pub fn create_with_clients(
        layout: &Layout,
        nodes: &[NodeSpec],
        api_server: &str,
        node_authorizer: bool,
        extra: &[ExtraClient],
    ) -> anyhow::Result<Self> {
        let primary = nodes.first().context("a cluster has at least one node")?;
        let (node_name, node_ip) = (primary.name.as_str(), primary.ip);
        let dir = &layout.pki;
        let ca = CertAuthority::new_root("athenz-devstack cluster CA")
            .context("making the cluster CA")?;
        let ca_file = dir.join("ca.crt");
        let ca_key = dir.join("ca.key");
        write_file(&ca_file, ca.cert_pem().as_bytes(), 0o644)?;
        write_file(&ca_key, ca.key_pem().expose().as_bytes(), 0o600)?;

        let node = IpAddr::V4(node_ip);
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (apiserver, _) = write_leaf(
            &ca,
            dir,
            "apiserver",
            &spec(
                "kube-apiserver",
                &[
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                    "localhost",
                    node_name,
                ],
                &[node, loopback, IpAddr::V4(super::KUBERNETES_SERVICE_IP)],
            ),
            None,
        )?;
        // system:masters: the kubelet's webhook authorization then allows the API server's
        // exec, logs and port-forward without a binding (kubeadm before 1.29 did the same)
        let (apiserver_kubelet_client, _) = write_leaf(
            &ca,
            dir,
            "apiserver-kubelet-client",
            &spec("kube-apiserver-kubelet-client", &[], &[]),
            Some("system:masters"),
        )?;
        let kubelets = nodes
            .iter()
            .map(|n| kubelet_credentials(&ca, layout, n, api_server))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (controller_manager_serving, _) = write_leaf(
            &ca,
            dir,
            "controller-manager-serving",
            &spec("kube-controller-manager", &["localhost"], &[loopback]),
            None,
        )?;
        let (scheduler_serving, _) = write_leaf(
            &ca,
            dir,
            "scheduler-serving",
            &spec("kube-scheduler", &["localhost"], &[loopback]),
            None,
        )?;

        let node_authorizer = match node_authorizer {
            true => Some(NodeAuthorizerPki {
                serving: write_leaf(
                    &ca,
                    dir,
                    "node-authorizer-serving",
                    &spec("athenz-node-authorizer", &["localhost"], &[loopback]),
                    None,
                )?
                .0,
                apiserver_client: write_leaf(
                    &ca,
                    dir,
                    "node-authorizer-apiserver-client",
                    &spec(super::node_authorizer::APISERVER_PRINCIPAL, &[], &[]),
                    None,
                )?
                .0,
            }),
            false => None,
        };

        let front_proxy = CertAuthority::new_root("athenz-devstack front-proxy CA")
            .context("making the front-proxy CA")?;
        let front_proxy_ca = dir.join("front-proxy-ca.crt");
        write_file(&front_proxy_ca, front_proxy.cert_pem().as_bytes(), 0o644)?;
        let (front_proxy_client, _) = write_leaf(
            &front_proxy,
            dir,
            "front-proxy-client",
            &spec("front-proxy-client", &[], &[]),
            None,
        )?;

        let sa =
            PrivateKey::generate(KeyAlgorithm::P256).context("making the service-account key")?;
        let service_account_key = dir.join("sa.key");
        let service_account_public = dir.join("sa.pub");
        write_file(
            &service_account_key,
            sa.to_pkcs8_pem()
                .context("encoding the service-account key")?
                .expose()
                .as_bytes(),
            0o600,
        )?;
        write_file(
            &service_account_public,
            der_to_pem_labelled(&sa.public_key_der(), "PUBLIC KEY").as_bytes(),
            0o644,
        )?;

        let mut kubeconfigs = std::collections::BTreeMap::new();
        let mut admin = None;
        let extra = extra.iter().map(|c| (c.name, c.user.clone(), c.group));
        for (name, common_name, organization) in clients().into_iter().chain(extra) {
            let (pair, issued) = write_leaf(
                &ca,
                dir,
                &format!("{name}-client"),
                &spec(&common_name, &[], &[]),
                organization,
            )?;
            let path = if name == "admin" {
                layout.kubeconfig.clone()
            } else {
                layout.kubeconfigs.join(format!("{name}.conf"))
            };
            let text = kubeconfig(
                api_server,
                ca.cert_pem(),
                name,
                &issued.chain_pem,
                issued.key_pem.expose(),
            );
            write_file(&path, text.as_bytes(), 0o600)?;
            kubeconfigs.insert(name, path);
            if name == "admin" {
                admin = Some(pair);
            }
        }
        Ok(Self {
            ca: ca_file,
            ca_key,
            apiserver,
            apiserver_kubelet_client,
            front_proxy_ca,
            front_proxy_client,
            service_account_key,
            service_account_public,
            kubelets,
            controller_manager_serving,
            scheduler_serving,
            admin: admin.context("no admin client certificate")?,
            kubeconfigs,
            node_authorizer,
        })
    }

    /// The credentials of node `index`'s kubelet.
    pub fn kubelet(&self, index: usize) -> anyhow::Result<&KubeletCredentials> {
        self.kubelets
            .get(index)
            .with_context(|| format!("no kubelet credentials for node {}", index + 1))
    }

    /// The kubeconfig of `client` (see [`ClusterPki::kubeconfigs`]).
    pub fn kubeconfig(&self, client: &str) -> anyhow::Result<&Path> {
        self.kubeconfigs
            .get(client)
            .map(PathBuf::as_path)
            .with_context(|| format!("no kubeconfig for {client}"))
    }
}

/// Node `node`'s kubelet credentials (see [`KubeletCredentials`]): `kubelet-serving` and
/// `kubeconfigs/kubelet.conf` for the primary (their names before there were several nodes),
/// `kubelet-serving-<n>` and `kubelet-<n>.conf` for the others.
fn kubelet_credentials(
    ca: &CertAuthority,
    layout: &Layout,
    node: &NodeSpec,
    api_server: &str,
) -> anyhow::Result<KubeletCredentials> {
    let user = format!("system:node:{}", node.name);
    let (serving_name, client) = if node.is_primary() {
        ("kubelet-serving".to_owned(), "kubelet".to_owned())
    } else {
        (
            format!("kubelet-serving-{}", node.number()),
            format!("kubelet-{}", node.number()),
        )
    };
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let (serving, _) = write_leaf(
        ca,
        &layout.pki,
        &serving_name,
        &spec(
            &user,
            &[node.name.as_str(), "localhost"],
            &[IpAddr::V4(node.ip), loopback],
        ),
        Some("system:nodes"),
    )?;
    let (_, issued) = write_leaf(
        ca,
        &layout.pki,
        &format!("{client}-client"),
        &spec(&user, &[], &[]),
        Some("system:nodes"),
    )?;
    let kubeconfig_path = layout.kubeconfigs.join(format!("{client}.conf"));
    let text = kubeconfig(
        api_server,
        ca.cert_pem(),
        &client,
        &issued.chain_pem,
        issued.key_pem.expose(),
    );
    write_file(&kubeconfig_path, text.as_bytes(), 0o600)?;
    Ok(KubeletCredentials {
        serving,
        kubeconfig: kubeconfig_path,
    })
}

/// A kubeconfig with everything embedded, so it still works when copied elsewhere.
fn kubeconfig(server: &str, ca_pem: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {CLUSTER}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {user}@{CLUSTER}
  context:
    cluster: {CLUSTER}
    user: {user}
current-context: {user}@{CLUSTER}
",
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::crypto::CertInfo;

    #[test]
    fn clients_carry_the_user_and_group_kubernetes_reads() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::at(dir.path().to_owned(), "/nonexistent".into());
        std::fs::create_dir_all(&layout.pki).unwrap();
        std::fs::create_dir_all(&layout.kubeconfigs).unwrap();
        let nodes = NodeSpec::all("node-a", Ipv4Addr::new(192, 0, 2, 9), 2).unwrap();
        let pki = ClusterPki::create(&layout, &nodes, "https://192.0.2.9:6443", true).unwrap();
        let admin = std::fs::read_to_string(&pki.admin.cert).unwrap();
        let info = CertInfo::from_pem(&admin).unwrap();
        assert_eq!(info.common_name, "kubernetes-admin");
        assert!(
            info.subject.contains("O=system:masters"),
            "{}",
            info.subject
        );
        let kubelet_client = layout.pki.join("kubelet-client.crt");
        let kubelet =
            CertInfo::from_pem(&std::fs::read_to_string(kubelet_client).unwrap()).unwrap();
        assert_eq!(kubelet.common_name, "system:node:node-a");
        assert!(
            kubelet.subject.contains("O=system:nodes"),
            "{}",
            kubelet.subject
        );
        let serving =
            CertInfo::from_pem(&std::fs::read_to_string(&pki.apiserver.cert).unwrap()).unwrap();
        assert!(
            serving
                .ip_addresses
                .contains(&IpAddr::V4(super::super::KUBERNETES_SERVICE_IP))
        );
        assert!(
            serving
                .dns_names
                .iter()
                .any(|d| d == "kubernetes.default.svc.cluster.local")
        );
        let config = std::fs::read_to_string(&pki.kubelet(0).unwrap().kubeconfig).unwrap();
        assert!(config.contains("server: https://192.0.2.9:6443"));
        assert!(config.contains("name: kubelet@athenz-devstack"));
        // the second node's kubelet is a node of its own, to the API server and to clients
        let second = pki.kubelet(1).unwrap();
        let client = CertInfo::from_pem(
            &std::fs::read_to_string(layout.pki.join("kubelet-2-client.crt")).unwrap(),
        )
        .unwrap();
        assert_eq!(client.common_name, "system:node:node-a-2");
        let serving =
            CertInfo::from_pem(&std::fs::read_to_string(&second.serving.cert).unwrap()).unwrap();
        assert!(
            serving
                .ip_addresses
                .contains(&IpAddr::V4(Ipv4Addr::new(10, 250, 0, 2)))
        );
        assert!(pki.kubelet(2).is_err());
        // the node authorizer's client: the API server, by the principal the authorizer allows
        let authorizer = pki.node_authorizer.as_ref().unwrap();
        let client = CertInfo::from_pem(
            &std::fs::read_to_string(&authorizer.apiserver_client.cert).unwrap(),
        )
        .unwrap();
        assert_eq!(
            client.common_name,
            super::super::node_authorizer::APISERVER_PRINCIPAL
        );
        let serving =
            CertInfo::from_pem(&std::fs::read_to_string(&authorizer.serving.cert).unwrap())
                .unwrap();
        assert!(
            serving
                .ip_addresses
                .contains(&IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
    }
}
