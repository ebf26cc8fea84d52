//! When to refresh a certificate, and how long to wait after a failure.
//!
//! Pure functions of their inputs: the clock and the random jitter are parameters, so every edge
//! case is tested without sleeping (the approach of istio/ztunnel's identity manager).

use std::time::Duration;
use time::OffsetDateTime;

/// When to refresh a certificate: at `fraction` of its lifetime, minus up to `jitter` of the
/// lifetime at random (so a fleet issued together does not refresh together), and never sooner
/// than `min_delay` (nor a quarter of the time the certificate has left, if that is sooner) nor
/// later than `max_delay` from now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RefreshPolicy {
    /// Point of the lifetime at which to refresh, in `(0, 1]`.
    pub fraction: f64,
    /// Share of the lifetime subtracted at random, in `[0, fraction)`.
    pub jitter: f64,
    /// Shortest wait: protects ZTS from a certificate that is already (nearly) expired.
    pub min_delay: Duration,
    /// Longest wait (the SIA's `--refresh-interval`).
    pub max_delay: Duration,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        Self {
            fraction: 0.7,
            jitter: 0.1,
            min_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(24 * 3600),
        }
    }
}

/// A policy setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refresh policy: {0}")]
pub struct PolicyError(&'static str);

impl RefreshPolicy {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(PolicyError("fraction must be in (0, 1]"));
        }
        if !(self.jitter >= 0.0 && self.jitter < self.fraction) {
            return Err(PolicyError("jitter must be in [0, fraction)"));
        }
        if self.min_delay > self.max_delay {
            return Err(PolicyError("minimum delay is above the maximum"));
        }
        Ok(())
    }

    /// How long from `now` to wait before refreshing a certificate valid from `not_before` to
    /// `not_after`. `random` is a uniform sample in `[0, 1)`.
    pub fn delay(
        &self,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
        now: OffsetDateTime,
        random: f64,
    ) -> Duration {
        if not_after <= not_before || now >= not_after {
            // expired or nonsensical validity: refresh as soon as allowed
            return self.min_delay.min(self.max_delay);
        }
        let lifetime = (not_after - not_before).as_seconds_f64();
        let share = self.fraction - self.jitter * random.clamp(0.0, 1.0);
        let target = not_before + time::Duration::seconds_f64(lifetime * share);
        let wait = (target - now).as_seconds_f64().max(0.0);
        // The minimum never spends more than a quarter of the time left: a certificate found
        // past its refresh point (a process restarted late in a short lifetime) must get its
        // attempts before it expires, as `Backoff::delay_before_expiry` caps its waits.
        let left = (not_after - now).as_seconds_f64();
        let floor = self.min_delay.min(Duration::from_secs_f64(left / 4.0));
        // max-then-min rather than clamp: a minimum configured above the maximum must not panic;
        // the maximum (the operator's "at the latest") wins.
        Duration::from_secs_f64(wait).max(floor).min(self.max_delay)
    }
}

/// Exponential backoff with full jitter after failures: attempt `n` waits a random time in
/// `[base·2ⁿ / 2, base·2ⁿ]`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait after the first failure (before jitter).
    pub base: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait after failed attempt number `attempt` (0 for the first failure); `random` is a
    /// uniform sample in `[0, 1)`.
    pub fn delay(&self, attempt: u32, random: f64) -> Duration {
        self.capped(attempt, random, self.max)
    }

    /// The wait after failed attempt `attempt` to renew a certificate that expires at
    /// `not_after`: as [`Backoff::delay`], but while the certificate is valid never more than a
    /// quarter of the time it has left (nor a cap below [`MIN_CAP_WHILE_VALID`]). A certificate
    /// whose renewal fails near its end thus gets several more attempts before it expires: with
    /// one-minute certificates, renewal starts with 18–24 s left and a 60 s cap would let one
    /// wait outlast the certificate after a short ZTS error burst. Once expired, the usual cap.
    pub fn delay_before_expiry(
        &self,
        attempt: u32,
        random: f64,
        not_after: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Duration {
        let left = (not_after - now).as_seconds_f64();
        if left <= 0.0 {
            return self.delay(attempt, random);
        }
        let cap = Duration::from_secs_f64(left / 4.0)
            .max(MIN_CAP_WHILE_VALID)
            .min(self.max);
        self.capped(attempt, random, cap)
    }

    fn capped(&self, attempt: u32, random: f64, cap: Duration) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        let full = self.base.saturating_mul(factor).min(cap);
        // keep at least half: a retry storm is no better than no backoff
        full.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0))
    }
}

/// The smallest cap [`Backoff::delay_before_expiry`] puts on a wait: a fleet whose certificates
/// are about to expire during a ZTS outage retries at most this often each, not in a storm.
pub const MIN_CAP_WHILE_VALID: Duration = Duration::from_secs(5);

/// Parses a duration setting: a number with a unit `ms`, `s`, `m`, `h` or `d` (`500ms`, `90s`,
/// `30m`, `24h`, `7d`), or a bare number of seconds. Zero is refused: every wait here must be positive.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 30m, 24h or 7d"))?;
    if unit == "ms" {
        if n == 0 {
            return Err(format!("{text:?} must be longer than zero"));
        }
        return Ok(Duration::from_millis(n));
    }
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is not a duration like 90s, 30m, 24h or 7d"))?;
    if secs == 0 {
        return Err(format!("{text:?} must be longer than zero"));
    }
    Ok(Duration::from_secs(secs))
}

