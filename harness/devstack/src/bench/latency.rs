//! A bench run's latencies: percentiles over the pods, of the whole and of each part of a pod's
//! start (ours and the runtime's apart).

use crate::pod_volume::PodTimes;
use athenz_testbed::stats::percentile;
use serde::Serialize;
use std::time::Duration;

/// Percentiles of a set of durations, ms.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    /// The slowest pod's.
    pub max: f64,
}

impl Latency {
    /// The percentiles of `samples` (sorted here), in ms.
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort();
        Self {
            p50: ms(percentile(samples, 0.5)),
            p90: ms(percentile(samples, 0.9)),
            p99: ms(percentile(samples, 0.99)),
            max: samples.last().map_or(0.0, |d| ms(*d)),
        }
    }
}

/// Where mount → files went, each part over all pods (percentiles of each part separately, so
/// they do not add up to the total's).
#[derive(Debug, Serialize)]
pub struct LatencyParts {
    /// The mount as kubelet does it: the flex driver's process, or `NodePublishVolume` (the
    /// whole of files mode).
    pub mount: Latency,
    /// The SIA's own time as it reports it: from its `main` to the files written (the agent's
    /// answer included). `None` in files mode.
    pub sia: Option<Latency>,
    /// The rest: starting the SIA as a process of its pod (fork and exec; with pod cgroups, the
    /// stand-in runtime's placement of it in its container cgroup). Container start, which a
    /// real runtime does its own way; `None` in files mode.
    pub sia_process_start: Option<Latency>,
    /// This system's part of each pod's start, summed per pod: the mount (driver or
    /// `NodePublishVolume`) and the SIA's init as it reports it (agent included).
    pub product: Latency,
    /// The container runtime's part, summed per pod, up to the SIA's first instruction: with
    /// runc or crun, the sandbox's start and the init container's create + start; with
    /// `process`, the stand-in's (process start and cgroup placement); `None` in files mode,
    /// where no container of ours starts.
    pub runtime: Option<Latency>,
}

impl LatencyParts {
    pub(super) fn of(times: &[PodTimes]) -> Self {
        let mut mount: Vec<Duration> = times.iter().map(|t| t.mount).collect();
        let mut sia: Vec<Duration> = times.iter().filter_map(|t| t.sia.map(|s| s.own)).collect();
        let mut start: Vec<Duration> = times
            .iter()
            .filter_map(|t| t.sia.map(|s| s.process.saturating_sub(s.own)))
            .collect();
        let mut product: Vec<Duration> = times
            .iter()
            .map(|t| t.mount + t.sia.map(|s| s.own).unwrap_or_default())
            .collect();
        let mut runtime: Vec<Duration> = times
            .iter()
            .filter_map(|t| {
                t.sia
                    .map(|s| s.runtime.unwrap_or(s.process.saturating_sub(s.own)))
            })
            .collect();
        Self {
            mount: Latency::of(&mut mount),
            sia: (!sia.is_empty()).then(|| Latency::of(&mut sia)),
            sia_process_start: (!start.is_empty()).then(|| Latency::of(&mut start)),
            product: Latency::of(&mut product),
            runtime: (!runtime.is_empty()).then(|| Latency::of(&mut runtime)),
        }
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
