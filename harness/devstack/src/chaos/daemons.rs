//! Faults of this system's daemons: the agent and the jwt-service killed and restarted as
//! kubelet restarts them, the agent's own node certificate left to expire, and the agent
//! replaced by another build as a DaemonSet rolling update does.

use super::watch::{
    Effects, Pods, Tally, align_with_a_renewal, recover, recover_when, row, signal, watch,
};
use super::{Fault, FaultResult};
use crate::bench::bench_pod;
use crate::kube::{KubeClient, PodSize};
use crate::pod_volume::NodeKubelet;
use crate::procs::Stopped;
use crate::stack::{FAULTS_FILE, Stack};
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use athenz_testbed::faults::Faults;
use nix::sys::signal::Signal;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When the agent's node certificate expires, from its metric
/// `athenz_agent_node_certificate_expiry_seconds` (what an operator would alert on).
pub(super) async fn node_cert_expiry(
    info: &crate::stack::StackInfo,
) -> anyhow::Result<time::OffsetDateTime> {
    let url = &info
        .nodes
        .first()
        .context("a stack without nodes")?
        .agent
        .metrics_url;
    let text = crate::scrape::text(url).await?;
    let value = crate::scrape::samples(&text, "node_certificate_expiry_seconds")
        .map(|(_, v)| v)
        .next()
        .with_context(|| format!("no node_certificate_expiry_seconds in {url}"))?;
    // a timestamp in whole seconds
    #[allow(clippy::cast_possible_truncation)]
    let seconds = value as i64;
    time::OffsetDateTime::from_unix_timestamp(seconds).context("the node certificate's expiry")
}

/// ZTS stopped until the agent's own certificate (its client identity to the jwt-service) has
/// expired: the agent cannot issue anything until ZTS is back and it registers anew. Recovery
/// needs the node certificate valid again as well as every pod healthy.
pub(super) async fn agent_node_cert_expired(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    const PAST_EXPIRY: Duration = Duration::from_secs(5);
    let expires = node_cert_expiry(&stack.info).await?;
    let until_expiry =
        Duration::try_from(expires - time::OffsetDateTime::now_utc()).unwrap_or(Duration::ZERO);
    let hold = (until_expiry + PAST_EXPIRY).min(lifetime * 2);
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    signal(stack, "zts", Signal::SIGSTOP)?;
    let held = watch(stack, pods, &mut tally, hold, |_, _| Ok(())).await;
    let expired_while_stopped = match node_cert_expiry(&stack.info).await {
        Ok(at) => at <= time::OffsetDateTime::now_utc(),
        Err(_) => false,
    };
    signal(stack, "zts", Signal::SIGCONT)?;
    held?;
    let metrics_stack = stack.info.clone();
    let recovery = recover_when(stack, pods, &mut tally, async || {
        node_cert_valid(&metrics_stack).await
    })
    .await?;
    let mut result = row(
        Fault::AgentNodeCertExpired,
        format!(
            "ZTS stopped {} s; the node certificate {} while it was away; {}",
            hold.as_secs(),
            if expired_while_stopped {
                "expired"
            } else {
                "did NOT expire"
            },
            before.since(stack, pods).describe()
        ),
        &tally,
        recovery,
        true,
    );
    result.passed &= expired_while_stopped;
    Ok(result)
}

pub(super) async fn node_cert_valid(info: &crate::stack::StackInfo) -> bool {
    node_cert_expiry(info)
        .await
        .is_ok_and(|at| at > time::OffsetDateTime::now_utc())
}

pub(super) async fn killed(
    stack: &mut Stack,
    pods: &mut Pods,
    component: &'static str,
    fault: Fault,
    over: Duration,
) -> anyhow::Result<FaultResult> {
    const KILLS: u32 = 5;
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    let mut done = 0;
    let spacing = over / (KILLS + 1);
    watch(stack, pods, &mut tally, over, |stack, elapsed| {
        if done < KILLS && elapsed >= spacing * (done + 1) {
            // the stack's record of pids is refreshed by each restart
            stack.write_stack_json()?;
            signal(stack, component, Signal::SIGKILL)?;
            done += 1;
        }
        Ok(())
    })
    .await?;
    stack.write_stack_json()?;
    let recovery = recover(stack, pods, &mut tally).await?;
    Ok(row(
        fault,
        format!(
            "SIGKILL x{done} over {} s, restarted each time; {}",
            over.as_secs(),
            before.since(stack, pods).describe()
        ),
        &tally,
        recovery,
        false,
    ))
}

/// Pods that start while the agent is replaced.
const STARTING_DURING_UPGRADE: usize = 3;
/// How long the kubelet takes to list pods while the old agent is stopped, so the starting
/// pods' requests are inside it (waiting on the kubelet) when SIGTERM comes.
const IN_FLIGHT_KUBELET_DELAY_MS: u64 = 3000;
/// How long the old agent has to drain (a DaemonSet's `terminationGracePeriodSeconds` is 30 s
/// by default; the agent's own drain grace is 20 s).
const UPGRADE_GRACE: Duration = Duration::from_secs(30);

