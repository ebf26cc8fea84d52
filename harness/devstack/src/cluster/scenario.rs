//! The end-to-end on the real node (`cluster demo`, the real-cluster test): pods in every mode
//! get their identity through the real kubelet and API server, and each app container's
//! certificate is checked against its pod, as the pod's own code would read it.
//!
//! - flex: a Deployment in each of two namespaces opted in with `athenz.io/identity=enabled`;
//!   the real API server calls the initializer webhook, which injects the volume, the init
//!   container and the native sidecar.
//! - csi-socket and csi-files: pods in a namespace that enforces Pod Security `restricted`,
//!   opted in, each asking for its mode with the annotation `athenz.io/volume`: the webhook
//!   injects the CSI volume (and, for csi-socket, the SIA containers, which pass `restricted`),
//!   and the API server's Pod Security admission judges the result.
//!
//! This module holds what every step shares: the workloads, the [`Scenario`] handle and the check
//! of a pod's identity. The steps build on it, each in its own module: what is installed
//! ([`super::installed`]), the tenants' pods ([`super::tenant_pods`]), every SIA feature
//! ([`super::features`]), and all of them in order ([`super::end_to_end`]).

use super::Layout;
use super::images::{self, ImageSpec};
use super::kubectl::Kubectl;
use anyhow::{Context, bail};
use athenz_core::crypto::CertInfo;
use athenz_core::volume_mode::VolumeMode;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The apps' image: Debian's static busybox (`cat` is all an app needs to read its files).
pub const APP_IMAGE: &str = "localhost/athenz-devstack/busybox:1";
/// Where busybox is, on the host and in [`APP_IMAGE`].
pub const BUSYBOX: &str = "/bin/busybox";
/// Where every mode's app reads its credentials.
pub const CREDENTIALS: &str = "/var/run/athenz";
/// How long a files-mode certificate that is to name the pod's IP (`ipSAN: "true"`) may lack it
/// after the pod is Ready (the agent looks for it every 500 ms).
const IP_SAN_WAIT: Duration = Duration::from_secs(15);
/// The label that opts a namespace in.
pub use super::tenant_domains::OPT_IN;

/// One workload: its namespace (the Athenz domain with dashes), service account and mode.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// The namespace (`media-sports` is domain `media.sports`).
    pub namespace: &'static str,
    /// The service account (the Athenz service) and the workload's name.
    pub service_account: &'static str,
    /// How its pods get their identity.
    pub mode: VolumeMode,
    /// Whether a Service of the same name selects its pods (their certificates then carry its
    /// ClusterIP, which the callback checks against the API).
    pub service: bool,
}

/// The demo's workloads: Deployments in opted-in namespaces (flex asked for with
/// `athenz.io/volume`, which the operator allows first; the template's default otherwise), and
/// pods of a namespace enforcing Pod Security `restricted` naming their mode.
pub const WORKLOADS: [Workload; 4] = [
    Workload {
        namespace: "media-sports",
        service_account: "api",
        mode: VolumeMode::Flex,
        service: true,
    },
    // the template's default mode: no annotation
    Workload {
        namespace: "news-feed",
        service_account: "web",
        mode: VolumeMode::CsiSocket,
        service: false,
    },
    Workload {
        namespace: RESTRICTED_NAMESPACE,
        service_account: "stats",
        mode: VolumeMode::CsiSocket,
        service: false,
    },
    Workload {
        namespace: RESTRICTED_NAMESPACE,
        service_account: "reader",
        mode: VolumeMode::CsiFiles,
        service: false,
    },
];

/// The tenant namespace that enforces Pod Security `restricted` (domain `bank.vault`), where the
/// CSI modes' pods run.
pub const RESTRICTED_NAMESPACE: &str = "bank-vault";

