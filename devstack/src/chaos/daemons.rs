//! Faults of this system's daemons: the agent and the jwt-service killed and restarted as
//! kubelet restarts them, and the agent's own node certificate left to expire.

use super::watch::{Effects, Pods, Tally, recover, recover_when, row, signal, watch};
use super::{Fault, FaultResult};
use crate::stack::Stack;
use anyhow::Context;
use nix::sys::signal::Signal;
use std::time::Duration;

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
    let text = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("reading {url}"))?
        .text()
        .await?;
    let value = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.split_once(' ')?;
            name.ends_with("node_certificate_expiry_seconds")
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
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