/// The part of the agent's log from its SIGTERM to the next start: what the old agent did
/// while it drained.
fn drained_segment(log: &str) -> &str {
    let Some(start) = log.find("SIGTERM received") else {
        return "";
    };
    let rest = &log[start..];
    rest.find("agent listening")
        .map_or(rest, |end| &rest[..end])
}

/// The node's agent replaced by another build while pods renew and others start, as a
/// DaemonSet rolling update replaces it: SIGTERM, the old agent drains, the new binary starts on
/// the same state directory and sockets (`upgrade_to`'s `athenz-identity-agent`, or a copy of
/// the running one: another file, as a new image's is). Bounds: the old agent exits by itself
/// and answers, after its SIGTERM, the requests it had (the starting pods' inits, held at the
/// kubelet); every starting pod gets its identity; flex pods renew through the sockets they had
/// mounted; files-mode volumes resume; a files-mode volume published after the upgrade gets its
/// identity (the CSI socket is served again); no pod's files expire.
pub(super) async fn agent_upgraded(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
    upgrade_to: Option<&Path>,
    first_pod: usize,
) -> anyhow::Result<FaultResult> {
    let info = Arc::new(stack.info.clone());
    let next = match upgrade_to {
        Some(dir) => dir.join("athenz-identity-agent"),
        None => {
            let current = stack
                .program_of("agent")
                .context("no agent in the stack")?
                .to_owned();
            let dir = stack.state_dir.join("bin-next");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let next = dir.join("athenz-identity-agent");
            std::fs::copy(&current, &next)
                .with_context(|| format!("copying {} to {}", current.display(), next.display()))?;
            next
        }
    };
    let kube = KubeClient::new(&info.kube_api.url)?;
    let kubelet_dir = stack.state_dir.join("kubelet");
    let flex = NodeKubelet::new(&info, VolumeMode::Flex, &kubelet_dir).await?;
    let files = NodeKubelet::new(&info, VolumeMode::CsiFiles, &kubelet_dir).await?;
    let faults_file = stack.state_dir.join(FAULTS_FILE);
    let log_path = stack.state_dir.join("logs").join("agent.log");
    let log_start = std::fs::metadata(&log_path).map_or(0, |m| m.len());

    align_with_a_renewal(stack, pods).await?;
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    Faults {
        kubelet_delay_ms: IN_FLIGHT_KUBELET_DELAY_MS,
        ..Faults::default()
    }
    .write(&faults_file)?;
    // created now, so no pod list the agent holds has them: their requests wait on the kubelet
    tokio::time::sleep(athenz_testbed::faults::POLL * 2).await;
    let mut starting = Vec::new();
    for n in first_pod..first_pod + STARTING_DURING_UPGRADE {
        let pod = bench_pod(n);
        let uid = kube
            .create_running_pod_sized(&pod, &info.node_name, PodSize::Real)
            .await?;
        starting.push((pod, uid));
    }
    let mut launches = tokio::task::JoinSet::new();
    for (pod, uid) in starting {
        let (info, flex) = (info.clone(), flex.clone());
        launches.spawn(async move {
            let given = flex.give_identity(&info, &pod, &uid).await;
            given.with_context(|| format!("the identity of {}", pod.name))
        });
    }
    // the starting pods' mounts and init containers reach the agent, which waits on the kubelet
    tokio::time::sleep(Duration::from_millis(IN_FLIGHT_KUBELET_DELAY_MS / 2)).await;
    let ready = info.agent.metrics_url.replace("/metrics", "/readyz");
    let replaced = stack
        .replace("agent", Some(&next), UPGRADE_GRACE, &ready)
        .await;
    Faults::default().write(&faults_file)?;
    let stopped = replaced?;
    let upgraded_at = Instant::now();

    let mut started_ok = 0;
    let mut mounted = Vec::new();
    while let Some(joined) = launches.join_next().await {
        let (_, volume) = joined.context("a starting pod's task")??;
        started_ok += 1;
        mounted.push(volume);
    }
    // flex pods renew through the socket directories they had mounted; files-mode volumes resume
    let held = watch(stack, pods, &mut tally, lifetime / 2, |_, _| Ok(())).await;
    held?;
    let renewed_after = tally.renewed.len();
    let recovery = recover(stack, pods, &mut tally).await?;
    let late_files_pod = bench_pod(first_pod + STARTING_DURING_UPGRADE);
    let late_files_uid = kube
        .create_running_pod_sized(&late_files_pod, &info.node_name, PodSize::Real)
        .await?;
    let (_, late) = files
        .give_identity(&info, &late_files_pod, &late_files_uid)
        .await
        .context("publishing a files-mode volume after the upgrade")?;
    files.take_down(&info, &late).await?;
    for volume in &mounted {
        flex.take_down(&info, volume).await?;
    }

    let log = std::fs::read(&log_path).context("reading the agent's log")?;
    let log = String::from_utf8_lossy(log.get(usize::try_from(log_start)?..).unwrap_or(&[]));
    let drained = drained_segment(&log);
    // every call answered: an init's "identity issued", the others' "answered"
    let answered_while_draining =
        drained.matches("identity issued").count() + drained.matches(" answered ").count();
    let cut_short = drained.contains("connections still open after the grace period");
    let (exited, after) = match stopped {
        Stopped::ByItself { status, after } => (status.success(), after),
        Stopped::Killed { after } => (false, after),
    };
    let effects = before.since(stack, pods);
    let mut result = row(
        Fault::AgentUpgraded,
        format!(
            "SIGTERM, {} {:.1} s later{}; {answered_while_draining} calls answered while \
             draining; {started_ok}/{STARTING_DURING_UPGRADE} starting pods got theirs; {renewed_after} \
             pods renewed through the new agent ({:.0} s); a files-mode volume published after; {}",
            if exited {
                "exited by itself"
            } else {
                "did NOT exit by itself"
            },
            after.as_secs_f64(),
            if cut_short {
                ", connections cut at the grace"
            } else {
                ""
            },
            upgraded_at.elapsed().as_secs_f64(),
            effects.describe()
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= exited
        && !cut_short
        && answered_while_draining > 0
        && started_ok == STARTING_DURING_UPGRADE
        && renewed_after > 0;
    Ok(result)
}

/// Pods that start while the control plane rolls.
const STARTING_DURING_ROLL: usize = 2;
/// Between one replica ready and the next replaced (a Deployment's `minReadySeconds`).
const ROLL_PAUSE: Duration = Duration::from_secs(5);

/// The jwt-service's and the callback's Deployments (two replicas each, behind one Service
/// address each) rolled one replica at a time while pods renew and two start: each replica
/// leaves its Service, drains on SIGTERM and is replaced by a new process on its ports.
/// Bounds: every replica exits by itself; every starting pod gets its identity; renewals pass
/// through it (some during the roll); no pod's files expire.
pub(super) async fn control_plane_rolled(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
    first_pod: usize,
) -> anyhow::Result<FaultResult> {
    let info = Arc::new(stack.info.clone());
    let kube = KubeClient::new(&info.kube_api.url)?;
    let flex = NodeKubelet::new(&info, VolumeMode::Flex, &stack.state_dir.join("kubelet")).await?;
    align_with_a_renewal(stack, pods).await?;
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    tally.add(&pods.census());
    let started = Instant::now();
    let mut launches = tokio::task::JoinSet::new();
    for n in first_pod..first_pod + STARTING_DURING_ROLL {
        let pod = bench_pod(n);
        let uid = kube
            .create_running_pod_sized(&pod, &info.node_name, PodSize::Real)
            .await?;
        let (info, flex) = (info.clone(), flex.clone());
        launches.spawn(async move {
            let given = flex.give_identity(&info, &pod, &uid).await;
            given.with_context(|| format!("the identity of {}", pod.name))
        });
    }
    let mut rolled = Vec::new();
    for deployment in ["jwt-service", "callback"] {
        rolled.extend(stack.roll(deployment, UPGRADE_GRACE, ROLL_PAUSE).await?);
        tally.add(&pods.census());
    }
    let roll_took = started.elapsed();
    let renewed_during = tally.renewed.len();
    let mut mounted = Vec::new();
    while let Some(joined) = launches.join_next().await {
        mounted.push(joined.context("a starting pod's task")??.1);
    }
    let held = watch(stack, pods, &mut tally, lifetime / 4, |_, _| Ok(())).await;
    held?;
    let recovery = recover(stack, pods, &mut tally).await?;
    for volume in &mounted {
        flex.take_down(&info, volume).await?;
    }
    let drained = rolled
        .iter()
        .filter(|r| matches!(r.stopped, Stopped::ByItself { status, .. } if status.success()))
        .count();
    let effects = before.since(stack, pods);
    let mut result = row(
        Fault::ControlPlaneRolled,
        format!(
            "{} replicas replaced one at a time in {:.0} s, {drained} of them exited by \
             themselves; {} of {STARTING_DURING_ROLL} starting pods got their identity; \
             {renewed_during} pods renewed during the roll, {}",
            rolled.len(),
            roll_took.as_secs_f64(),
            mounted.len(),
            effects.describe()
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= drained == rolled.len()
        && rolled.len() == 4
        && mounted.len() == STARTING_DURING_ROLL
        && !tally.renewed.is_empty();
    Ok(result)
}