/// What a pod's app container read, checked against the pod.
#[derive(Debug, Clone, Serialize)]
pub struct PodIdentity {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// How it got its identity.
    pub mode: VolumeMode,
    /// The pod's IP, as the API server has it.
    pub pod_ip: String,
    /// The node it runs on.
    pub node: String,
    /// The certificate's CN: `<domain>.<service account>`.
    pub principal: String,
    /// Its DNS SANs.
    pub dns_names: Vec<String>,
    /// Its IP SANs.
    pub ip_addresses: Vec<String>,
    /// The ClusterIP of the Service named after its service account, when there is one.
    pub service_ip: Option<String>,
    /// Its URI SANs (SPIFFE id, instance id).
    pub uris: Vec<String>,
    /// Its serial (hex).
    pub serial: String,
    /// Its expiry (RFC 3339).
    pub not_after: String,
}

/// The scenario's handles: kubectl, and the ZTS CA that must verify every certificate.
pub struct Scenario {
    kubectl: Kubectl,
    zts_ca: PathBuf,
    /// With Athenz's ZTS, the service accounts it has registered and loaded
    /// ([`super::tenant_domains::SEEN_FILE`]); absent with the dev ZTS.
    tenants_seen: PathBuf,
}

/// How long a new service account may take to be registered with Athenz's ZTS (a round of the
/// registrar, the signing, ZTS's next look at its domains).
const REGISTERED: Duration = Duration::from_secs(120);

impl Scenario {
    /// For the cluster in `layout`, whose ZTS's CA is `zts_ca`.
    pub fn new(layout: &Layout, zts_ca: &Path) -> Self {
        Self {
            kubectl: Kubectl::new(layout),
            zts_ca: zts_ca.to_owned(),
            tenants_seen: layout
                .athenz
                .join("zts")
                .join(super::tenant_domains::SEEN_FILE),
        }
    }

