//! `athenz-devstack demo`: the whole system once through, on this machine. Three pods in two
//! namespaces get identities through the real driver (flex, or the agent's CSI driver), agent,
//! jwt-service, ZTS and callback; one is refreshed (by the real sidecar, or in CSI files mode by
//! the agent itself); one is deleted and its refresh refused; every volume is unmounted.

mod renewal;

use renewal::{
    refresh_by_agent, refresh_by_sidecar, refuse_agent_rotation, refuse_sidecar_refresh,
};

use crate::identity::{self, IdentityReport};
use crate::kube::{KubeClient, NewPod};
use crate::node::{self, PodVolume};
use crate::pod_volume::{MountedVolume, NodeKubelet};
use crate::pods::PodRuntime;
use crate::stack::{Stack, StackInfo, StackOptions};
use anyhow::{Context, bail};
use athenz_core::volume::VolumeId;
use athenz_core::volume_mode::VolumeMode;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// The demo's pods: two namespaces, three service accounts.
pub fn demo_pods() -> Vec<NewPod> {
    [
        ("media-sports", "web-5d8f7", "web", "10.1.0.11"),
        ("media-sports", "api-7c9d4", "api", "10.1.0.12"),
        ("finance-ledger", "ledger-0", "ledger", "10.1.0.21"),
    ]
    .into_iter()
    .map(|(namespace, name, sa, ip)| NewPod {
        namespace: namespace.into(),
        name: name.into(),
        service_account: sa.into(),
        ip: ip.into(),
    })
    .collect()
}

/// One pod's part of the report.
#[derive(Debug, Serialize)]
pub struct PodReport {
    /// `<namespace>/<name>`.
    pub pod: String,
    pub uid: String,
    /// The identity its files show.
    pub identity: IdentityReport,
    /// Mount → files written, milliseconds.
    pub issued_in_ms: f64,
}

/// What the demo did.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// The pods' volume.
    pub volume: VolumeMode,
    /// How the pods' processes ran: runc, crun or process.
    pub runtime: athenz_testbed::runtime::RuntimeKind,
    /// The pods and their identities.
    pub pods: Vec<PodReport>,
    /// The refreshed pod, its serial before and after.
    pub refresh: RefreshReport,
    /// The deleted pod and the agent's refusal.
    pub refused_after_delete: RefusalReport,
    /// Node 2's certificate used directly for a pod on node 1, and ZTS's refusal.
    pub refused_cross_node: RefusalReport,
    /// Authorization from the refresh sidecar (absent with csi-files: no SIA runs in the pod).
    pub authorization: Option<AuthorizationReport>,
    /// Volumes left in the volumes dir after every unmount (must be 0).
    pub volumes_left: usize,
    /// Whole demo, seconds.
    pub seconds: f64,
}

/// What the demo pod got for its roles (docs/design.md §4.11).
#[derive(Debug, Serialize)]
pub struct AuthorizationReport {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// The role it is in, and the roles its access token (written by the SIA) grants.
    pub member_of: String,
    /// `scp` of that token.
    pub granted: Vec<String>,
    /// Whether its `cnf` is the thumbprint of the pod's certificate.
    pub bound_to_certificate: bool,
    /// The role it is not in, and the token server's refusal.
    pub not_member_of: String,
    /// The refusal (status and reason).
    pub refusal: String,
    /// The token server's answer for the member role: `token_type`, `expires_in`.
    pub token_server: String,
}

/// A refresh by the real sidecar, or by the agent in files mode.
#[derive(Debug, Serialize)]
pub struct RefreshReport {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// Who refreshed: `athenz-sia refresh` or `the agent`.
    pub by: String,
    /// Serial before.
    pub old_serial: String,
    /// Serial after.
    pub new_serial: String,
    /// The sidecar's exit after SIGTERM (true: 0); none without a sidecar.
    pub sidecar_exited_cleanly: Option<bool>,
}

/// A refresh refused.
#[derive(Debug, Serialize)]
pub struct RefusalReport {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// The agent's answer.
    pub refusal: String,
}

/// How often the agents rotate files-mode volumes in the demo (so it shows one).
const DEMO_CSI_REFRESH: Duration = Duration::from_secs(1);

