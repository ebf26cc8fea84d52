//! `athenz-devstack demo`: the whole system once through, on this machine. Three pods in two
//! namespaces get identities through the real driver, agent, jwt-service, ZTS and callback; one is
//! refreshed by the real sidecar; one is deleted and its refresh refused; every volume is unmounted.

use crate::identity::{self, IdentityReport};
use crate::kube::{KubeClient, NewPod};
use crate::node::{self, PodVolume};
use crate::stack::{Stack, StackInfo, StackOptions};
use anyhow::{Context, bail};
use athenz_core::volume::VolumeId;
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
    /// Its uid.
    pub uid: String,
    /// The identity its files show.
    pub identity: IdentityReport,
    /// Mount → files written, milliseconds.
    pub issued_in_ms: f64,
}

/// What the demo did.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// The pods and their identities.
    pub pods: Vec<PodReport>,
    /// The refreshed pod, its serial before and after.
    pub refresh: RefreshReport,
    /// The deleted pod and the agent's refusal.
    pub refused_after_delete: RefusalReport,
    /// Node 2's certificate used directly for a pod on node 1, and ZTS's refusal.
    pub refused_cross_node: RefusalReport,
    /// Volumes left in the volumes dir after every unmount (must be 0).
    pub volumes_left: usize,
    /// Whole demo, seconds.
    pub seconds: f64,
}

/// A refresh by the real sidecar.
#[derive(Debug, Serialize)]
pub struct RefreshReport {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// Serial before.
    pub old_serial: String,
    /// Serial after.
    pub new_serial: String,
    /// The sidecar's exit after SIGTERM (true: 0).
    pub sidecar_exited_cleanly: bool,
}

/// A refresh refused.
#[derive(Debug, Serialize)]
pub struct RefusalReport {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// The agent's answer.
    pub refusal: String,
}

/// Runs the demo in `state_dir`; `print` gets each human line as it happens.
pub async fn run(state_dir: &Path, print: &mut dyn FnMut(String)) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    print(format!("starting the stack in {}", state_dir.display()));
    // two nodes: the demo shows that one cannot obtain the other's pods' identities
    let stack = Stack::start(&StackOptions {
        nodes: 2,
        ..StackOptions::new(state_dir.to_owned(), "p256")
    })
    .await?;
    let result = play(&stack, print).await;
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
    print("  (the control plane's certificates came from ZTS through athenz-control-sia)".into());
}

async fn play(stack: &Stack, print: &mut dyn FnMut(String)) -> anyhow::Result<DemoReport> {
    let info = &stack.info;
    describe_stack(info, print);
    let mut volumes = Vec::new();
    let played = issue_refresh_refuse(stack, &mut volumes, print).await;
    // Every volume mounted is unmounted, whatever happened: a failed demo leaves no mounts.
    let mut unmounted = Ok(());
    for volume in &volumes {
        if let Err(e) = node::unmount(info, volume).await {
            unmounted = Err(e);
        }
    }
    let (pods, refresh, refused, cross_node) = played?;
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
        pods,
        refresh,
        refused_after_delete: refused,
        refused_cross_node: cross_node,
        volumes_left,
        seconds: 0.0,
    })
}

/// The demo's pods get identities; one is refreshed; one is deleted and refused. `volumes`
/// collects every volume mounted, for the caller to unmount.
async fn issue_refresh_refuse(
    stack: &Stack,
    volumes: &mut Vec<PodVolume>,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<(Vec<PodReport>, RefreshReport, RefusalReport, RefusalReport)> {
    let info = &stack.info;
    let kube = KubeClient::new(&info.kube_api.url)?;
    let kubelet_root = stack.state_dir.join("kubelet");
    let mut pods = Vec::new();
    for pod in demo_pods() {
        let started = Instant::now();
        let uid = kube.create_running_pod(&pod, &info.node_name).await?;
        let volume = node::mount(info, &kubelet_root, &pod, &uid).await?;
        volumes.push(volume.clone());
        node::sia_init(info, &volume).await?;
        let issued_in = started.elapsed();
        let identity = identity::check(&volume.credentials_dir)
            .with_context(|| format!("checking the identity of {}", pod.name))?;
        print(format!(
            "\npod {}/{} (uid {uid}): identity in {:.1} ms",
            pod.namespace,
            pod.name,
            issued_in.as_secs_f64() * 1e3
        ));
        print_identity(&identity, print);
        pods.push(PodReport {
            pod: format!("{}/{}", pod.namespace, pod.name),
            uid,
            identity,
            issued_in_ms: issued_in.as_secs_f64() * 1e3,
        });
    }
    let refresh = refresh_one(stack, &volumes[0], print).await?;
    let cross_node = cross_node_refusal(stack, &volumes[1], print).await?;
    let refused = delete_and_refuse(stack, &kube, &volumes[2], print).await?;
    Ok((pods, refresh, refused, cross_node))
}

/// Node 2, as if compromised, uses its own certificate directly for a pod on node 1.
async fn cross_node_refusal(
    stack: &Stack,
    volume: &PodVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefusalReport> {
    let info = &stack.info;
    let other = info.nodes.get(1).context("the demo runs two nodes")?;
    let subject = crate::crossnode::subject_of(info, &volume.pod, &volume.uid)?;
    let refusal = crate::crossnode::register_with_node_certificate(info, other, &subject).await?;
    print(format!(
        "
node {} used its own certificate for pod {}/{} (on {}): refused: {refusal}",
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

/// Runs the real refresh sidecar with a 1 s ceiling until it has replaced the certificate.
async fn refresh_one(
    stack: &Stack,
    volume: &PodVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefreshReport> {
    let before = identity::check(&volume.credentials_dir)?.serial;
    let mut sidecar = node::sia_refresh(&stack.info, volume, "1s", &stack.state_dir.join("logs"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(now) = identity::check(&volume.credentials_dir)
            && now.serial != before
        {
            break now.serial;
        }
        sidecar.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "the refresh sidecar did not refresh within 30 s:\n{}",
                sidecar.log_tail()
            );
        }
    };
    sidecar.stop().await;
    let clean = sidecar
        .wait_exit(Duration::from_secs(5))
        .await
        .unwrap_or(false);
    print(format!(
        "\nrefresh: athenz-sia refresh replaced {}'s certificate: serial {before} -> {after}; \
         sidecar exited {}",
        volume.pod.name,
        if clean { "0 on SIGTERM" } else { "uncleanly" }
    ));
    Ok(RefreshReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        old_serial: before,
        new_serial: after,
        sidecar_exited_cleanly: clean,
    })
}

/// Deletes the pod, then asks for a refresh with its current pair, as its sidecar would.
async fn delete_and_refuse(
    stack: &Stack,
    kube: &KubeClient,
    volume: &PodVolume,
    print: &mut dyn FnMut(String),
) -> anyhow::Result<RefusalReport> {
    kube.delete_pod(&volume.pod.namespace, &volume.pod.name)
        .await?;
    let refusal = match node::refresh_once(&stack.info, volume).await? {
        Ok(_) => bail!("the agent refreshed the identity of a deleted pod"),
        Err(refusal) => refusal,
    };
    print(format!(
        "\ndeleted pod {}/{}; its refresh was refused: {refusal}",
        volume.pod.namespace, volume.pod.name
    ));
    Ok(RefusalReport {
        pod: format!("{}/{}", volume.pod.namespace, volume.pod.name),
        refusal,
    })
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
