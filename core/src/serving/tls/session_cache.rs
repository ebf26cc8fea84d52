//! Every server's TLS session cache: a resumed session is one whose client was verified at most
//! [`SESSION_MAX_AGE`] ago.
//!
//! A resumed handshake skips the certificate exchange: the server takes the client's chain from
//! the session it stored at the full handshake. rustls's default server cache keeps a session
//! until 256 newer ones push it out, so on a server with one steady client, the callback with
//! ZTS, a session could be resumed for days after its client certificate was checked, across a
//! change of the trusted CA bundle. ZTS does resume: it keeps one `SSLContext` for its life,
//! whose session cache outlives each confirmation's client (docs/design.md §4.4). This cache
//! forgets a session [`SESSION_MAX_AGE`] after its full handshake, OpenSSL's default server
//! session timeout; resuming does not extend it.

use rustls::server::StoresServerSessions;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long after its full handshake a session may be resumed (OpenSSL's default, 300 s).
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(300);

/// Sessions held at most (rustls's default server cache size).
pub const SESSION_CAPACITY: usize = 256;

/// Sessions stored by rustls, each forgotten [`SESSION_MAX_AGE`] after it was stored.
#[derive(Debug)]
pub struct ExpiringSessionCache {
    max_age: Duration,
    capacity: usize,
    sessions: Mutex<HashMap<Vec<u8>, Stored>>,
}

#[derive(Debug)]
struct Stored {
    at: Instant,
    value: Vec<u8>,
}

impl ExpiringSessionCache {
    /// The servers' cache: [`SESSION_CAPACITY`] sessions, each for [`SESSION_MAX_AGE`].
    pub fn for_servers() -> Arc<Self> {
        Self::new(SESSION_CAPACITY, SESSION_MAX_AGE)
    }

    /// At most `capacity` sessions (at least one), each for `max_age`.
    pub fn new(capacity: usize, max_age: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_age,
            capacity: capacity.max(1),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Stored>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh(&self, stored: &Stored) -> bool {
        stored.at.elapsed() < self.max_age
    }
}

impl StoresServerSessions for ExpiringSessionCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let mut sessions = self.lock();
        if sessions.len() >= self.capacity && !sessions.contains_key(&key) {
            sessions.retain(|_, stored| stored.at.elapsed() < self.max_age);
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
        sessions.insert(
            key,
            Stored {
                at: Instant::now(),
                value,
            },
        );
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut sessions = self.lock();
        match sessions.get(key) {
            Some(stored) if self.fresh(stored) => Some(stored.value.clone()),
            Some(_) => {
                sessions.remove(key);
                None
            }
            None => None,
        }
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock()
            .remove(key)
            .filter(|stored| self.fresh(stored))
            .map(|stored| stored.value)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_resumable_until_its_age_and_never_after() {
        let cache = ExpiringSessionCache::new(4, Duration::from_millis(200));
        assert!(cache.put(b"id".to_vec(), b"session".to_vec()));
        assert_eq!(cache.get(b"id").as_deref(), Some(&b"session"[..]));
        // resuming (TLS 1.2 `get`) does not make it younger
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(cache.get(b"id"), None, "expired");
        assert!(cache.is_empty(), "an expired session read is dropped");
        assert!(cache.put(b"once".to_vec(), b"ticket".to_vec()));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(cache.take(b"once"), None, "an expired ticket is not taken");
        assert!(cache.is_empty());
    }

    #[test]
    fn a_tls13_ticket_is_taken_once() {
        let cache = ExpiringSessionCache::for_servers();
        cache.put(b"t".to_vec(), b"v".to_vec());
        assert_eq!(cache.take(b"t").as_deref(), Some(&b"v"[..]));
        assert_eq!(cache.take(b"t"), None);
        assert_eq!(cache.get(b"unknown"), None);
    }

    #[test]
    fn a_full_cache_drops_expired_sessions_then_the_oldest() {
        let cache = ExpiringSessionCache::new(2, Duration::from_millis(200));
        cache.put(b"a".to_vec(), b"1".to_vec());
        std::thread::sleep(Duration::from_millis(250));
        cache.put(b"b".to_vec(), b"2".to_vec());
        // full: the expired `a` goes, `b` stays
        cache.put(b"c".to_vec(), b"3".to_vec());
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(b"b").as_deref(), Some(&b"2"[..]));
        // full of fresh sessions: the oldest (`b`) goes
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
