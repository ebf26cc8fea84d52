//! `athenz-devstack soak`: the whole stack for a long time with short certificate lifetimes, so
//! every pod and the node refresh many times, watching what a platform team watches on a node
//! that runs for weeks: the memory, file descriptors and threads of every daemon (they must stay
//! flat once warm) and every pod's files (they must never expire, never be torn).
//!
//! Every `sample` interval it reads each daemon's RSS, fd and thread counts from /proc, the
//! largest of the pods' SIA refreshers, and every pod's credential set. The first sample after
//! `warmup` ends the baseline: for each metric, the highest value sampled up to it, because a
//! sample is one instant and counts whatever is in flight then (a refresh's connections are fds
//! for a moment), so the warm-up's swing is the daemon's normal range, not its lowest point. A
//! later sample above `baseline × (1 + growth) + slack` (slack: 1 MiB, 4 fds, 2 threads, so a
//! daemon of a few MiB is not failed for a page) fails the run, as does
//! a daemon or refresher that exits, a set whose certificate expired or whose key is not the
//! certificate's.

use crate::fleet::Fleet;
use crate::procs::Usage;
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, bail};
use athenz_core::volume_mode::VolumeMode;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to run: `soak`'s options, as its command line gives them.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakOptions {
    /// How long to run once every pod has its identity (e.g. 30m).
    #[arg(long, default_value = "30m", value_parser = athenz_core::refresh::parse_duration)]
    pub duration: Duration,
    /// Pods (each with a refresh sidecar unless the volume is csi-files).
    #[arg(long, default_value_t = 110)]
    pub pods: usize,
    /// Certificate lifetime in minutes (the pods refresh at about 70 % of it).
    #[arg(long, default_value_t = 1)]
    pub lifetime_minutes: u32,
    /// Time between samples.
    #[arg(long, default_value = "60s", value_parser = athenz_core::refresh::parse_duration)]
    pub sample: Duration,
    /// Samples before this are warm-up; the baseline is the highest sample up to the first after it.
    #[arg(long, default_value = "5m", value_parser = athenz_core::refresh::parse_duration)]
    pub warmup: Duration,
    /// Growth allowed over the baseline, percent (plus 1 MiB, 4 fds, 2 threads).
    #[arg(long, default_value_t = 10.0)]
    pub growth_percent: f64,
    /// The pods' volume.
    #[arg(long, value_enum, default_value_t = VolumeMode::Flex)]
    pub volume: VolumeMode,
    /// Run each component from its own binary in DIR instead of this one.
    #[arg(long, value_name = "DIR")]
    pub components: Option<PathBuf>,
    /// Write the series here as CSV (process,at_seconds,rss_kib,fds,threads).
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

/// One process at one sample.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Point {
    /// Seconds since the pods had their identities.
    pub at_seconds: u64,
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    pub threads: u64,
}

/// The outcome.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub pods: usize,
    /// Volume kind.
    pub volume: VolumeMode,
    /// Certificate lifetime, seconds.
    pub lifetime_seconds: u64,
    /// Seconds run.
    pub seconds: u64,
    /// The series, per process (daemons by name; `sia-refresh (max)`: the largest refresher).
    pub series: BTreeMap<String, Vec<Point>>,
    /// Certificate changes seen in the pods' files (refreshes that reached the pod).
    pub rotations_seen: u64,
    /// Reads of a set whose certificate had expired.
    pub expired_reads: u64,
    /// Reads of a set whose key was not its certificate's.
    pub torn_reads: u64,
    /// What broke a bound, one line each; empty when passed.
    pub failures: Vec<String>,
    /// No failure.
    pub passed: bool,
}

/// The largest value a metric may reach over its baseline.
fn limit(baseline: u64, growth: f64, slack: u64) -> u64 {
    (baseline as f64 * (1.0 + growth)).ceil() as u64 + slack
}

