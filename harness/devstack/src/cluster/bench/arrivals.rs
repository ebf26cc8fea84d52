//! When a paced phase (sequential, churn) creates each of its pods: one per interval, each one
//! moved later by an offset within the kubelet's 100 ms loop period, the offsets spread evenly
//! over that period.
//!
//! Why: the kubelet starts a pod's volume mounts from two loops that run every 100 ms (its
//! volume populator and reconciler), and its pod worker checks the pod's volumes at once and then
//! every 300 ms. A pod whose mounts start just before the 300 ms check waits for the next one,
//! whatever its volumes cost (`volume_wait`; docs/benchmarks.md, "Where the burst and churn
//! p99s go"). Pods created exactly one interval apart meet those loops at nearly the same
//! point, drifting a few milliseconds per pod. So the unlucky pods come as a streak, and they
//! decide the p99 of whichever kind is running when the drift reaches the bad point: run 9's
//! sequential csi-files pods 36 to 39 all had their mounts started 284 to 301 ms after the
//! first check, and no SPIRE pod had. Offsets from the golden-ratio (Weyl) sequence spread every kind's pods evenly
//! over the loops' period, so each kind meets the kubelet's phases in the same proportion
//! wherever the drift stands when its turn comes. The sequence is the same for every kind.

use std::time::Duration;

/// The period of the kubelet's volume populator and reconciler loops (pkg/kubelet/volumemanager).
const KUBELET_LOOP_PERIOD: Duration = Duration::from_millis(100);
/// The golden ratio's fractional part: its multiples modulo 1 are as evenly spread as any
/// sequence can be, at every length.
const GOLDEN_FRACTION: f64 = 0.618_033_988_749_894_9;

/// When pod `index` of a phase is created, from the phase's start: `index` intervals, plus an
/// offset within the kubelet's loop period (within half an interval, for intervals under 200 ms,
/// so the pods keep their order).
pub fn arrival(index: usize, interval: Duration) -> Duration {
    let spread = KUBELET_LOOP_PERIOD.min(interval / 2);
    // exact for any pod count a run can have
    let slots = index as f64;
    interval.mul_f64(slots) + spread.mul_f64((slots * GOLDEN_FRACTION).fract())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_keep_their_pace_and_order() {
        let second = Duration::from_secs(1);
        assert_eq!(arrival(0, second), Duration::ZERO);
        for index in 0..200 {
            let at = arrival(index, second);
            let slot = second * u32::try_from(index).unwrap();
            assert!(
                at >= slot && at < slot + KUBELET_LOOP_PERIOD,
                "{index}: {at:?}"
            );
            assert!(arrival(index + 1, second) > at);
        }
        // a short interval keeps the order too: offsets within half of it
        let short = Duration::from_millis(40);
        for index in 0..200 {
            let gap = arrival(index + 1, short) - arrival(index, short);
            assert!(gap >= short / 2, "{index}: {gap:?}");
        }
    }

    /// Fifty pods (a sequential phase) fill every tenth of the kubelet's period with four to six
    /// of them; equal spacing could do no better than five.
    #[test]
    fn the_offsets_cover_the_kubelets_period_evenly() {
        let second = Duration::from_secs(1);
        let mut tenths = [0_usize; 10];
        for index in 0..50 {
            let offset = arrival(index, second) - second * u32::try_from(index).unwrap();
            let tenth = offset.as_micros() * 10 / KUBELET_LOOP_PERIOD.as_micros();
            tenths[usize::try_from(tenth).unwrap()] += 1;
        }
        assert!(tenths.iter().all(|n| (4..=6).contains(n)), "{tenths:?}");
    }
}