/// A uniform sample in `[0, 1)` for jitter (0.5 if the generator fails).
pub fn random_unit() -> f64 {
    crate::random::unit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + secs).unwrap()
    }

    const HOUR: i64 = 3600;

    #[test]
    fn refreshes_at_the_fraction_minus_jitter() {
        let p = RefreshPolicy {
            fraction: 0.5,
            jitter: 0.1,
            min_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(100 * 3600),
        };
        // 10 h certificate issued now: between 4 h and 5 h
        assert_eq!(
            p.delay(t(0), t(10 * HOUR), t(0), 0.0),
            Duration::from_secs(5 * 3600)
        );
        assert_eq!(
            p.delay(t(0), t(10 * HOUR), t(0), 1.0),
            Duration::from_secs(4 * 3600)
        );
        // same certificate seen 1 h after issue: an hour less
        assert_eq!(
            p.delay(t(0), t(10 * HOUR), t(HOUR), 0.0),
            Duration::from_secs(4 * 3600)
        );
    }

    #[test]
    fn clamps_to_min_and_max() {
        let p = RefreshPolicy {
            min_delay: Duration::from_secs(30),
            max_delay: Duration::from_secs(HOUR as u64),
            ..RefreshPolicy::default()
        };
        // already past the refresh point, even expired: the minimum
        assert_eq!(
            p.delay(t(0), t(HOUR), t(2 * HOUR), 0.5),
            Duration::from_secs(30)
        );
        // a 30-day certificate: the maximum
        assert_eq!(
            p.delay(t(0), t(30 * 24 * HOUR), t(0), 0.5),
            Duration::from_secs(HOUR as u64)
        );
        // inverted or zero validity: the minimum, never a panic
        assert_eq!(p.delay(t(HOUR), t(0), t(0), 0.5), Duration::from_secs(30));
        assert_eq!(p.delay(t(0), t(0), t(0), 0.5), Duration::from_secs(30));
        // out-of-range random values are clamped
        assert_eq!(
            p.delay(t(0), t(10), t(0), -3.0),
            p.delay(t(0), t(10), t(0), 0.0)
        );
    }

    #[test]
    fn the_minimum_never_outlasts_a_quarter_of_what_is_left() {
        // a one-minute certificate found 41 s in (an agent restarted late): 19 s left, so the
        // 10 s minimum would leave 9 s for every attempt; a quarter of what is left is 4.75 s
        let p = RefreshPolicy {
            min_delay: Duration::from_secs(10),
            ..RefreshPolicy::default()
        };
        assert_eq!(
            p.delay(t(0), t(60), t(41), 0.5),
            Duration::from_millis(4750)
        );
        // with time enough left the minimum holds
        assert_eq!(
            p.delay(t(0), t(HOUR), t(HOUR - 100), 0.5),
            Duration::from_secs(10)
        );
        // the refresh point still in the future: unchanged
        assert_eq!(p.delay(t(0), t(60), t(0), 0.0), Duration::from_secs(42));
    }

    #[test]
    fn a_minimum_above_the_maximum_does_not_panic() {
        let p = RefreshPolicy {
            min_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(2),
            ..RefreshPolicy::default()
        };
        assert_eq!(p.delay(t(0), t(HOUR), t(0), 0.5), Duration::from_secs(2));
        assert_eq!(
            p.delay(t(0), t(HOUR), t(2 * HOUR), 0.5),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn policy_validation() {
        RefreshPolicy::default().validate().unwrap();
        let bad = [
            RefreshPolicy {
                fraction: 0.0,
                ..Default::default()
            },
            RefreshPolicy {
                fraction: 1.5,
                ..Default::default()
            },
            RefreshPolicy {
                fraction: f64::NAN,
                ..Default::default()
            },
            RefreshPolicy {
                jitter: 0.7,
                ..Default::default()
            },
            RefreshPolicy {
                min_delay: Duration::from_secs(10),
                max_delay: Duration::from_secs(1),
                ..Default::default()
            },
        ];
        for p in bad {
            assert!(p.validate().is_err(), "{p:?}");
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let b = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(30),
        };
        assert_eq!(b.delay(0, 1.0), Duration::from_secs(1));
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(500));
        assert_eq!(b.delay(3, 1.0), Duration::from_secs(8));
        assert_eq!(b.delay(3, 0.0), Duration::from_secs(4));
        assert_eq!(b.delay(10, 1.0), Duration::from_secs(30));
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_secs(30));
        assert!(b.delay(2, 0.3) > b.delay(2, 0.2));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("0ms").is_err());
        for bad in [
            "",
            "h",
            "0",
            "0s",
            "-1s",
            "1.5h",
            "10x",
            "1 h",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn backoff_before_expiry_leaves_time_for_more_attempts() {
        let b = Backoff::default();
        // far from expiry (a day left): the usual exponential backoff and cap
        assert_eq!(
            b.delay_before_expiry(20, 1.0, t(24 * HOUR), t(0)),
            Duration::from_secs(60)
        );
        assert_eq!(
            b.delay_before_expiry(1, 1.0, t(24 * HOUR), t(0)),
            Duration::from_secs(1)
        );
        // 20 s left: never more than a quarter of it, nor below the 5 s floor of the cap
        assert_eq!(
            b.delay_before_expiry(20, 1.0, t(40), t(20)),
            Duration::from_secs(5)
        );
        assert_eq!(
            b.delay_before_expiry(20, 1.0, t(100), t(0)),
            Duration::from_secs(25)
        );
        // the jitter keeps at least half of it
        assert_eq!(
            b.delay_before_expiry(20, 0.0, t(100), t(0)),
            Duration::from_secs_f64(12.5)
        );
        // early attempts are unaffected by the cap
        assert_eq!(
            b.delay_before_expiry(0, 1.0, t(40), t(20)),
            Duration::from_millis(500)
        );
        // expired: the usual cap again (the pod registers anew, at the fleet's usual pace)
        assert_eq!(
            b.delay_before_expiry(20, 1.0, t(0), t(10)),
            Duration::from_secs(60)
        );
    }
}
