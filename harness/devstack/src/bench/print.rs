//! The bench's report as text: one run, and several runs side by side.

use super::{AGENT, BenchReport, CALLBACK, Latency, SIA};

/// The report as a person reads it: the run and its latencies, each process's CPU and memory,
/// and the CPU spent per identity against the cryptography no implementation avoids.
pub fn print_human(report: &BenchReport) {
    print_latency(report);
    print_processes(report);
    print_cost(report);
}

/// What ran, its latencies (the whole mount to files written, then each part of it) and its
/// throughput.
fn print_latency(report: &BenchReport) {
    let l = &report.latency_ms;
    let arrival = if report.arrival_ms > 0.0 {
        format!("one pod every {:.0} ms", report.arrival_ms)
    } else {
        format!("all existing first, concurrency {}", report.concurrency)
    };
    println!(
        "{} volume: {} {:?} pods run by {}, {arrival}, {} keys made by the {}, peer check {}",
        report.volume.name(),
        report.pods,
        report.pod_size,
        report.runtime,
        report.key,
        report.key_source,
        report.peer_check
    );
    println!(
        "latency mount -> files written: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        l.p50, l.p90, l.p99, l.max
    );
    let parts = &report.latency_parts_ms;
    let part = |name: &str, l: &Latency| {
        println!(
            "  {name:<44} p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms",
            l.p50, l.p90, l.p99
        );
    };
    part("mount (driver / NodePublishVolume)", &parts.mount);
    if let Some(sia) = &parts.sia {
        part("athenz-sia init, as it reports (agent incl.)", sia);
    }
    if let Some(start) = &parts.sia_process_start {
        part("SIA process start and pod placement", start);
    }
    part("this system's part: mount + SIA init", &parts.product);
    if let Some(runtime) = &parts.runtime {
        let name = match report.runtime {
            athenz_testbed::runtime::RuntimeKind::Process => {
                "the stand-in runtime's part: start, placement".to_owned()
            }
            kind => format!("{kind}'s part: sandbox, create + start"),
        };
        part(&name, runtime);
    }
    if !report.agent_upstreams.is_empty() {
        let calls: Vec<String> = report
            .agent_upstreams
            .iter()
            .map(|(u, c)| format!("{u} {} x {:.2} ms", c.calls, c.mean_ms))
            .collect();
        println!("  the agent's upstream calls (mean): {}", calls.join(", "));
    }
    println!(
        "all {} identities in {:.3} s: {:.0} identities/s",
        report.pods, report.wall_seconds, report.throughput_per_second
    );
}

/// Each long-running process's CPU seconds and memory, then the short-lived ones together.
fn print_processes(report: &BenchReport) {
    println!(
        "{:<34} {:>10} {:>14} {:>10}",
        "process", "CPU s", "peak RSS MiB", "RSS MiB"
    );
    let mib = |m: Option<f64>| m.map_or_else(|| "-".to_owned(), |m| format!("{m:.1}"));
    for p in report
        .processes
        .iter()
        .chain(std::iter::once(&report.short_lived))
    {
        println!(
            "{:<34} {:>10.3} {:>14} {:>10}",
            p.name,
            p.cpu_seconds,
            mib(p.peak_rss_mib),
            mib(p.rss_mib)
        );
    }
}

/// The cryptography each identity needs, and each daemon's CPU per identity against it.
fn print_cost(report: &BenchReport) {
    println!("unavoidable cryptography per identity:");
    for s in &report.crypto_floor.steps {
        println!("  {:<12} {:<44} {:>9.1} us", s.part, s.step, s.us);
    }
    println!("daemon CPU per identity against its own cryptography:");
    for d in &report.daemons {
        // The dev ZTS opens a new mutual-TLS connection for every confirmation, as real ZTS
        // does (a provider client per request), so the callback's figure includes a full
        // server-side handshake per identity.
        let name = if d.name == CALLBACK {
            "callback (a confirmation, new mTLS each)"
        } else {
            d.name.as_str()
        };
        println!(
            "  {:<36} {:>7.3} ms / {:>6.3} ms = {:.1}x",
            name, d.cpu_per_identity_ms, d.floor_ms, d.ratio
        );
    }
    let sia_floor_ms = report.crypto_floor.of(SIA);
    if sia_floor_ms > 0.0 {
        println!(
            "  {:<36} {:>7.3} ms / {:>6.3} ms = {:.1}x",
            "per-pod processes (the pod's key, CSR)",
            report.per_pod_process_ms,
            sia_floor_ms,
            report.per_pod_process_ms / sia_floor_ms
        );
    } else {
        println!(
            "  per-pod processes (no cryptography)  {:>7.3} ms per pod",
            report.per_pod_process_ms
        );
    }
    for s in [&report.system, &report.node] {
        println!(
            "  {:<36} {:>7.3} ms / {:>6.3} ms = {:.1}x",
            s.name, s.cpu_per_identity_ms, s.floor_ms, s.ratio
        );
    }
    println!(
        "  unmount when the pod goes (not above)   {:>7.3} ms per pod on the node (agent {:.3}, processes {:.3})",
        report.unmount.node_ms(),
        report.unmount.agent_ms,
        report.unmount.per_pod_process_ms
    );
    println!(
        "all CPU per identity {:.2} ms (stand-ins included); crypto floor {:.3} ms; ratio {:.1}x",
        report.cpu_per_identity_ms, report.crypto_floor.total_ms, report.cpu_to_floor_ratio
    );
}

/// The volume kinds of one run side by side.
pub fn print_comparison(reports: &[BenchReport]) {
    println!(
        "{:<11} {:<6} {:<8} {:>9} {:>9} {:>9} {:>10} {:>16} {:>14} {:>14} {:>14} {:>15} {:>15}",
        "volume",
        "keys",
        "runtime",
        "p50 ms",
        "p99 ms",
        "max ms",
        "all s",
        "system CPU/id ms",
        "x its crypto",
        "node CPU/id ms",
        "x the crypto",
        "unmount ms/pod",
        "agent RSS MiB"
    );
    for r in reports {
        let agent_rss = r
            .processes
            .iter()
            .find(|p| p.name == AGENT)
            .and_then(|p| p.peak_rss_mib)
            .unwrap_or(f64::NAN);
        println!(
            "{:<11} {:<6} {:<8} {:>9.1} {:>9.1} {:>9.1} {:>10.3} {:>16.3} {:>14.1} {:>14.3} {:>14.1} {:>15.3} {:>15.1}",
            r.volume.name(),
            r.key_source.as_str(),
            r.runtime.as_str(),
            r.latency_ms.p50,
            r.latency_ms.p99,
            r.latency_ms.max,
            r.wall_seconds,
            r.system.cpu_per_identity_ms,
            r.system.ratio,
            r.node.cpu_per_identity_ms,
            r.node.ratio,
            r.unmount.node_ms(),
            agent_rss
        );
    }
}
