//! Whether the nodes have room for the pods a bench keeps alive at once, asked before anything
//! runs: a pod beyond the kubelet's `maxPods` waits unscheduled, and the run would fail minutes
//! later with pods that "never held a credential".

use super::BenchOptions;
use super::pods::Churn;
use crate::cluster::kubectl::Kubectl;
use anyhow::Context;

/// The most pods of one kind alive at once: a sequential or burst phase's pods all stay until
/// the phase ends; a churn pod lives its lifetime, one created per interval.
pub fn pods_at_once(options: &BenchOptions) -> usize {
    options
        .sequential
        .max(options.burst)
        .max(churn_at_once(&options.churn))
}

fn churn_at_once(churn: &Churn) -> usize {
    if churn.duration.is_zero() || churn.interval.is_zero() {
        return 0;
    }
    let alive = (churn.lifetime.as_secs_f64() / churn.interval.as_secs_f64()).ceil();
    // a churn creates no more pods than fit in its duration
    let created = (churn.duration.as_secs_f64() / churn.interval.as_secs_f64()).ceil() + 1.0;
    alive.min(created) as usize
}

/// Refuses `needed` pods at once where the nodes have room for fewer.
pub fn check(needed: usize, allocatable: usize, present: usize) -> anyhow::Result<()> {
    let room = allocatable.saturating_sub(present);
    anyhow::ensure!(
        needed <= room,
        "the bench keeps up to {needed} pods alive at once (--sequential, --burst, or the \
         churn's lifetime over its interval), but the nodes have room for {room} more \
         ({allocatable} pods allocatable, {present} present): ask for at most {room}"
    );
    Ok(())
}

/// The nodes' allocatable pods, and the pods on them that are not finished.
pub fn capacity(kubectl: &Kubectl) -> anyhow::Result<(usize, usize)> {
    let nodes = kubectl.get_json(&["nodes"])?;
    let mut allocatable = 0;
    for node in nodes["items"].as_array().context("no node list")? {
        let pods = node["status"]["allocatable"]["pods"]
            .as_str()
            .with_context(|| format!("node without allocatable pods: {}", node["metadata"]))?;
        allocatable += pods
            .parse::<usize>()
            .with_context(|| format!("allocatable pods {pods:?}"))?;
    }
    let pods = kubectl.get_json(&[
        "pods",
        "-A",
        "--field-selector",
        "status.phase!=Succeeded,status.phase!=Failed",
    ])?;
    let present = pods["items"].as_array().context("no pod list")?.len();
    Ok((allocatable, present))
}

#[cfg(test)]
mod tests {
    use super::super::Systems;
    use super::*;
    use std::time::Duration;

    fn options(sequential: usize, burst: usize, churn: Churn) -> BenchOptions {
        BenchOptions {
            sequential,
            interval: Duration::from_secs(1),
            burst,
            churn,
            systems: Systems {
                athenz: true,
                spire: Some(crate::cluster::spire::Entries::Cli),
            },
            order_offset: 0,
        }
    }

    fn churn(duration: u64, interval_ms: u64, lifetime: u64) -> Churn {
        Churn {
            duration: Duration::from_secs(duration),
            interval: Duration::from_millis(interval_ms),
            lifetime: Duration::from_secs(lifetime),
        }
    }

    #[test]
    fn the_largest_phase_decides() {
        // the defaults: 50 one a second, 30 at once, a churn of 10 s lives one a second
        assert_eq!(pods_at_once(&options(50, 30, churn(120, 1000, 10))), 50);
        assert_eq!(pods_at_once(&options(10, 80, churn(120, 1000, 10))), 80);
        // ten pods a second living 30 s: 300 at once
        assert_eq!(pods_at_once(&options(10, 10, churn(120, 100, 30))), 300);
        // a churn shorter than its pods' lifetime makes only the pods its duration holds
        assert_eq!(pods_at_once(&options(0, 0, churn(2, 1000, 60))), 3);
        // no churn, or one of no interval, keeps none
        assert_eq!(pods_at_once(&options(5, 0, churn(0, 1000, 10))), 5);
        assert_eq!(pods_at_once(&options(5, 0, churn(60, 0, 10))), 5);
    }

    #[test]
    fn more_pods_than_the_room_left_are_refused_naming_the_room() {
        check(50, 110, 20).expect("90 free");
        check(90, 110, 20).expect("exactly the room");
        let refused = check(150, 110, 20).unwrap_err().to_string();
        assert!(refused.contains("up to 150 pods"), "{refused}");
        assert!(refused.contains("room for 90 more"), "{refused}");
        assert!(
            refused.contains("110 pods allocatable, 20 present"),
            "{refused}"
        );
        // more present than allocatable (static pods, say): no room at all
        assert!(
            check(1, 10, 12)
                .unwrap_err()
                .to_string()
                .contains("room for 0")
        );
    }
}
