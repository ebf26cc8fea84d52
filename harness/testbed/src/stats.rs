//! Latency figures for the benchmarks.

use std::time::Duration;

/// The `p` quantile (0..=1) of `sorted` latencies, by nearest rank; zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `p50 …, p90 …, p99 …` in milliseconds, sorting `samples` first.
pub fn summary_ms(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |p| percentile(samples, p).as_secs_f64() * 1e3;
    format!(
        "p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        ms(0.5),
        ms(0.9),
        ms(0.99)
    )
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`, `RssAnon:`…), in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&s, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
        let mut unsorted = vec![
            Duration::from_millis(3),
            Duration::from_millis(1),
            Duration::from_millis(2),
        ];
        assert_eq!(
            summary_ms(&mut unsorted),
            "p50 2.00 ms, p90 3.00 ms, p99 3.00 ms"
        );
    }
}
