//! Periodic background work: the one timer every reloader uses (TLS pairs in [`crate::tls`],
//! signing and public keys in the daemons, the initializer's template, the agent's ZTS CA).
//! Below both `tls` and `daemon`, which use it.
//!
//! The reloaders run on one thread of their own per process, not on the async runtime, because
//! an idle daemon's CPU is its wake-ups (about 0.1 ms each on a small VM; measured in
//! docs/benchmarks.md). Tokio's timer wheel reaches a deadline more than 4 s away in three
//! steps, waking the runtime at each, and every reloader had its own; this thread sleeps until
//! exactly the next deadline and wakes once for every reloader due then. Deadlines fall on
//! multiples of each interval from one start, so reloaders of 5 s and 10 s share a wake-up.
//! A tick is a file check: short and synchronous, it never needs the runtime.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Runs `tick` every `interval`, first at once (a tick that overruns delays the next, never
/// bunches them), until the returned task is aborted or dropped with its runtime.
///
/// The task only holds the tick's place: aborting it removes the tick before its next run.
pub fn every(
    interval: Duration,
    tick: impl FnMut() + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let registration = ticker().add(interval, Instant::now(), Box::new(tick));
    tokio::spawn(async move {
        let _registration = registration;
        std::future::pending::<()>().await;
    })
}

/// Ticks for periodic async work (a readiness check that asks a server), from the same thread:
/// the runtime wakes once per tick, where a `tokio::time` sleep of a few seconds wakes it three
/// times. The first tick comes at the next deadline (within one `interval`, never at once);
/// ticks missed while the owner was busy are not kept (the next wait ends at once, then ticks
/// resume on time).
pub struct Ticks {
    notify: Arc<tokio::sync::Notify>,
    _registration: Registration,
}

impl Ticks {
    /// Ticks every `interval`, until dropped.
    pub fn new(interval: Duration) -> Self {
        let notify = Arc::new(tokio::sync::Notify::new());
        let notifier = Arc::clone(&notify);
        let ticker = ticker();
        let first = ticker.next_due(interval, Instant::now());
        let registration = ticker.add(interval, first, Box::new(move || notifier.notify_one()));
        Self {
            notify,
            _registration: registration,
        }
    }

    /// Waits for the next tick.
    pub async fn tick(&self) {
        self.notify.notified().await;
    }
}

type Tick = Box<dyn FnMut() + Send>;

struct Entry {
    interval: Duration,
    due: Instant,
    tick: Tick,
}

#[derive(Default)]
struct Entries {
    next_id: u64,
    by_id: BTreeMap<u64, Entry>,
}

/// The process's reloader thread and what it runs.
struct Ticker {
    epoch: Instant,
    entries: Mutex<Entries>,
    changed: Condvar,
}

/// Removes its tick from the thread when dropped.
struct Registration {
    ticker: Arc<Ticker>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.ticker.lock().by_id.remove(&self.id);
    }
}

fn ticker() -> Arc<Ticker> {
    static TICKER: OnceLock<Arc<Ticker>> = OnceLock::new();
    TICKER
        .get_or_init(|| {
            let ticker = Arc::new(Ticker::new());
            let running = Arc::clone(&ticker);
            // A process that cannot start a thread has worse problems; its reloaders would
            // then never run, which the log says once.
            if let Err(e) = std::thread::Builder::new()
                .name("athenz-reload".into())
                .spawn(move || running.run())
            {
                tracing::error!(error = %e, "cannot start the reload thread; files are not re-read");
            }
            ticker
        })
        .clone()
}

