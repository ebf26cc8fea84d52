//! When the node identity is renewed, and by whom: the renewal task on its schedule, or a pod's
//! request that finds no valid certificate ([`NodeIdentity::ensure_valid`]).
//!
//! Every attempt costs ZTS a register or refresh, and through it the callback a TokenReview and
//! two API reads, so attempts are rationed the same way whoever asks:
//! - **One at a time, and never abandoned.** An attempt runs on a task of its own; every caller
//!   that arrives while it runs waits for that attempt's outcome instead of starting another. A
//!   caller that goes away (a pod that closes its socket, so hyper drops the request's future)
//!   stops waiting, but the attempt goes on: were it cancelled, the next caller would start a new
//!   one while ZTS still works on the old, and a close-and-retry loop would stack registrations.
//! - **One per backoff step.** After a failure no attempt starts until one backoff step has
//!   passed, for pods or the renewal task. The step grows with the failures of attempts pods
//!   made (the renewal task's own, longer backoff does not lengthen it: once ZTS is back, the
//!   next pod is served within a step, not after the task's minute). A pod that asks within
//!   the step waits for its end when that is near ([`POD_GATE_WAIT`]) and then joins or makes
//!   the next attempt; otherwise it is answered from the failure at once.

use super::NodeIdentity;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;

/// The longest a pod's request waits for the backoff step after a failure to end before it
/// makes the next attempt; a longer step answers it at once (503, come back). Two first steps
/// (0.25–0.5 s each by default): a pod that retries within a step right after an outage gets
/// its identity from the first attempt allowed rather than a 503 and a backoff of its own.
const POD_GATE_WAIT: Duration = Duration::from_secs(1);

/// The attempt under way and what the last one left behind.
#[derive(Default)]
pub(super) struct Attempts {
    /// The outcome of the attempt under way (`Some(renewed)` once it ends); `None`: none runs.
    running: Option<watch::Receiver<Option<bool>>>,
    /// Attempts made for pods that failed since the last success: the step after a failure.
    pod_failures: u32,
    /// Attempts of the renewal task that failed since the last success: its own backoff.
    scheduled_failures: u32,
    /// No attempt starts before this: one step after the last failure.
    not_before: Option<Instant>,
    /// When the renewal task tries again after its own last failure.
    scheduled_retry: Option<Instant>,
}

/// Whom an attempt is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The renewal task, on its schedule.
    Schedule,
    /// A pod's request that found no valid certificate.
    Pod,
}

impl NodeIdentity {
    /// Whether a valid certificate is held, after a renewal attempt if none is: for a pod's
    /// request, which needs the node's identity now. Joins an attempt under way; answers `false`
    /// at once while the last failure's backoff lasts; otherwise starts one. The wait is bounded
    /// by the ZTS client's timeout.
    pub async fn ensure_valid(self: &Arc<Self>) -> bool {
        if self.is_valid() {
            return true;
        }
        let outcome = match self.join_or_start(Caller::Pod) {
            Ok(outcome) => outcome,
            Err(until) if until.saturating_duration_since(Instant::now()) <= POD_GATE_WAIT => {
                tokio::time::sleep_until(until).await;
                match self.join_or_start(Caller::Pod) {
                    Ok(outcome) => outcome,
                    // another failure meanwhile: its step stands
                    Err(_) => return self.is_valid(),
                }
            }
            Err(_) => return false,
        };
        outcome_of(outcome).await;
        self.is_valid()
    }

