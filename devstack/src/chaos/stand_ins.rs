//! Faults of the stand-ins for what cannot run here (ZTS, the Kubernetes API, the kubelet):
//! errors put in force through the faults file they follow ([`athenz_testbed::faults`]), and ZTS
//! frozen outright.

use super::watch::{Effects, Pods, Tally, align_with_a_renewal, recover, row, signal, watch};
use super::{Fault, FaultResult};
use crate::stack::{FAULTS_FILE, Stack};
use athenz_testbed::faults::Faults;
use nix::sys::signal::Signal;
use std::time::Duration;

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