    /// The kubectl it uses.
    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }

    /// The ZTS CA every certificate must verify to.
    pub fn zts_ca(&self) -> &Path {
        &self.zts_ca
    }

    /// Builds and imports [`APP_IMAGE`].
    pub fn import_app_image(layout: &Layout) -> anyhow::Result<()> {
        if !Path::new(BUSYBOX).is_file() {
            bail!("{BUSYBOX} is missing: apt-get install busybox-static (the apps' image)");
        }
        let archive = images::build_once(
            &layout.images,
            &ImageSpec {
                name: APP_IMAGE.to_owned(),
                files: vec![(PathBuf::from(BUSYBOX), BUSYBOX.to_owned())],
                entrypoint: vec![BUSYBOX.to_owned()],
            },
        )?;
        images::import(layout, &archive)
    }

    /// Creates `ns` if missing, opted in when `opt_in`.
    pub fn ensure_namespace(&self, ns: &str, opt_in: bool) -> anyhow::Result<()> {
        let labels = if opt_in {
            format!("\n  labels: {{{}}}", OPT_IN.replace('=', ": "))
        } else {
            String::new()
        };
        self.kubectl.apply_manifest(
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}{labels}\n"),
            &format!("namespace {ns}"),
        )?;
        Ok(())
    }

    /// Creates service account `sa` in `ns` if missing; with Athenz's ZTS and `ns` opted in,
    /// returns once ZTS knows it (as a platform team registers a service before its pods run).
    pub fn ensure_service_account(&self, ns: &str, sa: &str) -> anyhow::Result<()> {
        self.kubectl.apply_manifest(
            &format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n"
            ),
            &format!("service account {ns}/{sa}"),
        )?;
        self.wait_registered(ns, sa)
    }

    /// With Athenz's ZTS ([`Self::tenants_seen`] exists) and `ns` opted in: waits until the
    /// registrar has acted on `ns/sa` and ZTS has loaded it.
    fn wait_registered(&self, ns: &str, sa: &str) -> anyhow::Result<()> {
        if !self.tenants_seen.exists() {
            return Ok(());
        }
        let (key, value) = OPT_IN.split_once('=').unwrap_or((OPT_IN, ""));
        let label = self.kubectl.run(&[
            "get",
            "namespace",
            ns,
            "-o",
            &format!("jsonpath={{.metadata.labels.{}}}", key.replace('.', "\\.")),
        ])?;
        if label.trim() != value {
            return Ok(());
        }
        let wanted = format!("{ns}/{sa}");
        let deadline = Instant::now() + REGISTERED;
        loop {
            let seen: super::tenant_domains::Seen =
                crate::json_file::read(&self.tenants_seen).unwrap_or_default();
            if seen.seen.contains(&wanted) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{wanted} was not registered with Athenz's ZTS within {} s ({} lists what was)",
                    REGISTERED.as_secs(),
                    self.tenants_seen.display()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Creates `ns` if missing, opted in and enforcing Pod Security `restricted`.
    pub fn ensure_restricted_namespace(&self, ns: &str) -> anyhow::Result<()> {
        let (key, value) = OPT_IN.split_once('=').unwrap_or((OPT_IN, ""));
        let mut labels = serde_json::Map::new();
        labels.insert(key.to_owned(), value.into());
        for level in ["enforce", "warn"] {
            labels.insert(
                format!("pod-security.kubernetes.io/{level}"),
                "restricted".into(),
            );
        }
        self.kubectl.apply_manifest(
            &serde_json::json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels},
            })
            .to_string(),
            &format!("namespace {ns}"),
        )?;
        Ok(())
    }

    /// The names of the pods labelled `app=<app>` in `ns`.
    pub fn pods_of(&self, ns: &str, app: &str) -> anyhow::Result<Vec<String>> {
        let pods = self
            .kubectl
            .get_json(&["pods", "-n", ns, "-l", &format!("app={app}")])?;
        Ok(pods["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Waits until pod `name` in `ns` is Ready; the error names its phase and events.
    pub fn wait_pod_ready(&self, ns: &str, name: &str, limit: Duration) -> anyhow::Result<()> {
        let timeout = format!("--timeout={}s", limit.as_secs());
        self.kubectl
            .run(&[
                "-n",
                ns,
                "wait",
                "--for=condition=Ready",
                &format!("pod/{name}"),
                &timeout,
            ])
            .map(|_| ())
            .with_context(|| {
                let events = self
                    .kubectl
                    .run(&[
                        "-n",
                        ns,
                        "get",
                        "events",
                        "--field-selector",
                        &format!("involvedObject.name={name}"),
                    ])
                    .unwrap_or_default();
                format!("pod {ns}/{name} not Ready after {limit:?}; its events:\n{events}")
            })
    }

    /// The domain the release maps `ns` to: its `athenz.io/domain` annotation when it has one
    /// (the cluster then allows it, or the pod gets no identity), else the namespace with each
    /// `-` as `.`.
    pub fn namespace_domain(&self, ns: &str) -> anyhow::Result<String> {
        let annotation = self.kubectl.run(&[
            "get",
            "namespace",
            ns,
            "-o",
            "jsonpath={.metadata.annotations.athenz\\.io/domain}",
        ])?;
        Ok(match annotation.trim() {
            "" => ns.replace('-', "."),
            named => named.to_owned(),
        })
    }

    /// Reads the certificate and CA the app container of `pod` sees and checks them against the
    /// pod: the chain verifies to the ZTS CA (openssl), the CN is `<domain>.<service account>`
    /// (the domain as [`Self::namespace_domain`] says),
    /// the pod's IP is its IP SAN (in files mode only if the volume asks for it: `ipSAN`) and its
    /// SPIFFE id names the service account.
    pub fn check_identity(
        &self,
        ns: &str,
        pod: &str,
        mode: VolumeMode,
    ) -> anyhow::Result<PodIdentity> {
        let json = self.kubectl.get_json(&["pod", "-n", ns, pod])?;
        let pod_ip = json["status"]["podIP"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let node = json["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let sa = json["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_default();
        // the Service named after the service account, if any: its ClusterIP must be a SAN
        let service_ip = self.kubectl.get_json(&["services", "-n", ns])?["items"]
            .as_array()
            .and_then(|items| {
                items
                    .iter()
                    .find(|svc| svc["metadata"]["name"] == sa)
                    .and_then(|svc| svc["spec"]["clusterIP"].as_str().map(str::to_owned))
            });
        let cat = |file: &str| {
            self.kubectl.run(&[
                "exec",
                "-n",
                ns,
                pod,
                "-c",
                "app",
                "--",
                BUSYBOX,
                "cat",
                &format!("{CREDENTIALS}/{file}"),
            ])
        };
        let root = std::fs::read_to_string(&self.zts_ca)
            .with_context(|| format!("reading {}", self.zts_ca.display()))?;
        let domain = self.namespace_domain(ns)?;
        let expected = format!("{domain}.{sa}");
        let names_pod_ip = mode != VolumeMode::CsiFiles || files_volume_names_pod_ip(&json);
        // files mode: the first certificate is issued at NodePublishVolume, before the pod has
        // a sandbox (so an IP); with `ipSAN` the agent re-issues as soon as the kubelet lists it
        let deadline = Instant::now() + IP_SAN_WAIT;
        let (cert, ips) = loop {
            let cert_pem = cat("service.cert.pem")?;
            let ca_pem = cat("ca.cert.pem")?;
            athenz_testbed::openssl::verify(&root, &ca_pem, &cert_pem).map_err(|e| {
                anyhow::anyhow!("{ns}/{pod}: the certificate does not verify to the ZTS CA: {e}")
            })?;
            let cert = CertInfo::from_pem(&cert_pem).context("parsing the pod's certificate")?;
            if cert.common_name != expected {
                bail!(
                    "{ns}/{pod}: CN {} where {expected} was expected",
                    cert.common_name
                );
            }
            let ips: Vec<String> = cert.ip_addresses.iter().map(ToString::to_string).collect();
            if let Some(service_ip) = &service_ip
                && !ips.contains(service_ip)
            {
                bail!("{ns}/{pod}: its Service's IP {service_ip} is not among the IP SANs {ips:?}");
            }
            // Without `ipSAN` the agent names no IP; a volume an earlier release published
            // keeps the IP it was issued with, so either is the pod's own certificate here (the
            // stack tests pin the new volume's certificate to none).
            if ips.contains(&pod_ip) || !names_pod_ip {
                break (cert, ips);
            }
            if mode != VolumeMode::CsiFiles || Instant::now() >= deadline {
                bail!("{ns}/{pod}: the pod's IP {pod_ip} is not among the IP SANs {ips:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let spiffe = format!("spiffe://{domain}/sa/{sa}");
        if !cert.uris.contains(&spiffe) {
            bail!(
                "{ns}/{pod}: {spiffe} is not among the URI SANs {:?}",
                cert.uris
            );
        }
        Ok(PodIdentity {
            namespace: ns.to_owned(),
            pod: pod.to_owned(),
            mode,
            pod_ip,
            node,
            principal: cert.common_name,
            dns_names: cert.dns_names,
            ip_addresses: ips,
            service_ip,
            uris: cert.uris,
            serial: cert.serial_hex,
            not_after: cert
                .not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        })
    }
}

/// Whether a pod's `csi.athenz.io` volume asks for the pod's IP (`volumeAttributes.ipSAN`).
fn files_volume_names_pod_ip(pod: &serde_json::Value) -> bool {
    pod["spec"]["volumes"].as_array().is_some_and(|volumes| {
        volumes.iter().any(|v| {
            v["csi"]["driver"] == athenz_csi_driver::DRIVER_NAME
                && v["csi"]["volumeAttributes"]["ipSAN"] == "true"
        })
    })
}

/// The SPIFFE ID our certificates name for service account `sa` of namespace `ns` (the domain
/// is the namespace with `-` as `.`, as the devstack's mapping has it).
pub fn spiffe_id(ns: &str, sa: &str) -> String {
    format!("spiffe://{}/sa/{sa}", ns.replace('-', "."))
}
