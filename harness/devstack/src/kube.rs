//! The Kubernetes side of the stack: the process serving the API and kubelet stand-ins (one
//! process, since the kubelet reads the API's pods), and the client calls the devstack makes as
//! a user and as the kubelet would (create a pod, report it running, delete it).

use anyhow::{Context, bail};
use athenz_testbed::kube_api::KubeApi;
use athenz_testbed::kubelet::Kubelet;
use athenz_testbed::real_pods;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What the stand-in process writes to `<state>/kube.json` once every server listens.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeInfo {
    /// The API stand-in, `http://127.0.0.1:<port>`.
    pub api: String,
    /// One kubelet stand-in per node, in the order asked.
    pub nodes: Vec<KubeNode>,
}

/// A node as the stand-ins run it: its kubelet, its agent pod and that pod's projected token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeNode {
    /// The node's name.
    pub name: String,
    /// Its kubelet stand-in, `http://127.0.0.1:<port>`.
    pub kubelet: String,
    /// Its agent pod, as the API holds it.
    pub agent_pod: PodRef,
    /// The agent pod's projected service-account token (audience `athenz-node`), rotated by
    /// this process as the kubelet rotates it.
    pub token_file: std::path::PathBuf,
}

/// `{namespace, name, uid}` of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// How often the agent pods' tokens are re-minted: well inside their hour, as the kubelet
/// refreshes a projected token at 80 % of its life.
const TOKEN_ROTATION: Duration = Duration::from_secs(40 * 60);

/// Mints agent pod `pod`'s token and writes it to `path` (0600, atomically).
fn write_agent_token(
    cluster: &athenz_testbed::kube_api::Cluster,
    pod: &PodRef,
    path: &Path,
) -> anyhow::Result<()> {
    let minted = cluster
        .mint_token(&athenz_testbed::kube_api::tokens::BoundTokenRequest {
            namespace: &pod.namespace,
            account: athenz_testbed::fixtures::AGENT_SERVICE_ACCOUNT,
            pod_name: &pod.name,
            pod_uid: Some(&pod.uid),
            audiences: &[athenz_testbed::fixtures::NODE_TOKEN_AUDIENCE.to_owned()],
            expiration_secs: None,
        })
        .map_err(|e| anyhow::anyhow!("minting {}'s token: {}", pod.name, e.2))?;
    athenz_core::volume::write_file_atomic(path, minted.token.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", path.display()))
}

/// Runs the API stand-in and one kubelet stand-in per node until SIGTERM (the hidden
/// `kube-standins` command). Each node gets its Node object and its agent pod, whose token is
/// written to `<state>/<node>.token` and rotated. With `faults_file`, follows its API and
/// kubelet faults ([`athenz_testbed::faults`]).
pub async fn run_standins(
    state_dir: &Path,
    api_listen: SocketAddr,
    nodes: &[String],
    faults_file: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let api = KubeApi::start_on(api_listen)
        .await
        .with_context(|| format!("starting the Kubernetes API stand-in on {api_listen}"))?;
    let mut kubelets = Vec::new();
    let mut infos = Vec::new();
    for node in nodes {
        let kubelet = Kubelet::start(api.cluster().clone(), node)
            .await
            .with_context(|| format!("starting node {node}'s kubelet stand-in"))?;
        let (pod, _) = api
            .cluster()
            .start_node_agent(node)
            .map_err(|e| anyhow::anyhow!("starting node {node}'s agent pod: {}", e.2))?;
        let agent_pod = PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        };
        let token_file = state_dir.join(format!("{node}.token"));
        write_agent_token(api.cluster(), &agent_pod, &token_file)?;
        infos.push(KubeNode {
            name: node.clone(),
            kubelet: kubelet.url(),
            agent_pod,
            token_file,
        });
        kubelets.push(kubelet);
    }
    let api = Arc::new(api);
    let kubelets: Vec<Arc<Kubelet>> = kubelets.into_iter().map(Arc::new).collect();
    let follower = faults_file.map(|path| {
        let (api, kubelets) = (api.clone(), kubelets.clone());
        tokio::spawn(athenz_testbed::faults::follow(path, move |f| {
            api.set_pod_reads_missing(f.api_pods_missing);
            api.set_failing_status(
                f.api_status
                    .and_then(|s| reqwest::StatusCode::from_u16(s).ok()),
            );
            // a chaos run takes the fault when the stand-in gets to it: no need to wait here
            drop(api.set_unreachable(f.api_unreachable));
            for kubelet in &kubelets {
                let controls = kubelet.controls();
                controls.set_delay(std::time::Duration::from_millis(f.kubelet_delay_ms));
                controls.set_failing(f.kubelet_failing);
                controls.set_omit_all(f.kubelet_omit_pods);
            }
        }))
    });
    let info = KubeInfo {
        api: api.url(),
        nodes: infos,
    };
    crate::json_file::write_atomically(&state_dir.join("kube.json"), &info)?;
    let stop = athenz_core::http::termination_signal();
    tokio::pin!(stop);
    let mut rotation = tokio::time::interval(TOKEN_ROTATION);
    rotation.tick().await;
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = rotation.tick() => {
                for node in &info.nodes {
                    if let Err(e) = write_agent_token(api.cluster(), &node.agent_pod, &node.token_file) {
                        tracing::warn!(node = %node.name, error = %e, "could not rotate the agent token");
                    }
                }
            }
        }
    }
    if let Some(follower) = follower {
        follower.abort();
    }
    drop(kubelets);
    Ok(())
}

/// A pod to create.
#[derive(Debug, Clone)]
pub struct NewPod {
    pub namespace: String,
    pub name: String,
    /// Service account (the Athenz service).
    pub service_account: String,
    /// The IP kubelet reports for it.
    pub ip: String,
}

