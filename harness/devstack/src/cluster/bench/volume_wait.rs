//! What the kubelet's log says about each measured pod's volumes: how long its identity volume
//! (the pod's CSI or flex volume) took to set up, and how many of the kubelet's volume checks the
//! pod waited. The kubelet's pod worker checks a pod's volumes at once and then every 300 ms
//! (`podAttachAndMountRetryInterval`, pkg/kubelet/volumemanager), so a pod whose last volume is
//! ready just after a check starts 300 ms later: the cause of our churn and burst p99 tails
//! (docs/benchmarks.md, "Where the burst and churn p99s go"). Read from the klog lines of
//! Kubernetes 1.37; a kubelet that logs otherwise gives empty figures, never wrong ones.

use crate::bench::Latency;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The kubelet's period between two checks of a pod's volumes.
const CHECK_PERIOD: Duration = Duration::from_millis(300);

/// One phase of one kind, from the kubelet's log.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeWaits {
    /// Pods whose volume checks the log shows.
    pub pods: usize,
    /// Of those, the pods that waited past the kubelet's first 300 ms check.
    pub pods_waiting_more_than_one_check: usize,
    /// `MountVolume started` → `MountVolume.SetUp succeeded` of the pod's CSI or flex volume
    /// (none for a kind without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_volume_setup_ms: Option<Latency>,
    /// The pod worker's first check → the kubelet starting the pod's first volume mount: the
    /// kubelet's own part (its volume populator and reconciler loops, 100 ms each, and one
    /// reconciler pass to verify the volumes before the one that mounts them), whatever the
    /// volumes are. A pod whose mounts start near 300 ms waits a second check even with
    /// volumes that take no time; comparable kinds should show the same spread here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_mount_start_ms: Option<Latency>,
}

/// What the log says about one pod since its last `SyncLoop ADD`.
#[derive(Debug, Default, Clone)]
struct PodVolumes {
    /// The pod worker's two `No sandbox for pod can be found` lines: before the volume wait
    /// and after it.
    syncs: Vec<f64>,
    /// The first of its volumes' mounts started.
    first_mount_started: Option<f64>,
    /// The identity volume's mount started, and set up.
    identity_started: Option<f64>,
    identity_set_up: Option<f64>,
}

/// Seconds of the day in a clock `HH:MM:SS.fraction`, as the node's logs write it.
pub(super) fn clock_seconds(clock: &str) -> Option<f64> {
    let (h, rest) = clock.split_once(':')?;
    let (m, s) = rest.split_once(':')?;
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// Seconds of the day a klog line (`I1128 20:50:25.978900 ...`) was written at.
pub(super) fn klog_seconds(line: &str) -> Option<f64> {
    clock_seconds(line.get(6..21)?)
}

/// The text in `line` after `key`, up to the next `end`.
pub(super) fn text_between<'a>(line: &'a str, key: &str, end: &str) -> Option<&'a str> {
    let start = line.find(key)? + key.len();
    let rest = line.get(start..)?;
    Some(&rest[..rest.find(end)?])
}

/// The value of `key="..."` in a klog line.
fn quoted<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    text_between(line, key, "\"")
}

/// Whether a volume line is about a CSI or flex volume: its `UniqueName` is
/// `kubernetes.io/csi/...`, or a flex driver's `<vendor>/<driver>/...` (every in-tree kind,
/// projected, emptyDir and the rest, is `kubernetes.io/<kind>/...`).
fn is_identity_volume(line: &str) -> bool {
    let Some(unique) = quoted(line, "(UniqueName: \\\"") else {
        return false;
    };
    let unique = unique.trim_end_matches('\\');
    unique.starts_with("kubernetes.io/csi/") || !unique.starts_with("kubernetes.io/")
}

