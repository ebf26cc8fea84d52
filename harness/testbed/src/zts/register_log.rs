//! When each instance register reached the dev ZTS and when it ended, and how many ran at once:
//! what a test asks of a client that must ration its registrations (the agent's node identity:
//! one at a time, one per backoff step). A register the client abandoned ends when its
//! connection does, as ZTS's own work on it would.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One register, from its arrival to its answer (or its client's going away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterCall {
    /// Arrival.
    pub started: Instant,
    /// Answer, or abandonment.
    pub ended: Instant,
}

/// Every register so far, and how many were under way at once.
#[derive(Debug, Default)]
pub struct RegisterLog {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    calls: Vec<RegisterCall>,
    running: usize,
    most_at_once: usize,
    /// How long each register waits before it is handled (a slow ZTS).
    delay: Duration,
}

impl RegisterLog {
    /// Marks a register's arrival; the returned guard marks its end when dropped.
    pub fn enter(&self) -> (RegisterGuard<'_>, Duration) {
        let mut inner = self.lock();
        inner.running += 1;
        inner.most_at_once = inner.most_at_once.max(inner.running);
        let delay = inner.delay;
        (
            RegisterGuard {
                log: self,
                started: Instant::now(),
            },
            delay,
        )
    }

    /// Makes every register wait `delay` before it is handled.
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// The registers that ended so far, by arrival.
    pub fn calls(&self) -> Vec<RegisterCall> {
        let mut calls = self.lock().calls.clone();
        calls.sort_by_key(|c| c.started);
        calls
    }

    /// The most registers under way at one time so far.
    pub fn most_at_once(&self) -> usize {
        self.lock().most_at_once
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A register under way.
pub struct RegisterGuard<'a> {
    log: &'a RegisterLog,
    started: Instant,
}

impl Drop for RegisterGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.log.lock();
        inner.running -= 1;
        inner.calls.push(RegisterCall {
            started: self.started,
            ended: Instant::now(),
        });
    }
}
