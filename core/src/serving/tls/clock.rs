//! The clock every TLS server here reads: rustls's [`TimeProvider`], which it asks when it
//! verifies a client certificate, and which the session cache ([`super::ExpiringSessionCache`]),
//! the check of resumed sessions ([`super::ResumedSessionCheck`]) and the HTTP layer's connection
//! age (the time left on a client certificate) read too, so that all of them agree on "now".
//!
//! Production runs on rustls's [`DefaultTimeProvider`] (the system clock). [`ManualClock`] is the
//! seam for tests and simulations: ten minutes of reconnecting clients are played in
//! milliseconds, and a certificate's expiry is crossed without waiting for it.

pub use rustls::time_provider::{DefaultTimeProvider, TimeProvider};
use rustls_pki_types::UnixTime;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The system clock, as every production server reads it.
pub fn system_clock() -> Arc<dyn TimeProvider> {
    Arc::new(DefaultTimeProvider)
}

/// A clock that moves only when told to (whole seconds, as [`UnixTime`] counts).
#[derive(Debug)]
pub struct ManualClock {
    secs: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn at(start: UnixTime) -> Arc<Self> {
        Arc::new(Self {
            secs: AtomicU64::new(start.as_secs()),
        })
    }

    /// A clock reading the system time now.
    pub fn starting_now() -> Arc<Self> {
        Self::at(UnixTime::now())
    }

    /// What the clock reads.
    pub fn now(&self) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(self.secs.load(Ordering::SeqCst)))
    }

    /// Moves the clock forward by `by` (whole seconds).
    pub fn advance(&self, by: Duration) {
        self.secs.fetch_add(by.as_secs(), Ordering::SeqCst);
    }

    /// Sets the clock to `to` (backwards too: a system clock can be stepped back).
    pub fn set(&self, to: UnixTime) {
        self.secs.store(to.as_secs(), Ordering::SeqCst);
    }
}

impl TimeProvider for ManualClock {
    fn current_time(&self) -> Option<UnixTime> {
        Some(self.now())
    }
}
