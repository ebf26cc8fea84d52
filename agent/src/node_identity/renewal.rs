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
//! - **One per backoff step.** After a failure no attempt starts until the backoff that failure
//!   earned has passed; a caller that asks meanwhile is answered from the failure at once. The
//!   renewal task waits for the same moment, so pods cannot make a node retry faster than its
//!   own backoff.

use super::NodeIdentity;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;

/// The attempt under way and what the last one left behind.
#[derive(Default)]
pub(super) struct Attempts {
    /// The outcome of the attempt under way (`Some(renewed)` once it ends); `None`: none runs.
    running: Option<watch::Receiver<Option<bool>>>,
    /// Attempts that failed since the last success.
    failures: u32,
    /// No attempt starts before this: the backoff earned by the last failure.
    not_before: Option<Instant>,
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
        match self.join_or_start(Caller::Pod) {
            Ok(outcome) => {
                outcome_of(outcome).await;
                self.is_valid()
            }
            Err(_backoff_until) => false,
        }
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
    /// outcome (and on failure the backoff gate) before any caller hears it.
    async fn attempt(&self, caller: Caller) -> bool {
        let result = self.renew_once().await;
        let mut attempts = self.attempts();
        attempts.running = None;
        match result {
            Ok(()) => {
                attempts.failures = 0;
                attempts.not_before = None;
                drop(attempts);
                if caller == Caller::Pod {
                    tracing::info!("node identity renewed for a pod's request");
                    self.renewed_on_demand.notify_one();
                }
                true
            }
            Err(e) => {
                let random = athenz_core::random::unit();
                let backoff = match self.held() {
                    Some(h) => self.settings.backoff.delay_before_expiry(
                        attempts.failures,
                        random,
                        h.info.not_after,
                        OffsetDateTime::now_utc(),
                    ),
                    None => self.settings.backoff.delay(attempts.failures, random),
                };
                attempts.failures = attempts.failures.saturating_add(1);
                attempts.not_before = Some(Instant::now() + backoff);
                drop(attempts);
                tracing::warn!(
                    error = %e,
                    retry_in = ?backoff,
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
                        self.attempts().not_before.map_or(Duration::ZERO, |t| {
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
