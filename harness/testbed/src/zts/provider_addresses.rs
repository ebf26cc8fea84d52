//! Where a provider's endpoint host pointed, kept as the JVM keeps it for ZTS: a successful
//! lookup is reused for 30 s (`networkaddress.cache.ttl`, whose default without a security
//! manager is OpenJDK's `InetAddressCachePolicy.DEFAULT_POSITIVE`), so a confirmation costs
//! real ZTS a DNS question at most once per half minute per host, not once per launch. A failed
//! lookup is not kept (the JVM keeps one for 10 s): the next confirmation asks again, which is
//! never slower to recover than ZTS.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a found address is reused.
pub const POSITIVE_TTL: Duration = Duration::from_secs(30);

/// The most hosts remembered: a ZTS knows a handful of providers; past this the oldest answers
/// are dropped first.
const MAX_HOSTS: usize = 256;

/// Found addresses by host name, each with when it was found.
#[derive(Debug, Default)]
pub struct ProviderAddresses {
    found: Mutex<HashMap<String, (IpAddr, Instant)>>,
}

impl ProviderAddresses {
    /// `host`'s address if it was found less than [`POSITIVE_TTL`] before `now`.
    pub fn get(&self, host: &str, now: Instant) -> Option<IpAddr> {
        let found = self
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        found
            .get(host)
            .filter(|(_, at)| is_fresh(*at, now))
            .map(|(ip, _)| *ip)
    }

    /// Remembers that `host` pointed at `ip` at `now`.
    pub fn put(&self, host: &str, ip: IpAddr, now: Instant) {
        let mut found = self
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        found.retain(|_, (_, at)| is_fresh(*at, now));
        if found.len() >= MAX_HOSTS
            && let Some(oldest) = found
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(h, _)| h.clone())
        {
            found.remove(&oldest);
        }
        found.insert(host.to_owned(), (ip, now));
    }
}

/// Whether an address found at `at` may still be used at `now`.
fn is_fresh(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < POSITIVE_TTL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_found_address_is_reused_for_thirty_seconds_then_asked_again() {
        let cache = ProviderAddresses::default();
        let t0 = Instant::now();
        let ip: IpAddr = "10.96.0.9".parse().unwrap();
        assert_eq!(cache.get("cb.example", t0), None, "nothing before a lookup");
        cache.put("cb.example", ip, t0);
        assert_eq!(
            cache.get("cb.example", t0 + Duration::from_secs(29)),
            Some(ip)
        );
        assert_eq!(cache.get("other.example", t0), None, "kept per host");
        assert_eq!(
            cache.get("cb.example", t0 + POSITIVE_TTL),
            None,
            "asked again once the JVM's 30 s are up"
        );
    }

    #[test]
    fn the_cache_holds_a_bounded_number_of_hosts() {
        let cache = ProviderAddresses::default();
        let t0 = Instant::now();
        let ip: IpAddr = "10.96.0.9".parse().unwrap();
        for i in 0..MAX_HOSTS + 10 {
            let at = t0 + Duration::from_millis(u64::try_from(i).unwrap());
            cache.put(&format!("h{i}.example"), ip, at);
        }
        let later = t0 + Duration::from_secs(1);
        assert_eq!(cache.found.lock().unwrap().len(), MAX_HOSTS);
        assert_eq!(
            cache.get("h0.example", later),
            None,
            "the oldest went first"
        );
        let newest = format!("h{}.example", MAX_HOSTS + 9);
        assert_eq!(cache.get(&newest, later), Some(ip));
    }
}
