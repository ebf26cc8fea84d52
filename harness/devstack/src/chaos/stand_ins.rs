//! Faults of the stand-ins for what cannot run here (ZTS, the Kubernetes API, the kubelet):
//! errors put in force through the faults file they follow ([`athenz_testbed::faults`]), the
//! API server down while a pod starts, and ZTS frozen outright.

use super::watch::{
    Effects, Pods, RECOVERY_BOUND, Tally, align_with_a_renewal, recover, row, signal, watch,
};
use super::{Fault, FaultResult};
use crate::bench::bench_pod;
use crate::kube::{KubeClient, PodSize};
use crate::pod_volume::NodeKubelet;
use crate::stack::{FAULTS_FILE, Stack};
use anyhow::Context;
use athenz_core::volume_mode::VolumeMode;
use athenz_testbed::faults::Faults;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

/// A fault put in force through the faults file for `hold`.
pub(super) struct Injection {
    pub(super) fault: Fault,
    pub(super) faults: Faults,
    pub(super) hold: Duration,
    pub(super) what: String,
}

/// Puts `injection` in force when a pod is about to renew, holds it, clears it (whatever
/// happened), and waits for recovery. An outage under which no renewal failed did not bite and
/// fails; under a slow kubelet renewals must happen and pass.
pub(super) async fn inject(
    stack: &mut Stack,
    pods: &mut Pods,
    injection: Injection,
) -> anyhow::Result<FaultResult> {
    let file = stack.state_dir.join(FAULTS_FILE);
    align_with_a_renewal(stack, pods).await?;
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    injection.faults.write(&file)?;
    let held = watch(stack, pods, &mut tally, injection.hold, |_, _| Ok(())).await;
    Faults::default().write(&file)?;
    held?;
    let renewed_during = tally.renewed.len();
    let recovery = recover(stack, pods, &mut tally).await?;
    let effects = before.since(stack, pods);
    // an outage must make renewals fail; a slow kubelet must let them pass, slowly
    let bit = if injection.fault == Fault::KubeletSlow {
        renewed_during > 0 && effects.failed_renewals == 0
    } else {
        effects.failed_renewals > 0
    };
    let mut result = row(
        injection.fault,
        format!(
            "{} for {} s; {} renewed during it, {}{}",
            injection.what,
            injection.hold.as_secs(),
            renewed_during,
            effects.describe(),
            if bit {
                ""
            } else {
                " (the fault did not act as it must)"
            }
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= bit;
    Ok(result)
}

pub(super) async fn zts_stopped(
    stack: &mut Stack,
    pods: &mut Pods,
    lifetime: Duration,
) -> anyhow::Result<FaultResult> {
    let before = Effects::now(stack, pods);
    let mut tally = Tally::default();
    signal(stack, "zts", Signal::SIGSTOP)?;
    let held = watch(stack, pods, &mut tally, lifetime * 3, |_, _| Ok(())).await;
    // whatever happened, ZTS must run again
    signal(stack, "zts", Signal::SIGCONT)?;
    held?;
    let recovery = recover(stack, pods, &mut tally).await?;
    Ok(row(
        Fault::ZtsStopped,
        format!(
            "SIGSTOP for {} s; {}",
            (lifetime * 3).as_secs(),
            before.since(stack, pods).describe()
        ),
        &tally,
        recovery,
        true,
    ))
}

/// `"cannot decide now"` answers (504) in the callback's log so far: what it says when the
/// Kubernetes API cannot be read (`callback/src/handler.rs`).
fn callback_undecided(stack: &Stack) -> usize {
    std::fs::read_to_string(stack.state_dir.join("logs").join("callback.log"))
        .map(|text| text.matches("cannot decide now").count())
        .unwrap_or(0)
}

/// The Kubernetes API refusing connections for `hold` (its port closed, as an API server that
/// is down; not `callback-denying`, where it answers 404), while pod `starting` — created
/// before, as the scheduler had — is mounted and its init container runs. The callback cannot
/// read pods, so it answers ZTS 504 ("cannot decide now", which ZTS passes on and the pod
/// retries) rather than 403, which would end the launch. Bounds: no pod's files expire; the
/// callback answered 504 at least once; the starting pod gets its identity only after the API
/// is back, and within the recovery bound of it.
pub(super) async fn api_server_unreachable(
    stack: &mut Stack,
    pods: &mut Pods,
    hold: Duration,
    starting: usize,
) -> anyhow::Result<FaultResult> {
    let info = std::sync::Arc::new(stack.info.clone());
    let kube = KubeClient::new(&info.kube_api.url)?;
    let pod = bench_pod(starting);
    let uid = kube
        .create_running_pod_sized(&pod, &info.node_name, PodSize::Real)
        .await?;
    let kubelet =
        NodeKubelet::new(&info, VolumeMode::Flex, &stack.state_dir.join("kubelet")).await?;
    let file = stack.state_dir.join(FAULTS_FILE);
    align_with_a_renewal(stack, pods).await?;
    let before = Effects::now(stack, pods);
    let undecided_before = callback_undecided(stack);
    let mut tally = Tally::default();
    Faults {
        api_unreachable: true,
        ..Faults::default()
    }
    .write(&file)?;
    // the stand-in follows the file within its poll: the launch starts once the port is closed
    let api = api_addr(&info.kube_api.url)?;
    api_refusing_becomes(api, true).await?;
    let launch = {
        let (info, kubelet, pod, uid) = (info.clone(), kubelet.clone(), pod.clone(), uid.clone());
        tokio::spawn(async move {
            let given = kubelet.give_identity(&info, &pod, &uid).await;
            (given, Instant::now())
        })
    };
    let held = watch(stack, pods, &mut tally, hold, |_, _| Ok(())).await;
    let launched_during = launch.is_finished();
    Faults::default().write(&file)?;
    let reopened = api_refusing_becomes(api, false).await;
    let back = Instant::now();
    held?;
    reopened?;
    let recovery = recover(stack, pods, &mut tally).await?;
    let (given, given_at) = tokio::time::timeout(RECOVERY_BOUND * 2, launch)
        .await
        .context("the starting pod's launch did not end")?
        .context("the starting pod's launch")?;
    let mounted = given
        .with_context(|| format!("the identity of {}", pod.name))?
        .1;
    let after_back = given_at.saturating_duration_since(back);
    kubelet.take_down(&info, &mounted).await?;
    let undecided = callback_undecided(stack).saturating_sub(undecided_before);
    let effects = before.since(stack, pods);
    let mut result = row(
        Fault::ApiServerUnreachable,
        format!(
            "the API server refusing connections for {} s; the callback answered 504 {undecided} \
             times; {} renewed during it, {}; the pod starting during it got its identity {}",
            hold.as_secs(),
            tally.renewed.len(),
            effects.describe(),
            if launched_during {
                "DURING the outage".to_owned()
            } else {
                format!("{:.1} s after the API was back", after_back.as_secs_f64())
            }
        ),
        &tally,
        recovery,
        false,
    );
    result.passed &= undecided > 0 && !launched_during && after_back <= RECOVERY_BOUND;
    Ok(result)
}

/// The API stand-in's address, from its URL (`http://127.0.0.1:<port>`).
fn api_addr(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .with_context(|| format!("the API URL {url} is not http://host:port"))?;
    authority
        .parse()
        .with_context(|| format!("the API URL {url}: {authority} is not an address"))
}

/// Waits (at most 10 s) until connecting to the API is refused (`refusing`) or accepted again.
async fn api_refusing_becomes(api: std::net::SocketAddr, refusing: bool) -> anyhow::Result<()> {
    const LIMIT: Duration = Duration::from_secs(10);
    let started = Instant::now();
    loop {
        let refused = matches!(
            tokio::net::TcpStream::connect(api).await,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        if refused == refusing {
            return Ok(());
        }
        if started.elapsed() > LIMIT {
            anyhow::bail!(
                "the API stand-in at {api} did not {} within {LIMIT:?}",
                if refusing {
                    "close its port"
                } else {
                    "open its port again"
                }
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
