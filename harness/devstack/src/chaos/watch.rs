//! The chaos runner's machinery: the pods of a run, supervising them as kubelet would, reading
//! every set, holding a fault while tallying what the pods saw, timing recovery, and the row a
//! fault ends in.

use super::{Fault, FaultResult};
use crate::fleet::{Census, Fleet};
use crate::stack::Stack;
use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often the pods' sets are read and the stack supervised.
pub(super) const TICK: Duration = Duration::from_millis(250);
/// The SIA's longest backoff between attempts (`athenz_core::refresh::Backoff::default().max`).
pub(super) const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// One refresh round after the backoff: the bound on recovery.
pub(super) const RECOVERY_BOUND: Duration = Duration::from_secs(BACKOFF_CAP.as_secs() + 15);

/// Every pod of the run: flex pods first, then files-mode pods (census indices run on).
pub(super) struct Pods {
    pub(super) flex: Fleet,
    pub(super) files: Fleet,
}

impl Pods {
    pub(super) fn census(&self) -> Census {
        let (mut all, files) = (self.flex.census(), self.files.census());
        let offset = self.flex.volumes.len();
        all.serials.extend(files.serials);
        all.lifetime_used.extend(files.lifetime_used);
        all.expired.extend(files.expired.iter().map(|i| i + offset));
        all.overdue.extend(files.overdue.iter().map(|i| i + offset));
        all.torn.extend(files.torn.iter().map(|i| i + offset));
        all.unreadable.extend(
            files
                .unreadable
                .into_iter()
                .map(|(i, why)| (i + offset, why)),
        );
        all
    }

    /// Renewals that failed so far: the sidecars' and the agent's files-mode ones, as their
    /// logs say.
    pub(super) fn failed_renewals(&self, stack: &Stack) -> u64 {
        let count = |path: &Path, marker: &str| {
            std::fs::read_to_string(path)
                .map(|text| text.matches(marker).count() as u64)
                .unwrap_or(0)
        };
        let sidecars: u64 = self
            .flex
            .refreshers
            .iter()
            .map(|s| count(&s.process.log_path(), "refresh failed"))
            .sum();
        let agent = count(
            &stack.state_dir.join("logs").join("agent.log"),
            "re-issue failed",
        );
        sidecars + agent
    }
}

/// Restarts what exited, as kubelet would, and reads every set.
pub(super) async fn supervise(stack: &mut Stack, pods: &mut Pods) -> anyhow::Result<Census> {
    stack.restart_exited()?;
    pods.flex.restart_exited_refreshers().await?;
    Ok(pods.census())
}

pub(super) fn healthy(census: &Census) -> bool {
    census.all_healthy() && census.overdue.is_empty()
}

/// Waits until every pod is healthy (at most `limit`).
pub(super) async fn settle(
    stack: &mut Stack,
    pods: &mut Pods,
    limit: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + limit;
    loop {
        let census = supervise(stack, pods).await?;
        if healthy(&census) {
            return Ok(());
        }
        if Instant::now() >= until {
            bail!("the pods did not all become healthy within {limit:?}: {census:?}");
        }
        tokio::time::sleep(TICK).await;
    }
}

/// What one window of reads saw.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) affected: BTreeSet<usize>,
    pub(super) expired: BTreeSet<usize>,
    pub(super) torn: u64,
    /// Each pod's certificate serial at the first read, and the pods whose serial changed since
    /// (renewed).
    pub(super) first_serials: Option<Vec<Option<String>>>,
    pub(super) renewed: BTreeSet<usize>,
}

impl Tally {
    pub(super) fn add(&mut self, census: &Census) {
        self.affected
            .extend(census.overdue.iter().chain(&census.expired));
        self.expired.extend(&census.expired);
        self.torn += census.torn.len() as u64;
        let first = self
            .first_serials
            .get_or_insert_with(|| census.serials.clone());
        for (i, (then, now)) in first.iter().zip(&census.serials).enumerate() {
            if now.is_some() && then != now {
                self.renewed.insert(i);
            }
        }
    }
}

/// Holds for `hold`, running `during` at each tick (it gets the time since the start).
pub(super) async fn watch(
    stack: &mut Stack,
    pods: &mut Pods,
    tally: &mut Tally,
    hold: Duration,
    mut during: impl FnMut(&mut Stack, Duration) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < hold {
        during(stack, started.elapsed())?;
        tally.add(&supervise(stack, pods).await?);
        tokio::time::sleep(TICK).await;
    }
    Ok(())
}