impl Ticker {
    /// A ticker with nothing to run, its deadlines counted from now.
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            entries: Mutex::new(Entries::default()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `tick` at `first`, then every `interval`. Ticks run with the list locked: a tick
    /// must neither add one nor drop a registration.
    fn add(self: Arc<Self>, interval: Duration, first: Instant, tick: Tick) -> Registration {
        // a zero interval would spin; tokio's interval refuses it too
        let interval = interval.max(Duration::from_millis(1));
        let id = {
            let mut entries = self.lock();
            let id = entries.next_id;
            entries.next_id += 1;
            entries.by_id.insert(
                id,
                Entry {
                    interval,
                    due: first,
                    tick,
                },
            );
            id
        };
        self.changed.notify_one();
        Registration { ticker: self, id }
    }

    /// The first multiple of `interval` from the epoch after `now`.
    fn next_due(&self, interval: Duration, now: Instant) -> Instant {
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        let step = interval.as_nanos().max(1);
        let periods = since / step + 1;
        let offset = u64::try_from(periods * step).unwrap_or(u64::MAX);
        self.epoch + Duration::from_nanos(offset)
    }

    /// Runs due ticks, then sleeps until the next deadline (or a new tick). Ticks run with the
    /// list locked, so one removed is never run after its registration is dropped.
    fn run(&self) {
        let mut entries = self.lock();
        loop {
            let now = Instant::now();
            let mut panicked = Vec::new();
            for (id, entry) in entries.by_id.iter_mut() {
                if entry.due > now {
                    continue;
                }
                let tick = &mut entry.tick;
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(tick)).is_err() {
                    panicked.push(*id);
                }
                entry.due = self.next_due(entry.interval, Instant::now());
            }
            for id in panicked {
                tracing::error!("a periodic reload panicked; it no longer runs");
                entries.by_id.remove(&id);
            }
            let wait = entries
                .by_id
                .values()
                .map(|e| e.due.saturating_duration_since(Instant::now()))
                .min();
            entries = match wait {
                Some(wait) => {
                    self.changed
                        .wait_timeout(entries, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(entries)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counter() -> (Arc<AtomicUsize>, impl FnMut() + Send + 'static) {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        (count, move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
    }

    fn wait_for(count: &AtomicUsize, at_least: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while count.load(Ordering::SeqCst) < at_least {
            assert!(Instant::now() < deadline, "tick ran {count:?} times");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[tokio::test]
    async fn ticks_at_once_then_every_interval_until_aborted() {
        let (count, tick) = counter();
        let task = every(Duration::from_millis(20), tick);
        wait_for(&count, 3);
        task.abort();
        let _ = task.await;
        // a tick already running may finish; none starts after that
        std::thread::sleep(Duration::from_millis(30));
        let stopped = count.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(count.load(Ordering::SeqCst), stopped);
    }

    #[tokio::test]
    async fn async_ticks_come_one_interval_apart_and_stop_when_dropped() {
        let interval = Duration::from_millis(30);
        let started = Instant::now();
        let ticks = Ticks::new(interval);
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(10), ticks.tick())
                .await
                .expect("a tick within 10 s");
        }
        // the first deadline is after the registration, the third two intervals after the
        // first: had one come at once on registration, this could be under two intervals
        assert!(started.elapsed() >= interval * 2, "{:?}", started.elapsed());
        let id = ticks._registration.id;
        drop(ticks);
        assert!(!ticker().lock().by_id.contains_key(&id));
    }

    #[tokio::test]
    async fn a_panicking_tick_stops_alone() {
        let task = every(Duration::from_millis(10), || panic!("broken reload"));
        let (count, tick) = counter();
        let other = every(Duration::from_millis(10), tick);
        wait_for(&count, 5);
        task.abort();
        other.abort();
    }

    #[test]
    fn deadlines_fall_on_multiples_of_the_interval_so_reloaders_share_wake_ups() {
        let ticker = Ticker::new();
        let at = |secs: f64| ticker.epoch + Duration::from_secs_f64(secs);
        let five = Duration::from_secs(5);
        let ten = Duration::from_secs(10);
        assert_eq!(ticker.next_due(five, at(0.0)), at(5.0));
        assert_eq!(ticker.next_due(five, at(7.3)), at(10.0));
        assert_eq!(ticker.next_due(ten, at(7.3)), at(10.0));
        assert_eq!(ticker.next_due(five, at(10.0)), at(15.0));
        // a clock before the epoch (cannot happen with Instant) still gives a deadline ahead
        assert!(ticker.next_due(ten, ticker.epoch) > ticker.epoch);
    }
}
