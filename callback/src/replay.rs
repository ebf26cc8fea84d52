//! The replay cache: every `jti` accepted, until its token expires. Bounded: when full of live
//! entries it refuses new tokens rather than forget old ones (forgetting would reopen replay).

use std::collections::HashMap;
use std::sync::Mutex;

/// Why a jti was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayRefusal {
    /// Seen before and not yet expired.
    Replayed,
    /// The cache is full of live tokens.
    Full,
}

/// Seen token ids and their expiry (Unix seconds).
pub struct ReplayCache {
    max: usize,
    seen: Mutex<HashMap<String, i64>>,
}

impl ReplayCache {
    /// A cache of at most `max` live entries.
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records `jti` (valid until `exp`) at `now`, refusing one already seen.
    pub fn check_and_record(&self, jti: &str, exp: i64, now: i64) -> Result<(), ReplayRefusal> {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.get(jti).is_some_and(|e| *e >= now) {
            return Err(ReplayRefusal::Replayed);
        }
        if seen.len() >= self.max {
            seen.retain(|_, e| *e >= now);
            if seen.len() >= self.max {
                return Err(ReplayRefusal::Full);
            }
        }
        seen.insert(jti.to_owned(), exp);
        Ok(())
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_are_refused_until_expiry_and_the_bound_holds() {
        let c = ReplayCache::new(2);
        c.check_and_record("a", 100, 10).unwrap();
        assert_eq!(
            c.check_and_record("a", 100, 50),
            Err(ReplayRefusal::Replayed)
        );
        c.check_and_record("b", 20, 10).unwrap();
        assert_eq!(c.check_and_record("c", 100, 15), Err(ReplayRefusal::Full));
        // "b" expires; its slot is reused
        c.check_and_record("c", 100, 30).unwrap();
        assert_eq!(c.len(), 2);
        // after expiry an id may be seen again (its token can no longer verify anyway)
        c.check_and_record("a", 200, 101).unwrap();
    }
}