/// From now until every pod is healthy and `also` holds (or twice the bound): the recovery
/// time.
pub(super) async fn recover_when(
    stack: &mut Stack,
    pods: &mut Pods,
    tally: &mut Tally,
    mut also: impl AsyncFnMut() -> bool,
) -> anyhow::Result<Option<f64>> {
    let started = Instant::now();
    while started.elapsed() < RECOVERY_BOUND * 2 {
        let census = supervise(stack, pods).await?;
        tally.add(&census);
        if healthy(&census) && also().await {
            return Ok(Some(started.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(TICK).await;
    }
    Ok(None)
}

pub(super) async fn recover(
    stack: &mut Stack,
    pods: &mut Pods,
    tally: &mut Tally,
) -> anyhow::Result<Option<f64>> {
    recover_when(stack, pods, tally, async || true).await
}

pub(super) fn row(
    fault: Fault,
    detail: String,
    tally: &Tally,
    recovery: Option<f64>,
    expiry_allowed: bool,
) -> FaultResult {
    let bound = RECOVERY_BOUND.as_secs_f64();
    FaultResult {
        fault,
        detail,
        pods_affected: tally.affected.len(),
        pods_expired: tally.expired.len(),
        torn_sets: tally.torn,
        recovery_seconds: recovery,
        bound_seconds: bound,
        passed: tally.torn == 0
            && (expiry_allowed || tally.expired.is_empty())
            && recovery.is_some_and(|r| r <= bound),
    }
}

pub(super) fn signal(stack: &Stack, component: &str, signal: Signal) -> anyhow::Result<()> {
    let pid = *stack
        .info
        .processes
        .get(component)
        .with_context(|| format!("no {component} in the stack"))?;
    let pid = i32::try_from(pid).context("a pid")?;
    kill(Pid::from_raw(pid), signal).with_context(|| format!("signalling {component}"))
}

/// What the renewals and sidecars did between two points of a fault.
pub(super) struct Effects {
    pub(super) failed_renewals: u64,
    pub(super) sidecar_exits: u32,
}

impl Effects {
    pub(super) fn now(stack: &Stack, pods: &Pods) -> Self {
        Self {
            failed_renewals: pods.failed_renewals(stack),
            sidecar_exits: pods.flex.sidecar_exits(),
        }
    }

    pub(super) fn since(&self, stack: &Stack, pods: &Pods) -> Self {
        let now = Self::now(stack, pods);
        Self {
            failed_renewals: now.failed_renewals.saturating_sub(self.failed_renewals),
            sidecar_exits: now.sidecar_exits.saturating_sub(self.sidecar_exits),
        }
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "{} renewals failed, {} sidecar exits",
            self.failed_renewals, self.sidecar_exits
        )
    }
}

/// Where renewal starts: the SIA and the agent renew at 70 % of the lifetime less up to 10 %
/// of jitter (`RefreshPolicy::default()`).
pub(super) const RENEWAL_STARTS: f64 = 0.6;

/// Waits until the pod next to renew enters its renewal window, so a fault put in force now
/// meets at least one renewal while it lasts (a quarter lifetime > the 10 % window) instead
/// of by chance — and at the harshest point for that pod: its retries must succeed in what is
/// left after the fault.
pub(super) async fn align_with_a_renewal(stack: &mut Stack, pods: &mut Pods) -> anyhow::Result<()> {
    let started = Instant::now();
    let limit = Duration::from_secs(600);
    let next = |census: &Census| {
        census
            .lifetime_used
            .iter()
            .flatten()
            .copied()
            .filter(|used| *used < RENEWAL_STARTS)
            .fold(None, |best: Option<f64>, used| {
                Some(best.map_or(used, |b| b.max(used)))
            })
    };
    let Some(mut waiting_for) = next(&supervise(stack, pods).await?) else {
        return Ok(()); // every pod is already in its window
    };
    while started.elapsed() < limit {
        let census = supervise(stack, pods).await?;
        match next(&census) {
            // the pod crossed into its window (it no longer counts as before it)
            Some(used) if used < waiting_for => return Ok(()),
            Some(used) => waiting_for = used,
            None => return Ok(()),
        }
        tokio::time::sleep(TICK).await;
    }
    bail!("no pod reached its renewal window within {limit:?}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_fault_passes_only_within_every_bound() {
        let clean = Tally::default();
        assert!(row(Fault::AgentKilled, String::new(), &clean, Some(3.0), false).passed);
        // too slow, or never
        assert!(!row(Fault::AgentKilled, String::new(), &clean, Some(76.0), false).passed);
        assert!(!row(Fault::AgentKilled, String::new(), &clean, None, false).passed);
        // a torn set fails any fault
        let torn = Tally {
            torn: 1,
            ..Tally::default()
        };
        assert!(!row(Fault::ZtsStopped, String::new(), &torn, Some(1.0), true).passed);
        // expiry fails a fault under which ZTS stayed reachable, not one under which it did not
        let mut expired = Tally::default();
        expired.add(&Census {
            expired: vec![2],
            overdue: vec![1],
            ..Census::default()
        });
        assert_eq!((expired.affected.len(), expired.expired.len()), (2, 1));
        assert!(
            !row(
                Fault::AgentKilled,
                String::new(),
                &expired,
                Some(1.0),
                false
            )
            .passed
        );
        assert!(row(Fault::ZtsStopped, String::new(), &expired, Some(1.0), true).passed);
    }
}
