//! `init` (get, write, exit) and `refresh` (keep fresh until SIGTERM).
//!
//! The refresh loop has two deadlines: the certificate's (a fraction of its lifetime with jitter,
//! never later than `--refresh-interval`) and the ntoken's (half its lifetime — the ntoken is
//! signed locally with the service key, so rewriting it needs no ZTS call). A failed certificate
//! refresh keeps the files already written and retries with exponential backoff.
//!
//! Every outcome is also recorded in [`Metrics`]: the expiry of what is on disk, each ZTS call,
//! and readiness while the certificate is valid. The loop wakes when the certificate expires, so
//! readiness drops then even while a retry is still waiting.

use crate::identity::{ControlSia, IdentityError, Issued};
use crate::metrics::Metrics;
use athenz_core::crypto::CertInfo;
use athenz_core::refresh::{Backoff, RefreshPolicy, random_unit};
use std::future::Future;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// Gets a certificate and writes the set, retrying transient failures until `init_timeout`.
pub async fn init(sia: &ControlSia) -> Result<(), IdentityError> {
    let deadline = Instant::now() + sia.settings().init_timeout;
    let backoff = Backoff::default();
    let mut attempt = 0;
    loop {
        match obtain_and_write(sia).await {
            Ok((issued, _)) => {
                tracing::info!(
                    serial = %issued.info.serial_hex,
                    expires = %issued.info.not_after,
                    out_dir = %sia.settings().out_dir.display(),
                    "certificate and ntoken written"
                );
                return Ok(());
            }
            Err(e) if e.is_transient() => {
                let wait = backoff.delay(attempt, random_unit());
                if Instant::now() + wait >= deadline {
                    return Err(e);
                }
                tracing::warn!(error = %e, retry_in = ?wait, "ZTS not available; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Gets a certificate and writes it with a fresh ntoken; returns it and the ntoken's expiry
/// (Unix time).
async fn obtain_and_write(sia: &ControlSia) -> Result<(Issued, i64), IdentityError> {
    let now = OffsetDateTime::now_utc();
    let issued = sia.request_certificate(now).await?;
    sia.write(&issued, &sia.ntoken(now)?)?;
    Ok((issued, sia.ntoken_expires(now)))
}

/// The two deadlines of the refresh loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// When to refresh the certificate.
    pub cert: Instant,
    /// When to rewrite the ntoken.
    pub ntoken: Instant,
}

/// When to rewrite an ntoken of `lifetime` written at `written`: at half its lifetime.
pub fn ntoken_due(written: Instant, lifetime: Duration) -> Instant {
    written + lifetime / 2
}

/// How long `info` stays valid after `now`; `None` once it has expired.
pub fn valid_for(info: &CertInfo, now: OffsetDateTime) -> Option<Duration> {
    Duration::try_from(info.not_after - now)
        .ok()
        .filter(|left| !left.is_zero())
}

/// Keeps the certificate and ntoken fresh until `shutdown` completes, recording each outcome in
/// `metrics`.
pub async fn refresh(sia: &ControlSia, metrics: &Metrics, shutdown: impl Future<Output = ()>) {
    let policy = RefreshPolicy {
        max_delay: sia.settings().refresh_interval,
        ..RefreshPolicy::default()
    };
    let backoff = Backoff::default();
    let token_lifetime = sia.settings().ntoken_lifetime;
    tokio::pin!(shutdown);

    let mut current = sia.current();
    let now = Instant::now();
    let mut deadlines = Deadlines {
        cert: match &current {
            Some(issued) => now + cert_delay(&policy, issued),
            None => now,
        },
        // a set found on disk carries an ntoken of unknown age: rewrite it right away
        ntoken: now,
    };
    let mut failures = 0u32;
    loop {
        let now = Instant::now();
        if now >= deadlines.cert {
            let outcome = obtain_and_write(sia).await;
            metrics.refreshed(outcome.is_ok());
            match outcome {
                Ok((issued, ntoken_expires)) => {
                    tracing::info!(
                        serial = %issued.info.serial_hex,
                        expires = %issued.info.not_after,
                        "certificate refreshed"
                    );
                    deadlines.cert = Instant::now() + cert_delay(&policy, &issued);
                    deadlines.ntoken = ntoken_due(Instant::now(), token_lifetime);
                    metrics.ntoken_written(ntoken_expires);
                    current = Some(issued);
                    failures = 0;
                }
                Err(e) => {
                    let wait = match &current {
                        Some(issued) => backoff.delay_before_expiry(
                            failures,
                            random_unit(),
                            issued.info.not_after,
                            time::OffsetDateTime::now_utc(),
                        ),
                        None => backoff.delay(failures, random_unit()),
                    };
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, retry_in = ?wait, "certificate refresh failed; keeping the current files");
                    deadlines.cert = Instant::now() + wait;
                }
            }
        } else if now >= deadlines.ntoken {
            match &current {
                Some(issued) => {
                    let issued_at = OffsetDateTime::now_utc();
                    let written = sia
                        .ntoken(issued_at)
                        .and_then(|token| sia.write(issued, &token));
                    match written {
                        Ok(()) => {
                            tracing::debug!("ntoken rewritten");
                            metrics.ntoken_written(sia.ntoken_expires(issued_at));
                            deadlines.ntoken = ntoken_due(Instant::now(), token_lifetime);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "writing the ntoken failed; retrying");
                            deadlines.ntoken = Instant::now() + Duration::from_secs(1);
                        }
                    }
                }
                // nothing to pair it with yet: the certificate deadline comes first
                None => deadlines.ntoken = deadlines.cert,
            }
        }
        // readiness follows the certificate on disk: wake when it expires to drop it
        let wall = OffsetDateTime::now_utc();
        let info = current.as_ref().map(|issued| &issued.info);
        metrics.certificate(info, wall);
        let mut next = deadlines.cert.min(deadlines.ntoken);
        if let Some(left) = info.and_then(|info| valid_for(info, wall)) {
            next = next.min(Instant::now() + left);
        }
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("stopping");
                return;
            }
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

fn cert_delay(policy: &RefreshPolicy, issued: &Issued) -> Duration {
    policy.delay(
        issued.info.not_before,
        issued.info.not_after,
        OffsetDateTime::now_utc(),
        random_unit(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_left_is_none_once_expired() {
        let info = crate::metrics::test_certificate();
        let before_end = info.not_after - time::Duration::seconds(30);
        assert_eq!(valid_for(&info, before_end), Some(Duration::from_secs(30)));
        assert_eq!(valid_for(&info, info.not_after), None);
        assert_eq!(
            valid_for(&info, info.not_after + time::Duration::seconds(1)),
            None
        );
    }

    #[test]
    fn ntoken_is_rewritten_at_half_life() {
        let t = Instant::now();
        assert_eq!(
            ntoken_due(t, Duration::from_secs(7200)),
            t + Duration::from_secs(3600)
        );
        assert_eq!(
            ntoken_due(t, Duration::from_secs(4)),
            t + Duration::from_secs(2)
        );
    }
}
