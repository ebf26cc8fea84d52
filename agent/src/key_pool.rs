//! RSA-2048 keys made ahead, so a pod does not wait ~100 ms for its key.
//!
//! A P-256 key costs tens of microseconds and is made on the request path; an RSA-2048 key costs
//! a hundred milliseconds or more of one core, with a long tail. The pool holds a few made in the
//! background: its target size follows recent demand (a quarter of the keys taken in the last
//! minute, between a floor and `--key-pool-max`), it refills only while no identity is being
//! issued (so it never competes with a pod waiting now), one key at a time on a blocking thread.
//! A key is handed out once and never again; the pool lives in memory only. Drained (more pods at
//! once than it holds), a caller makes its key on the path, as without a pool.

use athenz_core::crypto::{CryptoError, KeyAlgorithm, PrivateKey};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keys kept however quiet the node is.
const MIN_KEYS: usize = 4;
/// The window demand is measured over.
const DEMAND_WINDOW: Duration = Duration::from_secs(60);
/// Share of a window's demand kept ready (a quarter: 15 s of the last minute's rate).
const DEMAND_SHARE: usize = 4;

/// Where a key came from (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// Made ahead.
    Pool,
    /// Made on the request path (no pool for this algorithm, or the pool was empty).
    OnPath,
}

impl KeySource {
    /// Its metric label: `pool` or `on_path`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::OnPath => "on_path",
        }
    }
}

/// The pool.
pub struct KeyPool {
    algorithm: KeyAlgorithm,
    max: usize,
    keys: Mutex<VecDeque<PrivateKey>>,
    /// When keys were taken, within [`DEMAND_WINDOW`].
    taken: Mutex<VecDeque<Instant>>,
    /// Identities being issued now; the filler waits for zero.
    busy: AtomicUsize,
    wake: tokio::sync::Notify,
}

/// Held while an identity is being issued; the pool refills only when none is held.
pub struct Busy<'a>(&'a KeyPool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.wake.notify_one();
        }
    }
}

impl KeyPool {
    /// A pool of up to `max` keys of `algorithm`; only RSA keys are pooled (`max` 0: none).
    pub fn new(algorithm: KeyAlgorithm, max: usize) -> Arc<Self> {
        let max = if algorithm == KeyAlgorithm::Rsa2048 {
            max
        } else {
            0
        };
        Arc::new(Self {
            algorithm,
            max,
            keys: Mutex::new(VecDeque::new()),
            taken: Mutex::new(VecDeque::new()),
            busy: AtomicUsize::new(0),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Marks an identity as being issued until the guard drops.
    pub fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self)
    }

    /// Keys ready now.
    pub fn ready(&self) -> usize {
        lock(&self.keys).len()
    }

    /// How many keys the pool aims to hold now.
    pub fn target(&self) -> usize {
        if self.max == 0 {
            return 0;
        }
        let mut taken = lock(&self.taken);
        while taken.front().is_some_and(|at| at.elapsed() > DEMAND_WINDOW) {
            taken.pop_front();
        }
        (taken.len() / DEMAND_SHARE).clamp(MIN_KEYS.min(self.max), self.max)
    }

    /// A new key, never handed out before: from the pool if it has one, else made now (on a
    /// blocking thread, so the runtime keeps serving).
    pub async fn take(&self) -> Result<(PrivateKey, KeySource), CryptoError> {
        if self.max > 0 {
            {
                let mut taken = lock(&self.taken);
                taken.push_back(Instant::now());
                // bounded: older entries leave in target(); this caps a burst between calls
                if taken.len() > self.max * DEMAND_SHARE * 4 {
                    taken.pop_front();
                }
            }
            let pooled = lock(&self.keys).pop_front();
            self.wake.notify_one();
            if let Some(key) = pooled {
                return Ok((key, KeySource::Pool));
            }
        }
        let key = match self.algorithm {
            KeyAlgorithm::P256 => PrivateKey::generate(self.algorithm)?,
            algorithm => tokio::task::spawn_blocking(move || PrivateKey::generate(algorithm))
                .await
                .map_err(|_| CryptoError::KeyGeneration(algorithm))??,
        };
        Ok((key, KeySource::OnPath))
    }

    /// Keeps the pool at its target until `stop` resolves: one key at a time, only while no
    /// identity is being issued.
    pub async fn fill(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        if self.max == 0 {
            return;
        }
        tokio::pin!(stop);
        // the demand re-check's clock: the reload thread's ticks wake an idle agent once each,
        // a `tokio::time` sleep of 5 s three times (an idle daemon's CPU is its wake-ups)
        let recheck = athenz_core::periodic::Ticks::new(Duration::from_secs(5));
        loop {
            let wanted = self.ready() < self.target();
            if wanted && self.busy.load(Ordering::SeqCst) == 0 {
                let algorithm = self.algorithm;
                match tokio::task::spawn_blocking(move || PrivateKey::generate(algorithm)).await {
                    Ok(Ok(key)) => lock(&self.keys).push_back(key),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "could not make a pool key");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(_) => return,
                }
                continue;
            }
            // woken by a take or the last issuance ending; the ticks re-check demand decay
            tokio::select! {
                () = &mut stop => return,
                () = self.wake.notified() => {}
                () = recheck.tick() => {}
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn p256_is_never_pooled() {
        let pool = KeyPool::new(KeyAlgorithm::P256, 8);
        assert_eq!(pool.target(), 0);
        let (_, source) = pool.take().await.unwrap();
        assert_eq!(source, KeySource::OnPath);
        assert_eq!(pool.ready(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rsa_keys_are_made_ahead_handed_out_once_and_made_on_the_path_when_drained() {
        let pool = KeyPool::new(KeyAlgorithm::Rsa2048, 4);
        let stop = Arc::new(tokio::sync::Notify::new());
        let filler = tokio::spawn({
            let (pool, stop) = (pool.clone(), stop.clone());
            async move { pool.fill(async move { stop.notified().await }).await }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while pool.ready() < 4 {
            assert!(Instant::now() < deadline, "the pool never filled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // while an identity is being issued the pool does not refill
        let busy = pool.busy();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let (key, source) = pool.take().await.unwrap();
            assert_eq!(source, KeySource::Pool);
            assert!(
                seen.insert(key.public_key_der()),
                "a key was handed out twice"
            );
        }
        let (key, source) = pool.take().await.unwrap();
        assert_eq!(
            source,
            KeySource::OnPath,
            "a drained pool makes keys on the path"
        );
        assert!(seen.insert(key.public_key_der()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            pool.ready(),
            0,
            "refilled while an identity was being issued"
        );
        drop(busy);
        while pool.ready() < 4 {
            assert!(Instant::now() < deadline, "the pool never refilled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.notify_one();
        filler.await.unwrap();
    }

    #[test]
    fn the_target_follows_recent_demand_within_bounds() {
        let pool = KeyPool::new(KeyAlgorithm::Rsa2048, 32);
        assert_eq!(pool.target(), MIN_KEYS);
        lock(&pool.taken).extend(std::iter::repeat_n(Instant::now(), 60));
        assert_eq!(pool.target(), 15);
        lock(&pool.taken).extend(std::iter::repeat_n(Instant::now(), 600));
        assert_eq!(pool.target(), 32);
        let none = KeyPool::new(KeyAlgorithm::Rsa2048, 0);
        assert_eq!(none.target(), 0);
    }
}