/// How big the pods the stack creates are, as the kubelet lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodSize {
    /// One container, phase and IP: the least a pod can be.
    Minimal,
    /// As real nodes list them: several containers, env, probes, volumes, full status and
    /// managed fields, 8–15 KB of JSON each.
    Real,
}

/// The node's address in real-size pods' status (`hostIP`).
const NODE_IP: &str = "192.168.10.21";

fn minimal_status(ip: &str) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.to_owned()),
        pod_ips: Some(vec![k8s_openapi::api::core::v1::PodIP {
            ip: ip.to_owned(),
        }]),
        ..PodStatus::default()
    }
}

/// The API calls of a user and of the kubelet.
#[derive(Clone)]
pub struct KubeClient {
    http: reqwest::Client,
    api: String,
}

impl KubeClient {
    /// A client of the API stand-in at `api`.
    pub fn new(api: &str) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .context("building an HTTP client")?,
            api: api.to_owned(),
        })
    }

    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<Pod> {
        let response = request
            .send()
            .await
            .with_context(|| format!("{what}: the API did not answer"))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .with_context(|| format!("{what}: reading"))?;
        if !status.is_success() {
            bail!("{what}: {status}: {}", String::from_utf8_lossy(&body));
        }
        serde_json::from_slice(&body).with_context(|| format!("{what}: the answer is not a Pod"))
    }

    /// Creates the pod on `node` (as a user would, with the scheduler's choice of node) and
    /// reports it running with its IP (as kubelet does through the status subresource); returns
    /// its uid. The pod has one container and no status beyond phase and IP.
    pub async fn create_running_pod(&self, pod: &NewPod, node: &str) -> anyhow::Result<String> {
        self.create_running_pod_sized(pod, node, PodSize::Minimal)
            .await
    }

    /// [`Self::create_running_pod`] with pods of `size`: [`PodSize::Real`] ones list as real
    /// kubelets list them (8–15 KB each: containers, probes, env, status, managed fields).
    pub async fn create_running_pod_sized(
        &self,
        pod: &NewPod,
        node: &str,
        size: PodSize,
    ) -> anyhow::Result<String> {
        let object = match size {
            PodSize::Minimal => Pod {
                metadata: ObjectMeta {
                    name: Some(pod.name.clone()),
                    namespace: Some(pod.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    service_account_name: Some(pod.service_account.clone()),
                    node_name: Some(node.to_owned()),
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some("registry.example/app:1".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
                status: None,
            },
            PodSize::Real => real_pods::real_pod(&real_pods::RealPod {
                namespace: &pod.namespace,
                name: &pod.name,
                service_account: &pod.service_account,
                node,
            })
            .context("building a real-size pod")?,
        };
        let created = self.create_pod(&object).await?;
        let uid = created
            .metadata
            .uid
            .clone()
            .context("the created pod has no uid")?;
        let status = match size {
            PodSize::Minimal => minimal_status(&pod.ip),
            PodSize::Real => serde_json::from_value(real_pods::real_status(&pod.ip, NODE_IP))
                .context("building a real-size pod status")?,
        };
        self.report_status(created, status).await?;
        Ok(uid)
    }

    /// `POST /api/v1/namespaces/{ns}/pods`: returns the pod as the API stored it.
    pub async fn create_pod(&self, pod: &Pod) -> anyhow::Result<Pod> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        self.send(
            self.http
                .post(format!("{}/api/v1/namespaces/{namespace}/pods", self.api))
                .json(pod),
            &format!("creating pod {namespace}/{name}"),
        )
        .await
    }

    /// `PUT .../pods/{name}/status` with phase Running and `ip`, as kubelet reports it.
    pub async fn report_running(&self, pod: Pod, ip: &str) -> anyhow::Result<Pod> {
        self.report_status(pod, minimal_status(ip)).await
    }

    /// `PUT .../pods/{name}/status` with `status`.
    async fn report_status(&self, mut pod: Pod, status: PodStatus) -> anyhow::Result<Pod> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        pod.status = Some(status);
        self.send(
            self.http
                .put(format!(
                    "{}/api/v1/namespaces/{namespace}/pods/{name}/status",
                    self.api
                ))
                .json(&pod),
            &format!("reporting pod {namespace}/{name} running"),
        )
        .await
    }

    /// The kubelet's report of a pod's new sandbox (after a node restart): `PATCH .../status`
    /// with its IP and the sandbox's `PodReadyToStartContainers` condition true since now.
    pub async fn report_sandbox(
        &self,
        namespace: &str,
        name: &str,
        ip: &str,
    ) -> anyhow::Result<Pod> {
        let patch = serde_json::json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": real_pods::running_conditions(),
        }});
        self.send(
            self.http
                .patch(format!(
                    "{}/api/v1/namespaces/{namespace}/pods/{name}/status",
                    self.api
                ))
                .header("content-type", "application/merge-patch+json")
                .body(patch.to_string()),
            &format!("reporting pod {namespace}/{name}'s new sandbox"),
        )
        .await
    }

    /// Deletes a pod as `kubectl delete` and then kubelet do: marked terminating, then removed
    /// once its containers stopped (`gracePeriodSeconds=0`).
    pub async fn delete_pod(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        let url = format!("{}/api/v1/namespaces/{namespace}/pods/{name}", self.api);
        let what = format!("deleting pod {namespace}/{name}");
        self.send(self.http.delete(&url), &what).await?;
        self.send(
            self.http.delete(format!("{url}?gracePeriodSeconds=0")),
            &what,
        )
        .await?;
        Ok(())
    }
}
