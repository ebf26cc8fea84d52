//! `cargo bench -p athenz-volume-driver`: wall time of `mount` and `unmount` as processes, exactly
//! as kubelet runs them (exec, real bind mounts, exit), median and p99 over 300 runs each.
//! Needs root.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const DRIVER: &str = env!("CARGO_BIN_EXE_athenz-volume-driver");
const RUNS: usize = 300;

fn run(volumes: &Path, agent: &Path, args: &[&str]) -> Duration {
    let started = Instant::now();
    let out = Command::new(DRIVER)
        .args(args)
        .env("ATHENZ_VOLUMES_DIR", volumes)
        .env("ATHENZ_AGENT_DIR", agent)
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"status\":\"Success\"}\n",
        "{args:?}"
    );
    elapsed
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |p: f64| athenz_testbed::stats::percentile(&times, p);
    println!(
        "  {what:<9} median {:.2} ms, p90 {:.2} ms, p99 {:.2} ms ({} runs)",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        times.len()
    );
}

fn main() {
    let is_root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !is_root {
        println!("the driver benchmark makes real bind mounts: run it as root");
        std::process::exit(1);
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let volumes = root.join("volumes");
    let agent = root.join("agent");
    std::fs::create_dir(&agent).unwrap();
    let options = r#"{"kubernetes.io/fsType":"","kubernetes.io/readwrite":"ro","kubernetes.io/pvOrVolumeName":"athenz-identity","kubernetes.io/pod.name":"web-7d9f","kubernetes.io/pod.namespace":"media-sports","kubernetes.io/pod.uid":"0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c","kubernetes.io/serviceAccount.name":"web"}"#;
    let dirs: Vec<String> = (0..RUNS)
        .map(|n| {
            let d = root.join(format!(
                "pods/{n}/volumes/athenz~volume-driver/athenz-identity"
            ));
            std::fs::create_dir_all(&d).unwrap();
            d.to_str().unwrap().to_owned()
        })
        .collect();
    // the first mount creates the node key; keep it out of the figures
    run(&volumes, &agent, &["mount", &dirs[0], options]);
    run(&volumes, &agent, &["unmount", &dirs[0]]);

    let mounts: Vec<Duration> = dirs
        .iter()
        .map(|d| run(&volumes, &agent, &["mount", d, options]))
        .collect();
    let unmounts: Vec<Duration> = dirs
        .iter()
        .map(|d| run(&volumes, &agent, &["unmount", d]))
        .collect();
    // the floor: what spawning any process and waiting for it costs here
    let floor: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            Command::new("/bin/true").output().unwrap();
            started.elapsed()
        })
        .collect();
    println!("athenz-volume-driver as a process (exec + work + exit), release build");
    report("/bin/true", floor);
    report("mount", mounts);
    report("unmount", unmounts);
    let size = std::fs::metadata(DRIVER).map(|m| m.len()).unwrap_or(0);
    println!(
        "  binary   {DRIVER}: {:.1} MB (this build; see docs/binaries/athenz-volume-driver.md for the static one)",
        size as f64 / 1e6
    );
}