/// Checks every process's points after the baseline against the bounds.
pub fn check_growth(
    series: &BTreeMap<String, Vec<Point>>,
    warmup: u64,
    growth: f64,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, points) in series {
        let Some(base) = points.iter().find(|p| p.at_seconds >= warmup) else {
            continue;
        };
        let up_to_base = || points.iter().filter(|p| p.at_seconds <= base.at_seconds);
        let highest = |metric: fn(&Point) -> u64| up_to_base().map(metric).max().unwrap_or(0);
        let (rss, fds, threads) = (
            highest(|p| p.rss_kib),
            highest(|p| p.fds),
            highest(|p| p.threads),
        );
        for p in points.iter().filter(|p| p.at_seconds > base.at_seconds) {
            for (metric, value, baseline, slack) in [
                ("RSS KiB", p.rss_kib, rss, 1024),
                ("fds", p.fds, fds, 4),
                ("threads", p.threads, threads, 2),
            ] {
                let most = limit(baseline, growth, slack);
                if value > most {
                    failures.push(format!(
                        "{name}: {metric} {value} at {} s, above {most} (baseline {baseline}, the highest up to {} s, + {:.0} % + {slack})",
                        p.at_seconds,
                        base.at_seconds,
                        growth * 100.0
                    ));
                }
            }
        }
    }
    failures
}

/// Runs the soak on a fresh stack in `state_dir`.
pub async fn run(state_dir: &Path, options: &SoakOptions) -> anyhow::Result<SoakReport> {
    if options.pods == 0 || options.lifetime_minutes == 0 || options.sample.is_zero() {
        bail!("--pods, --lifetime-minutes and --sample must be above zero");
    }
    let mut stack = Stack::start(&StackOptions {
        components: options.components.clone(),
        volume: options.volume,
        cert_expiry_minutes: Some(options.lifetime_minutes),
        ..StackOptions::new(state_dir.to_owned(), "p256")
    })
    .await?;
    let result = soak(&mut stack, options).await;
    stack.stop().await;
    result
}

