//! Every server's TLS session cache: a resumed session is one whose client was verified at most
//! [`SESSION_MAX_AGE`] ago, and none outlives a change of the client CA bundle.
//!
//! A resumed handshake skips the certificate exchange: the server takes the client's chain from
//! the session it stored at the full handshake. rustls's default server cache keeps a session
//! until 256 newer ones push it out, so on a server with one steady client, the callback with
//! ZTS, a session could be resumed for days after its client certificate was checked, across a
//! change of the trusted CA bundle. ZTS does resume: it keeps one `SSLContext` for its life,
//! whose session cache outlives each confirmation's client (docs/design.md §4.4). This cache
//! forgets a session [`SESSION_MAX_AGE`] after its full handshake, OpenSSL's default server
//! session timeout.
//!
//! Resuming never extends that bound. The servers here resume only TLS 1.2 session IDs: rustls
//! stores a TLS 1.2 session once, at its full handshake, and only reads it on a resumption
//! (`get`). TLS 1.3 resumption would store fresh tickets carrying the original chain, stamped
//! anew, at every resumed handshake, so the servers send no TLS 1.3 tickets
//! (`send_tls13_tickets = 0`, [`super::server_config`]) and this cache hands out none (`take`).
//!
//! Time is the server's clock ([`super::clock`]): the system clock in production. A session
//! stamped later than the clock now reads (the clock was stepped back) counts as expired, so a
//! clock step can shorten a session's life but never lengthen it.
//!
//! [`ReloadingClientCa`](super::ReloadingClientCa) clears the caches of the servers built on it
//! when its bundle changes ([`ExpiringSessionCache::clear`]): no session verified under the old
//! bundle is resumed afterwards.