    /// The attempt under way, or a new one; `Err(until)` while the last failure's backoff lasts.
    fn join_or_start(
        self: &Arc<Self>,
        caller: Caller,
    ) -> Result<watch::Receiver<Option<bool>>, Instant> {
        let mut attempts = self.attempts();
        // (an attempt whose task died without an outcome no longer counts as under way)
        if let Some(running) = attempts
            .running
            .as_ref()
            .filter(|r| r.has_changed().is_ok())
        {
            return Ok(running.clone());
        }
        if let Some(until) = attempts.not_before.filter(|t| *t > Instant::now()) {
            return Err(until);
        }
        let (report, outcome) = watch::channel(None);
        attempts.running = Some(outcome.clone());
        drop(attempts);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let renewed = this.attempt(caller).await;
            // no receiver left is fine: every caller went away, the outcome is kept above
            let _ = report.send(Some(renewed));
        });
        Ok(outcome)
    }

    /// One attempt, on the task [`join_or_start`](Self::join_or_start) spawned; records its
    /// outcome (and on failure the next step's start) before any caller hears it.
    async fn attempt(&self, caller: Caller) -> bool {
        let result = self.renew_once().await;
        let mut attempts = self.attempts();
        attempts.running = None;
        match result {
            Ok(()) => {
                attempts.pod_failures = 0;
                attempts.scheduled_failures = 0;
                attempts.not_before = None;
                attempts.scheduled_retry = None;
                drop(attempts);
                if caller == Caller::Pod {
                    tracing::info!("node identity renewed for a pod's request");
                    self.renewed_on_demand.notify_one();
                }
                true
            }
            Err(e) => {
                let step = self
                    .settings
                    .backoff
                    .delay(attempts.pod_failures, athenz_core::random::unit());
                // the renewal task's own backoff: while a certificate is held, short enough
                // that it gets more attempts before it expires
                let scheduled = match self.held() {
                    Some(h) => self.settings.backoff.delay_before_expiry(
                        attempts.scheduled_failures,
                        athenz_core::random::unit(),
                        h.info.not_after,
                        OffsetDateTime::now_utc(),
                    ),
                    None => self
                        .settings
                        .backoff
                        .delay(attempts.scheduled_failures, athenz_core::random::unit()),
                };
                match caller {
                    Caller::Pod => attempts.pod_failures = attempts.pod_failures.saturating_add(1),
                    Caller::Schedule => {
                        attempts.scheduled_failures = attempts.scheduled_failures.saturating_add(1);
                        attempts.scheduled_retry = Some(Instant::now() + scheduled);
                    }
                }
                attempts.not_before = Some(Instant::now() + step);
                drop(attempts);
                tracing::warn!(
                    error = %e,
                    next_attempt_in = ?step,
                    scheduled_retry_in = ?scheduled,
                    still_valid = self.is_valid(),
                    for_pod = caller == Caller::Pod,
                    "could not renew the node identity"
                );
                false
            }
        }
    }

    fn attempts(&self) -> std::sync::MutexGuard<'_, Attempts> {
        self.attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long until the next renewal.
    fn next_renewal(&self) -> Duration {
        match self.held() {
            Some(h) => self.settings.policy.delay(
                h.info.not_before,
                h.info.not_after,
                OffsetDateTime::now_utc(),
                athenz_core::random::unit(),
            ),
            None => Duration::ZERO,
        }
    }

    /// Keeps the identity until `shutdown`: renew when due, back off after failures (the same
    /// gate as pods' attempts).
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut wait = if self.is_valid() {
            self.next_renewal()
        } else {
            Duration::ZERO
        };
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
                _ = self.renewed_on_demand.notified() => {
                    // a pod's request renewed it meanwhile: the next renewal is due as usual
                    wait = self.next_renewal();
                    continue;
                }
            }
            wait = match self.join_or_start(Caller::Schedule) {
                Err(until) => until.saturating_duration_since(Instant::now()),
                Ok(outcome) => {
                    if outcome_of(outcome).await {
                        self.next_renewal()
                    } else {
                        // its own backoff, and never within the step after the last failure
                        let attempts = self.attempts();
                        let until = attempts.scheduled_retry.max(attempts.not_before);
                        until.map_or(Duration::ZERO, |t| {
                            t.saturating_duration_since(Instant::now())
                        })
                    }
                }
            };
            // readiness also falls when the held certificate expires while waiting
            self.readiness.set(self.is_valid());
        }
    }
}

/// Waits for an attempt's outcome; an attempt whose task ended without one (it panicked) failed.
async fn outcome_of(mut outcome: watch::Receiver<Option<bool>>) -> bool {
    match outcome.wait_for(Option::is_some).await {
        Ok(renewed) => renewed.unwrap_or(false),
        Err(_) => false,
    }
}