/// Runs the demo in `state_dir` with `volume`; `print` gets each human line as it happens.
pub async fn run(
    state_dir: &Path,
    volume: VolumeMode,
    key_source: athenz_core::agent_api::KeySource,
    runtime: Option<athenz_testbed::runtime::RuntimeKind>,
    zts: crate::stack::ZtsServer,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    print(format!(
        "starting the stack in {} (pods get {} volumes)",
        state_dir.display(),
        volume.name()
    ));
    // two nodes: the demo shows that one cannot obtain the other's pods' identities
    let stack = Stack::start(&StackOptions {
        nodes: 2,
        volume,
        csi_refresh_interval: (volume == VolumeMode::CsiFiles).then_some(DEMO_CSI_REFRESH),
        key_source,
        runtime,
        zts,
        ..StackOptions::new(state_dir.to_owned(), "p256")
    })
    .await?;
    let result = play(&stack, volume, print).await;
    print("stopping the stack".into());
    stack.stop().await;
    let mut report = result?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

fn describe_stack(info: &StackInfo, print: &mut dyn FnMut(String)) {
    print(format!("  dev ZTS           {}", info.zts.url));
    print(format!("  Kubernetes API    {}", info.kube_api.url));
    print(format!("  kubelet           {}", info.kubelet.url));
    print(format!("  jwt-service       {}", info.jwt_service.url));
    print(format!(
        "  callback          {}{}",
        info.callback.url, info.callback.base_path
    ));
    print(format!(
        "  initializer       {}/mutate",
        info.initializer.url
    ));
    print(format!(
        "  agent             {}",
        info.agent.socket.display()
    ));
    for node in &info.nodes {
        print(format!(
            "  node {:<12} agent {} (its identity from ZTS, attested by its pod's token)",
            node.name,
            node.agent.socket.display()
        ));
    }
    print(format!("  peer check        {}", info.peer_check));
    print(format!("  pod keys made by  the {}", info.key_source));
    print(format!(
        "  pods run by       {} ({})",
        info.runtime.kind, info.runtime.reason
    ));
    print("  (the control plane's certificates came from ZTS through athenz-control-sia)".into());
}

async fn play(
    stack: &Stack,
    volume: VolumeMode,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<DemoReport> {
    let info = &stack.info;
    describe_stack(info, print);
    let kubelet = NodeKubelet::new(info, volume, &stack.state_dir.join("kubelet")).await?;
    let mut volumes = Vec::new();
    let played = issue_refresh_refuse(stack, &kubelet, &mut volumes, print).await;
    // Every volume mounted is unmounted, whatever happened: a failed demo leaves no mounts.
    let mut unmounted = Ok(());
    for mounted in &volumes {
        if let Err(e) = kubelet.take_down(info, mounted).await {
            unmounted = Err(e);
        }
    }
    let (pods, refresh, refused, cross_node, authorization) = played?;
    unmounted?;
    let volumes_left = count_volumes(&info.volumes_dir)?;
    print(format!(
        "\nunmounted {} volumes; volumes left on the node: {volumes_left}",
        volumes.len()
    ));
    if volumes_left != 0 {
        bail!(
            "{volumes_left} volumes are left in {}",
            info.volumes_dir.display()
        );
    }
    Ok(DemoReport {
        volume,
        runtime: stack.info.runtime.kind,
        pods,
        refresh,
        refused_after_delete: refused,
        refused_cross_node: cross_node,
        authorization,
        volumes_left,
        seconds: 0.0,
    })
}

/// The demo's pods get identities; one is refreshed; one is deleted and refused. `volumes`
/// collects every volume mounted, for the caller to unmount.
async fn issue_refresh_refuse(
    stack: &Stack,
    kubelet: &NodeKubelet,
    volumes: &mut Vec<MountedVolume>,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<Played> {
    let info = &stack.info;
    let kube = KubeClient::new(&info.kube_api.url)?;
    let mut pods = Vec::new();
    for (i, pod) in demo_pods().into_iter().enumerate() {
        let uid = kube.create_running_pod(&pod, &info.node_name).await?;
        if i == 0 {
            // its sidecar calls ZTS and serves tokens the demo reads, both on the host's
            // loopback, where the stand-ins listen: the pod has the host's network
            PodRuntime::of(info)?.use_host_network(&uid).await;
        }
        let (times, mounted) = kubelet.give_identity(info, &pod, &uid).await?;
        let issued_in = times.total;
        volumes.push(mounted.clone());
        let identity = identity::check(mounted.credentials_dir())
            .with_context(|| format!("checking the identity of {}", pod.name))?;
        print(format!(
            "\npod {}/{} (uid {uid}): identity in {:.1} ms",
            pod.namespace,
            pod.name,
            issued_in.as_secs_f64() * 1e3
        ));
        print_identity(&identity, print);
        if let Some(sia) = mounted.sia() {
            // its application container, started after the init container, reads the same set
            let app = node::app_reads(info, sia).await?;
            anyhow::ensure!(
                app.serial == identity.serial,
                "{}'s application container read serial {}, not {}",
                pod.name,
                app.serial,
                identity.serial
            );
            print(format!(
                "  app      its application container ({}) read the set: {}, serial {}",
                info.runtime.kind, app.common_name, app.serial
            ));
        }
        pods.push(PodReport {
            pod: format!("{}/{}", pod.namespace, pod.name),
            uid,
            identity,
            issued_in_ms: issued_in.as_secs_f64() * 1e3,
        });
    }
    let refresh = match volumes[0].sia() {
        Some(sia) => refresh_by_sidecar(stack, sia, print).await?,
        None => refresh_by_agent(&volumes[0], print).await?,
    };
    let cross_node = cross_node_refusal(stack, &volumes[1], print).await?;
    let authorization = match volumes[0].sia() {
        Some(sia) => Some(authorization(stack, sia, print).await?),
        None => {
            print("\nauthorization: role certificates and tokens come from the SIA; csi-files runs none in the pod".into());
            None
        }
    };
    kube.delete_pod(&volumes[2].pod.namespace, &volumes[2].pod.name)
        .await?;
    let refused = match volumes[2].sia() {
        Some(sia) => refuse_sidecar_refresh(stack, sia, print).await?,
        None => refuse_agent_rotation(kubelet, &volumes[2], print).await?,
    };
    Ok((pods, refresh, refused, cross_node, authorization))
}

/// What [`issue_refresh_refuse`] saw.
type Played = (
    Vec<PodReport>,
    RefreshReport,
    RefusalReport,
    RefusalReport,
    Option<AuthorizationReport>,
);

/// The pod's refresh sidecar with `media.sports:role.readers` as its target and a token server:
/// its access token for the role it is in (written beside its certificate and bound to it), a
/// refusal for a role it is not in, and a token read from the token server as an app would.
async fn authorization(
    stack: &Stack,
    volume: &PodVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<AuthorizationReport> {
    let info = &stack.info;
    let port = crate::procs::free_port()?;
    let token_file = volume
        .credentials_dir
        .join("tokens/media.sports:role.readers.accesstoken");
    let mut sidecar = node::sia_refresh(
        info,
        volume,
        "24h",
        &stack.state_dir.join("logs"),
        &[
            ("ZTS_URL", info.zts.url.clone()),
            ("SERVER_CA_CERT", PodRuntime::of(info)?.zts_ca(info)),
            ("TARGET_DOMAIN_ROLES", "media.sports:role.readers".into()),
            ("TOKEN_SERVER_ADDR", format!("127.0.0.1:{port}")),
            ("TOKEN_SERVER_REST_API", "true".into()),
        ],
    )
    .await?;
    let outcome = async {
        let token = poll_30s("the readers access token file", async || {
            sidecar.check_alive()?;
            Ok(std::fs::read_to_string(&token_file).ok())
        })
        .await?;
        let cert = std::fs::read_to_string(volume.credentials_dir.join(athenz_core::files::CERT_FILE))?;
        let claims = jwt_claims(&token)?;
        let granted: Vec<String> = serde_json::from_value(claims["scp"].clone()).unwrap_or_default();
        let leaf = athenz_core::crypto::pem_certificates(&cert)?;
        let thumbprint = athenz_testbed::zts::authz::thumbprint(leaf.first().context("no certificate")?);
        let bound = claims["cnf"]["x5t#S256"] == thumbprint.as_str();
        print(format!(
            "\nauthorization: {} is in media.sports:role.readers: its SIA wrote an access token for {} \
             granting {granted:?}, bound to its certificate: {bound}",
            volume.pod.name,
            claims["sub"]
        ));
        let server = format!("http://127.0.0.1:{port}/accesstoken");
        let client = reqwest::Client::new();
        let ask = |role: &'static str| {
            client
                .post(&server)
                .body(format!(r#"{{"domain":"media.sports","role":"{role}"}}"#))
                .send()
        };
        let refused = ask("writers").await?;
        let refusal = format!("{} {}", refused.status().as_u16(), refused.text().await?);
        print(format!(
            "  asked its token server for media.sports:role.writers (not a member): {refusal}"
        ));
        let answer = ask("readers").await?;
        anyhow::ensure!(answer.status() == 200, "the token server refused readers: {}", answer.text().await?);
        let body: serde_json::Value = answer.json().await?;
        let served = format!("token_type {}, expires_in {}", body["token_type"], body["expires_in"]);
        print(format!(
            "  read media.sports:role.readers from its token server (POST /accesstoken on 127.0.0.1:{port}): {served}"
        ));
        anyhow::ensure!(bound, "the access token is not bound to the pod's certificate");
        anyhow::ensure!(refusal.starts_with("403"), "writers was not refused: {refusal}");
        Ok(AuthorizationReport {
            pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
            member_of: "media.sports:role.readers".into(),
            granted,
            bound_to_certificate: bound,
            not_member_of: "media.sports:role.writers".into(),
            refusal,
            token_server: served,
        })
    }
    .await;
    sidecar.stop().await;
    let _ = sidecar.wait_exit(Duration::from_secs(5)).await;
    outcome.map_err(|e: anyhow::Error| e.context(sidecar.log_tail()))
}

/// The claims of a JWT, read without verifying (the tests verify; the demo shows).
fn jwt_claims(token: &str) -> anyhow::Result<serde_json::Value> {
    use base64::Engine;
    let payload = token.trim().split('.').nth(1).context("not a JWT")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// Node 2, as if compromised, uses its own certificate directly for a pod on node 1.
async fn cross_node_refusal(
    stack: &Stack,
    volume: &MountedVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefusalReport> {
    let info = &stack.info;
    let other = info.nodes.get(1).context("the demo runs two nodes")?;
    let subject = crate::crossnode::subject_of(info, &volume.pod, &volume.uid)?;
    let refusal = crate::crossnode::register_with_node_certificate(info, other, &subject).await?;
    print(format!(
        "\nnode {} used its own certificate for pod {}/{} (on {}): refused: {refusal}",
        other.name, volume.pod.namespace, volume.pod.name, info.node_name
    ));
    Ok(RefusalReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        refusal,
    })
}

fn print_identity(identity: &IdentityReport, print: &mut dyn FnMut(String)) {
    print(format!("  CN       {}", identity.common_name));
    for dns in &identity.dns_names {
        print(format!("  DNS      {dns}"));
    }
    for ip in &identity.ip_addresses {
        print(format!("  IP       {ip}"));
    }
    for uri in &identity.uris {
        print(format!("  URI      {uri}"));
    }
    print(format!("  expires  {}", identity.not_after));
    print(format!(
        "  chain    {} (verified)",
        identity.chain.join("  <-  ")
    ));
    print(format!("  ntoken   for {}", identity.ntoken_principal));
}

/// Asks `check` every 100 ms until it has an answer; `what` (what did not happen) after 30 s.
async fn poll_30s<T>(
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(answer) = check().await? {
            return Ok(answer);
        }
        if Instant::now() > deadline {
            bail!("{what} within 30 s");
        }
    }
}

/// Volumes in the volumes dir (entries named by a volume id).
pub fn count_volumes(volumes_dir: &Path) -> anyhow::Result<usize> {
    let entries = std::fs::read_dir(volumes_dir)
        .with_context(|| format!("listing {}", volumes_dir.display()))?;
    Ok(entries
        .filter_map(Result::ok)
        .filter(|e| VolumeId::parse(&e.file_name().to_string_lossy()).is_ok())
        .count())
}