use rustls::server::StoresServerSessions;
use rustls::time_provider::TimeProvider;
use rustls_pki_types::UnixTime;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long after its full handshake a session may be resumed (OpenSSL's default, 300 s).
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(300);

/// Sessions held at most (rustls's default server cache size).
pub const SESSION_CAPACITY: usize = 256;

/// Sessions stored by rustls, each forgotten [`SESSION_MAX_AGE`] after it was stored.
#[derive(Debug)]
pub struct ExpiringSessionCache {
    max_age: Duration,
    capacity: usize,
    clock: Arc<dyn TimeProvider>,
    sessions: Mutex<HashMap<Vec<u8>, Stored>>,
}

#[derive(Debug)]
struct Stored {
    at: UnixTime,
    value: Vec<u8>,
}

impl ExpiringSessionCache {
    /// The servers' cache: [`SESSION_CAPACITY`] sessions, each for [`SESSION_MAX_AGE`], on the
    /// system clock.
    pub fn for_servers() -> Arc<Self> {
        Self::new(SESSION_CAPACITY, SESSION_MAX_AGE)
    }

    /// At most `capacity` sessions (at least one), each for `max_age`, on the system clock.
    pub fn new(capacity: usize, max_age: Duration) -> Arc<Self> {
        Self::with_clock(capacity, max_age, super::clock::system_clock())
    }

    /// As [`ExpiringSessionCache::new`], on `clock` (the server config's own, so that a test
    /// moving it moves the sessions' age as well as certificate validity).
    pub fn with_clock(
        capacity: usize,
        max_age: Duration,
        clock: Arc<dyn TimeProvider>,
    ) -> Arc<Self> {
        Arc::new(Self {
            max_age,
            capacity: capacity.max(1),
            clock,
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// Sessions held now, expired ones included until the next store drops them.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every session: the next handshake of every client is a full one, verified by the
    /// server's verifier as it is now (the client CA bundle changed).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Stored>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a session stored `stored.at` may still be resumed `now`; without a clock reading,
    /// none may.
    fn fresh(&self, stored: &Stored, now: Option<UnixTime>) -> bool {
        now.and_then(|now| now.as_secs().checked_sub(stored.at.as_secs()))
            .is_some_and(|age| age < self.max_age.as_secs())
    }
}

impl StoresServerSessions for ExpiringSessionCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let Some(now) = self.clock.current_time() else {
            return false;
        };
        let mut sessions = self.lock();
        if sessions.len() >= self.capacity && !sessions.contains_key(&key) {
            sessions.retain(|_, stored| self.fresh(stored, Some(now)));
            // still full of fresh sessions: the oldest goes, as in rustls's own cache
            if sessions.len() >= self.capacity
                && let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, stored)| stored.at)
                    .map(|(key, _)| key.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(key, Stored { at: now, value });
        true
    }

    /// A TLS 1.2 session, by its ID; reading it does not make it younger.
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let now = self.clock.current_time();
        let mut sessions = self.lock();
        match sessions.get(key) {
            Some(stored) if self.fresh(stored, now) => Some(stored.value.clone()),
            Some(_) => {
                sessions.remove(key);
                None
            }
            None => None,
        }
    }

    /// What rustls asks on a TLS 1.3 resumption: never anything. The servers issue no TLS 1.3
    /// ticket, so an identity offered is one they did not issue; it may be a TLS 1.2 session ID
    /// seen on the wire (session IDs travel in clear), which is left in place rather than taken.
    fn take(&self, _key: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::clock::ManualClock;

    fn cache(capacity: usize) -> (Arc<ExpiringSessionCache>, Arc<ManualClock>) {
        let clock = ManualClock::starting_now();
        let cache = ExpiringSessionCache::with_clock(capacity, SESSION_MAX_AGE, clock.clone());
        (cache, clock)
    }

    #[test]
    fn a_session_is_resumable_until_its_age_and_never_after() {
        let (cache, clock) = cache(4);
        assert!(cache.put(b"id".to_vec(), b"session".to_vec()));
        // resuming (TLS 1.2 `get`) every minute does not make it younger
        for _ in 0..4 {
            clock.advance(Duration::from_secs(60));
            assert_eq!(cache.get(b"id").as_deref(), Some(&b"session"[..]));
        }
        clock.advance(Duration::from_secs(59));
        assert_eq!(cache.get(b"id").as_deref(), Some(&b"session"[..]), "299 s");
        clock.advance(Duration::from_secs(1));
        assert_eq!(cache.get(b"id"), None, "expired at 300 s");
        assert!(cache.is_empty(), "an expired session read is dropped");
    }

    #[test]
    fn a_clock_stepped_back_expires_rather_than_extends() {
        let (cache, clock) = cache(4);
        let stored_at = clock.now();
        cache.put(b"id".to_vec(), b"v".to_vec());
        clock.set(UnixTime::since_unix_epoch(Duration::from_secs(
            stored_at.as_secs() - 10,
        )));
        assert_eq!(cache.get(b"id"), None);
    }

    #[test]
    fn no_tls13_ticket_is_ever_taken() {
        let (cache, _) = cache(4);
        cache.put(b"t".to_vec(), b"v".to_vec());
        assert_eq!(cache.take(b"t"), None);
        assert_eq!(
            cache.get(b"t").as_deref(),
            Some(&b"v"[..]),
            "an offered identity does not consume a TLS 1.2 session"
        );
        assert_eq!(cache.get(b"unknown"), None);
    }

    #[test]
    fn clear_forgets_every_session() {
        let (cache, _) = cache(4);
        cache.put(b"a".to_vec(), b"1".to_vec());
        cache.put(b"b".to_vec(), b"2".to_vec());
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.get(b"a"), None);
    }

    #[test]
    fn a_full_cache_drops_expired_sessions_then_the_oldest() {
        let (cache, clock) = cache(2);
        cache.put(b"a".to_vec(), b"1".to_vec());
        clock.advance(SESSION_MAX_AGE);
        cache.put(b"b".to_vec(), b"2".to_vec());
        // full: the expired `a` goes, `b` stays
        clock.advance(Duration::from_secs(1));
        cache.put(b"c".to_vec(), b"3".to_vec());
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(b"b").as_deref(), Some(&b"2"[..]));
        // full of fresh sessions: the oldest (`b`) goes
        clock.advance(Duration::from_secs(1));
        cache.put(b"d".to_vec(), b"4".to_vec());
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(b"b"), None);
        assert_eq!(cache.get(b"c").as_deref(), Some(&b"3"[..]));
        assert_eq!(cache.get(b"d").as_deref(), Some(&b"4"[..]));
        // storing a held key again replaces it without evicting another
        cache.put(b"d".to_vec(), b"5".to_vec());
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(b"d").as_deref(), Some(&b"5"[..]));
    }

    #[test]
    fn a_zero_capacity_still_holds_one() {
        let cache = ExpiringSessionCache::new(0, SESSION_MAX_AGE);
        cache.put(b"a".to_vec(), b"1".to_vec());
        cache.put(b"b".to_vec(), b"2".to_vec());
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get(b"b").as_deref(), Some(&b"2"[..]));
    }
}