/// Reads the kubelet's `log` for the pods of `namespace`; each pod's last lifecycle counts (a
/// name used twice, as the warm-up pod's is, keeps its later one).
fn pods_of(log: &str, namespace: &str) -> BTreeMap<String, PodVolumes> {
    let prefix = format!("{namespace}/");
    let mut pods: BTreeMap<String, PodVolumes> = BTreeMap::new();
    for line in log.lines().filter(|l| l.starts_with('I')) {
        let Some(at) = klog_seconds(line) else {
            continue;
        };
        if line.contains("\"SyncLoop ADD\"") {
            let added = line.split('"').filter(|part| part.starts_with(&prefix));
            for pod in added {
                pods.insert(pod.to_owned(), PodVolumes::default());
            }
            continue;
        }
        let Some(pod) = quoted(line, " pod=\"").filter(|p| p.starts_with(&prefix)) else {
            continue;
        };
        let Some(record) = pods.get_mut(pod) else {
            continue;
        };
        if line.contains("\"No sandbox for pod can be found") && record.syncs.len() < 2 {
            record.syncs.push(at);
        } else if line.contains("\"operationExecutor.MountVolume started") {
            record.first_mount_started.get_or_insert(at);
            if is_identity_volume(line) {
                record.identity_started.get_or_insert(at);
            }
        } else if line.contains("\"MountVolume.SetUp succeeded") && is_identity_volume(line) {
            record.identity_set_up.get_or_insert(at);
        }
    }
    pods
}

/// A span of the day's seconds, across midnight if need be. Two processes' lines can be out of
/// order by a little (containerd logs a task's exit before the start call that began it
/// returns): an end less than half a day before its start is the same moment, zero.
pub(super) fn span(from: f64, to: f64) -> Duration {
    const DAY: f64 = 86_400.0;
    let seconds = if to >= from {
        to - from
    } else if from - to > DAY / 2.0 {
        to + DAY - from
    } else {
        0.0
    };
    Duration::from_secs_f64(seconds)
}

