//! Randomness from the operating system (the `getrandom` syscall).
//!
//! Used for node keys, salts, jitter and temporary names. Not aws-lc-rs's generator: the flex
//! driver, a short-lived process kubelet execs for every pod, needs a few bytes and nothing else
//! from aws-lc; built with aws-lc's CPU-jitter entropy source (this workspace builds without it,
//! `.cargo/config.toml`), that generator's first use cost about 20 ms of CPU.

use thiserror::Error;

/// The operating system could not supply random bytes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the system random generator failed: {0}")]
pub struct RandomError(String);

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> Result<(), RandomError> {
    getrandom::fill(buf).map_err(|e| RandomError(e.to_string()))
}

/// Draws once from aws-lc-rs's generator (the one rustls and key generation use), so that its
/// seeding — once per process and per thread: aws-lc keeps a generator per thread — happens now
/// rather than inside the first TLS handshake or key a request needs on this thread. Daemons call
/// it before they listen and on every runtime worker when it first goes idle. From the kernel, as
/// this workspace builds aws-lc, seeding is cheap; with aws-lc's CPU-jitter entropy source (a
/// build without `.cargo/config.toml`'s setting, or a FIPS build) it is tens of milliseconds of
/// CPU, which would otherwise land in the first pods' latency.
pub fn seed_crypto_generator() -> Result<(), RandomError> {
    use aws_lc_rs::rand::SecureRandom;
    let mut byte = [0u8; 1];
    aws_lc_rs::rand::SystemRandom::new()
        .fill(&mut byte)
        .map_err(|_| RandomError("aws-lc-rs's generator could not be seeded".into()))
}

/// [`seed_crypto_generator`] the first time it is called on a thread; afterwards a thread-local
/// check. Cheap enough to run every time a runtime worker goes idle.
pub fn seed_crypto_generator_once_per_thread() {
    thread_local! {
        static SEEDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    SEEDED.with(|seeded| {
        if !seeded.get() {
            seeded.set(true);
            // a failure shows again, with its own error, where randomness is needed
            let _ = seed_crypto_generator();
        }
    });
}

/// `N` random bytes as lowercase hex, for unique temporary names. Falls back to the time and pid
/// if the generator fails: such names are created exclusively, so a clash is an error, never a
/// hazard.
pub fn hex_name<const N: usize>() -> String {
    let mut bytes = [0u8; N];
    if fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let seed = nanos ^ (u128::from(std::process::id()) << 64);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 8)) as u8;
        }
    }
    crate::encoding::hex(&bytes)
}

/// A uniform sample in `[0, 1)` (0.5 if the generator fails).
pub fn unit() -> f64 {
    match getrandom::u64() {
        // 53 random bits make every f64 in [0, 1) with that spacing equally likely.
        Ok(v) => (v >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_hex() {
        let a = hex_name::<8>();
        let b = hex_name::<8>();
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn unit_is_in_range_and_varies() {
        let samples: Vec<f64> = (0..1000).map(|_| unit()).collect();
        assert!(samples.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        assert!((0.4..0.6).contains(&mean), "{mean}");
    }
}
