//! A token bucket: bursts allowed, the sustained rate bounded. Bounds the agent's forced kubelet
//! lists and the early issuances a node's bindings may start.

use std::time::{Duration, Instant};

/// `burst` at once after a quiet spell, `per_second` in the long run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Allowed back to back after a quiet spell.
    pub burst: u32,
    /// Per second in the long run.
    pub per_second: f64,
}

/// A token bucket over a [`Rate`].
#[derive(Debug)]
pub struct TokenBucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate: Rate, now: Instant) -> Self {
        Self {
            rate,
            tokens: f64::from(rate.burst.max(1)),
            at: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let burst = f64::from(self.rate.burst.max(1));
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate.per_second).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.rate.per_second.max(f64::MIN_POSITIVE),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(
            Rate {
                burst: 3,
                per_second: 2.0,
            },
            start,
        );
        for _ in 0..3 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        let wait = bucket.take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert_eq!(bucket.take(start + Duration::from_millis(500)), Ok(()));
        // a long quiet spell refills to the burst, no further
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.take(later), Ok(()));
        }
        assert!(bucket.take(later).is_err());
    }
}