/// The records of `namespace`'s pods named `<phase>-<n>`.
fn of_phase<'a>(
    pods: &'a BTreeMap<String, PodVolumes>,
    namespace: &str,
    phase: &str,
) -> Vec<&'a PodVolumes> {
    let name = format!("{namespace}/{phase}-");
    pods.iter()
        .filter(|(pod, _)| {
            pod.strip_prefix(&name)
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .map(|(_, record)| record)
        .collect()
}

/// How long each of `records`' identity volumes took to set up.
fn identity_setups_of(records: &[&PodVolumes]) -> Vec<Duration> {
    records
        .iter()
        .filter_map(|r| Some(span(r.identity_started?, r.identity_set_up?)))
        .collect()
}

/// How long the identity volumes of `namespace`'s pods named `<phase>-<n>` took to set up, in
/// each pod's last lifecycle the log shows (`cluster flood` reads it after every round).
pub fn identity_setups(log: &str, namespace: &str, phase: &str) -> Vec<Duration> {
    identity_setups_of(&of_phase(&pods_of(log, namespace), namespace, phase))
}

/// The volume waits of `namespace`'s pods named `<phase>-<n>`, by phase name.
pub fn by_phase(log: &str, namespace: &str, phases: &[&str]) -> BTreeMap<String, VolumeWaits> {
    let pods = pods_of(log, namespace);
    let mut waits = BTreeMap::new();
    for phase in phases {
        let of_phase = of_phase(&pods, namespace, phase);
        let waited: Vec<Duration> = of_phase
            .iter()
            .filter(|r| r.syncs.len() == 2)
            .map(|r| span(r.syncs[0], r.syncs[1]))
            .collect();
        if waited.is_empty() {
            continue;
        }
        let mut setups = identity_setups_of(&of_phase);
        let mut mount_starts: Vec<Duration> = of_phase
            .iter()
            .filter_map(|r| Some(span(*r.syncs.first()?, r.first_mount_started?)))
            .collect();
        waits.insert(
            (*phase).to_owned(),
            VolumeWaits {
                pods: waited.len(),
                // a wait of one check is ~300 ms; half a period more is a second check
                pods_waiting_more_than_one_check: waited
                    .iter()
                    .filter(|w| **w > CHECK_PERIOD + CHECK_PERIOD / 2)
                    .count(),
                identity_volume_setup_ms: (!setups.is_empty()).then(|| Latency::of(&mut setups)),
                kubelet_mount_start_ms: (!mount_starts.is_empty())
                    .then(|| Latency::of(&mut mount_starts)),
            },
        );
    }
    waits
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of one files-mode pod of run 8 (/tmp/bench10/logs/kubelet.log), trimmed.
    const ONE_POD: &str = r#"I1128 20:50:25.978900    2955 kubelet.go:2760] "SyncLoop ADD" source="api" pods=["bench-csi-files/churn-111"]
I1128 20:50:25.982685    2955 util.go:35] "No sandbox for pod can be found. Need to start a new one" pod="bench-csi-files/churn-111"
I1128 20:50:26.275174    2955 reconciler_common.go:225] "operationExecutor.MountVolume started for volume \"athenz-identity\" (UniqueName: \"kubernetes.io/csi/ddf65a26-athenz-identity\") pod \"churn-111\" (UID: \"ddf65a26\") " pod="bench-csi-files/churn-111"
I1128 20:50:26.275205    2955 reconciler_common.go:225] "operationExecutor.MountVolume started for volume \"kube-api-access-nlgnw\" (UniqueName: \"kubernetes.io/projected/ddf65a26-kube-api-access-nlgnw\") pod \"churn-111\" (UID: \"ddf65a26\") " pod="bench-csi-files/churn-111"
I1128 20:50:26.287105    2955 operation_generator.go:620] "MountVolume.SetUp succeeded for volume \"kube-api-access-nlgnw\" (UniqueName: \"kubernetes.io/projected/ddf65a26-kube-api-access-nlgnw\") pod \"churn-111\" (UID: \"ddf65a26\") " pod="bench-csi-files/churn-111"
I1128 20:50:26.290684    2955 operation_generator.go:620] "MountVolume.SetUp succeeded for volume \"athenz-identity\" (UniqueName: \"kubernetes.io/csi/ddf65a26-athenz-identity\") pod \"churn-111\" (UID: \"ddf65a26\") " pod="bench-csi-files/churn-111"
I1128 20:50:26.586862    2955 util.go:35] "No sandbox for pod can be found. Need to start a new one" pod="bench-csi-files/churn-111"
"#;

    #[test]
    fn a_pod_that_missed_a_check_is_counted_with_its_volume_setup() {
        let waits = by_phase(ONE_POD, "bench-csi-files", &["churn", "burst"]);
        assert_eq!(waits.len(), 1, "no burst pod in the log: no burst figures");
        let churn = &waits["churn"];
        assert_eq!(churn.pods, 1);
        assert_eq!(churn.pods_waiting_more_than_one_check, 1);
        let setup = churn.identity_volume_setup_ms.as_ref().unwrap();
        assert!((setup.p50 - 15.51).abs() < 0.01, "{setup:?}");
        // its mounts started 292.5 ms after the first check: too late for the 300 ms one
        let start = churn.kubelet_mount_start_ms.as_ref().unwrap();
        assert!((start.p50 - 292.49).abs() < 0.01, "{start:?}");
    }

    #[test]
    fn one_check_and_no_identity_volume_and_other_namespaces() {
        // the same pod, its volumes ready for the first check after the immediate one
        let quick = ONE_POD
            .replace("20:50:26.586862", "20:50:26.284000")
            .replace("kubernetes.io/csi/", "kubernetes.io/projected/");
        let waits = by_phase(&quick, "bench-csi-files", &["churn"]);
        assert_eq!(waits["churn"].pods_waiting_more_than_one_check, 0);
        assert!(waits["churn"].identity_volume_setup_ms.is_none());
        // the projected volume's mount start is the kubelet's part all the same
        assert!(waits["churn"].kubelet_mount_start_ms.is_some());
        assert!(by_phase(ONE_POD, "bench-spire", &["churn"]).is_empty());
        // a flex driver's volume is the identity volume too; an emptyDir is not
        let flex = ONE_POD.replace("kubernetes.io/csi/", "athenz/volume-driver/");
        assert!(
            by_phase(&flex, "bench-csi-files", &["churn"])["churn"]
                .identity_volume_setup_ms
                .is_some()
        );
        let empty_dir = ONE_POD.replace("kubernetes.io/csi/", "kubernetes.io/empty-dir/");
        assert!(
            by_phase(&empty_dir, "bench-csi-files", &["churn"])["churn"]
                .identity_volume_setup_ms
                .is_none()
        );
        assert!(by_phase(ONE_POD, "bench-csi", &["churn"]).is_empty());
    }

    #[test]
    fn a_reused_name_keeps_its_last_lifecycle_and_midnight_is_crossed() {
        let again = concat!(
            "I1128 23:59:59.700000 1 kubelet.go:2760] \"SyncLoop ADD\" source=\"api\" pods=[\"bench-csi-files/churn-111\"]\n",
            "I1128 23:59:59.704000 1 util.go:35] \"No sandbox for pod can be found. Need to start a new one\" pod=\"bench-csi-files/churn-111\"\n",
            "I1129 00:00:00.004000 1 util.go:35] \"No sandbox for pod can be found. Need to start a new one\" pod=\"bench-csi-files/churn-111\"\n",
        );
        let pods = pods_of(&format!("{ONE_POD}{again}"), "bench-csi-files");
        let pod = &pods["bench-csi-files/churn-111"];
        assert_eq!(
            pod.identity_started, None,
            "the first lifecycle's volume is forgotten"
        );
        let wait = span(pod.syncs[0], pod.syncs[1]);
        assert!((wait.as_secs_f64() - 0.3).abs() < 1e-6, "{wait:?}");
        let waits = by_phase(&format!("{ONE_POD}{again}"), "bench-csi-files", &["churn"]);
        assert_eq!(waits["churn"].pods_waiting_more_than_one_check, 0);
    }

    #[test]
    fn the_setups_of_a_phase_are_read_from_each_pods_last_lifecycle() {
        let setups = identity_setups(ONE_POD, "bench-csi-files", "churn");
        assert_eq!(setups.len(), 1);
        assert!(
            (setups[0].as_secs_f64() - 0.015_51).abs() < 1e-5,
            "{setups:?}"
        );
        assert!(identity_setups(ONE_POD, "bench-csi-files", "sequential").is_empty());
        // the same name created again: only the later lifecycle's volume counts
        let later = ONE_POD
            .replace("20:50:26.290684", "20:50:26.375174")
            .replace("20:50:2", "21:00:2");
        let setups = identity_setups(&format!("{ONE_POD}{later}"), "bench-csi-files", "churn");
        assert_eq!(setups.len(), 1);
        assert!((setups[0].as_secs_f64() - 0.1).abs() < 1e-5, "{setups:?}");
    }

    #[test]
    fn an_end_logged_just_before_its_start_is_no_span_and_midnight_is_a_day_apart() {
        assert_eq!(span(100.004, 100.003), Duration::ZERO);
        let across = span(86_399.9, 0.1).as_secs_f64();
        assert!((across - 0.2).abs() < 1e-9, "{across}");
        assert_eq!(span(1.0, 1.5), Duration::from_millis(500));
    }

    #[test]
    fn garbled_lines_are_skipped() {
        let garbled = "I11\nIxxxx 99:99:99.0 x\nE1128 20:50:25.9 \"SyncLoop ADD\" pods=[\"bench-a/churn-1\"]\n\u{fffd}\n";
        assert!(by_phase(garbled, "bench-a", &["churn"]).is_empty());
        let seconds = klog_seconds("I1128 20:50:25.978900 x").unwrap();
        assert!((seconds - 75_025.978_9).abs() < 1e-6, "{seconds}");
        assert_eq!(klog_seconds("I1128 2"), None);
        assert_eq!(quoted("a pod=\"x/y\" b", " pod=\""), Some("x/y"));
        assert_eq!(quoted("a pod=\"x", " pod=\""), None);
    }
}