async fn soak(stack: &mut Stack, options: &SoakOptions) -> anyhow::Result<SoakReport> {
    let mut fleet = Fleet::start(stack, 0..options.pods, options.volume).await?;
    let mut series: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    let mut serials: Vec<Option<String>> = vec![None; fleet.volumes.len()];
    let (mut rotations_seen, mut expired_reads, mut torn_reads) = (0, 0, 0);
    let mut failures = Vec::new();
    let started = Instant::now();
    loop {
        let at_seconds = started.elapsed().as_secs();
        for (name, usage) in stack.usage() {
            series
                .entry(name)
                .or_default()
                .push(point(at_seconds, &usage));
        }
        if let Some(largest) = fleet
            .refreshers
            .iter()
            .map(|r| r.process.usage())
            .max_by_key(|u| u.rss_kib)
        {
            series
                .entry("sia-refresh (max)".into())
                .or_default()
                .push(point(at_seconds, &largest));
        }
        let census = fleet.census();
        expired_reads += census.expired.len();
        torn_reads += census.torn.len();
        for (pod, why) in &census.unreadable {
            failures.push(format!("{}: {why}", fleet.volumes[*pod].pod.name));
        }
        for (now, before) in census.serials.into_iter().zip(serials.iter_mut()) {
            if before.is_some() && now.is_some() && now != *before {
                rotations_seen += 1;
            }
            *before = now;
        }
        if let Some(dead) = fleet.dead_refresher() {
            failures.push(dead);
        }
        if let Err(e) = stack.check_alive() {
            failures.push(format!("{e:#}"));
        }
        if !failures.is_empty() || started.elapsed() >= options.duration {
            break;
        }
        tokio::time::sleep(
            options
                .sample
                .min(options.duration.saturating_sub(started.elapsed())),
        )
        .await;
    }
    fleet.stop(stack).await?;
    failures.extend(check_growth(
        &series,
        options.warmup.as_secs(),
        options.growth_percent / 100.0,
    ));
    if expired_reads > 0 {
        failures.push(format!(
            "{expired_reads} reads found an expired certificate"
        ));
    }
    if torn_reads > 0 {
        failures.push(format!(
            "{torn_reads} reads found a key not of its certificate"
        ));
    }
    let report = SoakReport {
        pods: options.pods,
        volume: options.volume,
        lifetime_seconds: u64::from(options.lifetime_minutes) * 60,
        seconds: started.elapsed().as_secs(),
        series,
        rotations_seen,
        expired_reads: expired_reads as u64,
        torn_reads: torn_reads as u64,
        passed: failures.is_empty(),
        failures,
    };
    if let Some(path) = &options.csv {
        std::fs::write(path, to_csv(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

fn point(at_seconds: u64, usage: &Usage) -> Point {
    Point {
        at_seconds,
        rss_kib: usage.rss_kib,
        fds: usage.fds,
        threads: usage.threads,
    }
}

/// The series as CSV: `process,at_seconds,rss_kib,fds,threads`.
pub fn to_csv(report: &SoakReport) -> String {
    let mut out = String::from("process,at_seconds,rss_kib,fds,threads\n");
    for (name, points) in &report.series {
        for p in points {
            out.push_str(&format!(
                "{name},{},{},{},{}\n",
                p.at_seconds, p.rss_kib, p.fds, p.threads
            ));
        }
    }
    out
}

/// The human form: per process, RSS MiB / fds / threads at each sample; then the verdict.
pub fn print_human(report: &SoakReport) {
    println!(
        "soak: {} pods ({:?}), certificates of {} s, {} s run, {} certificate changes seen in the pods' files",
        report.pods, report.volume, report.lifetime_seconds, report.seconds, report.rotations_seen
    );
    for (name, points) in &report.series {
        let cells: Vec<String> = points
            .iter()
            .map(|p| {
                format!(
                    "{}s:{:.1}M/{}fd/{}t",
                    p.at_seconds,
                    p.rss_kib as f64 / 1024.0,
                    p.fds,
                    p.threads
                )
            })
            .collect();
        println!("  {name:<32} {}", cells.join(" "));
    }
    println!(
        "  expired reads {}, torn reads {}",
        report.expired_reads, report.torn_reads
    );
    if report.passed {
        println!("PASSED");
    } else {
        for f in &report.failures {
            println!("FAILED: {f}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(s: u64, rss: u64, fds: u64, threads: u64) -> Point {
        Point {
            at_seconds: s,
            rss_kib: rss,
            fds,
            threads,
        }
    }

    #[test]
    fn growth_is_judged_from_the_first_sample_after_warm_up() {
        let mut series = BTreeMap::new();
        // warm-up may grow freely; after it, 10 % + slack
        series.insert(
            "agent".to_owned(),
            vec![
                at(0, 5_000, 10, 4),
                at(60, 10_000, 20, 6),
                at(120, 12_024, 26, 8),
            ],
        );
        assert!(check_growth(&series, 60, 0.10).is_empty());
        series
            .get_mut("agent")
            .unwrap()
            .push(at(180, 12_025, 27, 10));
        let failures = check_growth(&series, 60, 0.10);
        assert_eq!(failures.len(), 3, "{failures:?}");
        assert!(failures[0].starts_with("agent: RSS KiB 12025 at 180 s, above 12024"));
        assert!(failures[1].starts_with("agent: fds 27 at 180 s, above 26"));
        assert!(failures[2].starts_with("agent: threads 10 at 180 s, above 9"));
    }

    /// A sample is one instant: the baseline is the highest value of the warm-up, so a daemon
    /// caught between refreshes at the baseline sample is not failed for its next refresh's
    /// connections (the agent of a CI soak: fds 16, 17, then 13 at the baseline, then 21), while
    /// a climb past the warm-up's range still fails.
    #[test]
    fn the_baseline_is_the_warm_ups_highest_sample() {
        let mut series = BTreeMap::new();
        series.insert(
            "agent".to_owned(),
            vec![
                at(0, 30_452, 16, 3),
                at(15, 30_564, 17, 3),
                at(30, 30_672, 13, 3),
                at(45, 30_864, 19, 3),
                at(60, 30_920, 21, 3),
                at(75, 30_928, 17, 3),
            ],
        );
        assert!(check_growth(&series, 30, 0.10).is_empty());
        series.get_mut("agent").unwrap().push(at(90, 30_928, 24, 3));
        let failures = check_growth(&series, 30, 0.10);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].starts_with(
                "agent: fds 24 at 90 s, above 23 (baseline 17, the highest up to 30 s"
            ),
            "{failures:?}"
        );
    }

    #[test]
    fn the_csv_has_one_row_per_process_and_sample() {
        let report = SoakReport {
            pods: 1,
            volume: VolumeMode::Flex,
            lifetime_seconds: 60,
            seconds: 60,
            series: [("zts".to_owned(), vec![at(0, 1, 2, 3), at(60, 4, 5, 6)])].into(),
            rotations_seen: 1,
            expired_reads: 0,
            torn_reads: 0,
            failures: Vec::new(),
            passed: true,
        };
        assert_eq!(
            to_csv(&report),
            "process,at_seconds,rss_kib,fds,threads\nzts,0,1,2,3\nzts,60,4,5,6\n"
        );
    }
}
