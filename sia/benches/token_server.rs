//! `cargo bench -p athenz-sia --bench token_server`: the refresh sidecar's token server as an
//! application meets it, on a whole node (agent, jwt-service, callback, dev ZTS).
//!
//! - memory of `athenz-sia refresh` holding 10 targets' tokens, serving the token server and
//!   metrics (`SIA_BIN` measures another build, e.g. the static one the image ships);
//! - latency of a cached token over loopback with keep-alive, measured by `wrk` (Debian's
//!   `wrk`; skipped with a note when it is missing), p50/p99, next to two floors measured the same
//!   way: the sidecar's own `/healthz`, and a trivial responder (a blocking thread per connection
//!   writing a fixed answer) that no HTTP server can beat on this machine. Each is measured twice:
//!   with the scheduler free to place client and server (on a VM, waking an idle vCPU for every
//!   request dominates the tail, floor included), and with both on one CPU, where what is left is
//!   the server's own work;
//! - 1,000 requests at once for one key not cached: ZTS calls made and the time to answer all.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

// the whole node the end-to-end tests stand up (harness/e2e/tests/node/common)
#[path = "../../harness/e2e/tests/node/common/mod.rs"]
mod common;

use athenz_testbed::zts::DevZtsConfig;
use athenz_testbed::zts::authz::RoleEntry;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const SIA: &str = env!("CARGO_BIN_EXE_athenz-sia");
const TARGETS: usize = 10;

fn status_mib(pid: u32, field: &str) -> f64 {
    athenz_testbed::stats::proc_status_kib(pid, field).unwrap() as f64 / 1024.0
}

/// The CPUs a thread may run on: `cpu` alone, or every CPU of the machine.
fn cpu_set(cpu: Option<usize>) -> CpuSet {
    let mut set = CpuSet::new();
    match cpu {
        Some(cpu) => set.set(cpu).unwrap(),
        None => {
            let all = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..all).for_each(|c| set.set(c).unwrap());
        }
    }
    set
}

/// Places every thread of process `pid` on `cpu` (or lets it run anywhere again).
fn place_process(pid: u32, cpu: Option<usize>) {
    let set = cpu_set(cpu);
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
        sched_setaffinity(Pid::from_raw(tid), &set).unwrap();
    }
}

/// A trivial HTTP responder on loopback: a blocking thread per connection that answers every
/// read with the same 200. What the machine's scheduler and loopback cost, with no HTTP parsing.
fn start_trivial_responder(cpu: Option<usize>) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                sched_setaffinity(Pid::from_raw(0), &cpu_set(cpu)).unwrap();
                let _ = conn.set_nodelay(true);
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if conn.write_all(answer).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// `wrk` over `url` posting `body` (a plain GET without), on `cpu` if given: its report, or why
/// not.
fn wrk(
    url: &str,
    body: Option<&str>,
    connections: usize,
    seconds: u32,
    cpu: Option<usize>,
) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    // util-linux's taskset places wrk before it starts its threads
    let mut cmd = match cpu {
        Some(cpu) => {
            let mut cmd = std::process::Command::new("taskset");
            cmd.args(["-c", &cpu.to_string(), "wrk"]);
            cmd
        }
        None => std::process::Command::new("wrk"),
    };
    cmd.args([
        "-t1",
        &format!("-c{connections}"),
        &format!("-d{seconds}s"),
        "--latency",
    ]);
    if let Some(body) = body {
        let script = dir.path().join("post.lua");
        std::fs::write(
            &script,
            format!(
                "wrk.method = \"POST\"\nwrk.body = '{body}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
            ),
        )
        .unwrap();
        cmd.arg("-s").arg(&script);
    }
    let out = cmd
        .arg(url)
        .output()
        .map_err(|e| format!("wrk not run ({e}); apt-get install wrk"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let roles: Vec<RoleEntry> = (0..TARGETS)
            .map(|i| RoleEntry {
                domain: "media.sports".into(),
                role: format!("r{i}"),
                members: vec!["media.sports.web".into()],
            })
            .chain([RoleEntry {
                domain: "domain.shopping".into(),
                role: "users".into(),
                members: vec!["media.sports.*".into()],
            }])
            .collect();
        let node = common::node_with(
            "p256",
            DevZtsConfig {
                roles,
                max_token_expiry_secs: 86_400,
                ..DevZtsConfig::default()
            },
        )
        .await;
        let targets: Vec<String> = (0..TARGETS).map(|i| format!("media.sports:role.r{i}")).collect();
        let targets = targets.join(",");
        let id = common::pod_with_volume(&node, "web-1", &common::uid(1), "10.3.0.1");
        let out = node.dir.path().join("out");
        let paths = node.volumes.volume(&id);
        let zts_url = format!("https://127.0.0.1:{}/zts/v1", node.zts_proxy.addr.port());
        let port = common::free_port();
        let metrics_port = common::free_port();
        let sia_bin = std::env::var("SIA_BIN").unwrap_or_else(|_| SIA.to_owned());
        println!("token server: {TARGETS} targets, access tokens (SIA binary: {sia_bin})");
        let command = |verb: &str| {
            let mut cmd = std::process::Command::new(&sia_bin);
            cmd.arg(verb)
                .env("ID_FILE", &paths.id_file)
                .env("ENDPOINT", &node.socket)
                .env("OUT_DIR", &out)
                .env("ZTS_URL", &zts_url)
                .env("SERVER_CA_CERT", node.zts.ca_path())
                .env("TARGET_DOMAIN_ROLES", &targets)
                .env("TOKEN_SERVER_ADDR", format!("127.0.0.1:{port}"))
                .env("TOKEN_SERVER_REST_API", "true")
                .env("METRICS_SERVER_ADDR", format!("127.0.0.1:{metrics_port}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            cmd
        };
        let mut init = command("init");
        assert!(tokio::task::spawn_blocking(move || init.status().unwrap()).await.unwrap().success());
        let mut child = command("refresh").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("http://127.0.0.1:{metrics_port}/healthz")).await.is_err() {
            assert!(Instant::now() < deadline, "the sidecar never served");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.unwrap().text().await.unwrap();
        let cached = metrics
            .lines()
            .find_map(|l| l.strip_prefix(r#"cached_token_entries{type="accesstoken"} "#))
            .unwrap_or("?")
            .to_owned();
        println!(
            "  athenz-sia refresh, {cached} tokens cached, token server + metrics: VmRSS {:.1} MiB (anonymous {:.1} MiB), peak VmHWM {:.1} MiB",
            status_mib(child.id(), "VmRSS:"),
            status_mib(child.id(), "RssAnon:"),
            status_mib(child.id(), "VmHWM:")
        );

        let url = format!("http://127.0.0.1:{port}/accesstoken");
        let healthz = format!("http://127.0.0.1:{metrics_port}/healthz");
        let cached_body = r#"{"domain":"media.sports","role":"r0"}"#;
        const ONE_CPU: Option<usize> = Some(0);
        let trivial = |cpu| format!("http://{}/", start_trivial_responder(cpu));
        let runs = [
            ("any CPU", None, "floor: trivial responder", trivial(None), None, 1usize),
            ("any CPU", None, "floor: GET /healthz of the sidecar", healthz.clone(), None, 1),
            ("any CPU", None, "cached token", url.clone(), Some(cached_body), 1),
            ("any CPU", None, "cached token", url.clone(), Some(cached_body), 10),
            ("one CPU", ONE_CPU, "floor: trivial responder", trivial(ONE_CPU), None, 1),
            ("one CPU", ONE_CPU, "floor: GET /healthz of the sidecar", healthz.clone(), None, 1),
            ("one CPU", ONE_CPU, "cached token", url.clone(), Some(cached_body), 1),
            ("one CPU", ONE_CPU, "cached token", url.clone(), Some(cached_body), 10),
        ];
        for (placement, cpu, what, target, body, connections) in runs {
            place_process(child.id(), cpu);
            match tokio::task::spawn_blocking(move || wrk(&target, body, connections, 10, cpu))
                .await
                .unwrap()
            {
                Ok(report) => {
                    let pick = |prefix: &str| {
                        report
                            .lines()
                            .find(|l| l.trim_start().starts_with(prefix))
                            .map(|l| l.split_whitespace().last().unwrap_or("?").to_owned())
                            .unwrap_or_else(|| "?".into())
                    };
                    let rate = report
                        .lines()
                        .find(|l| l.starts_with("Requests/sec:"))
                        .map(|l| l.trim_start_matches("Requests/sec:").trim().to_owned())
                        .unwrap_or_default();
                    println!(
                        "  {placement}: {what}, wrk keep-alive, {connections} connection(s), 10 s: p50 {}, p90 {}, p99 {}; {rate} requests/s",
                        pick("50%"),
                        pick("90%"),
                        pick("99%")
                    );
                }
                Err(why) => println!("  cached token latency: {why}"),
            }
        }
        place_process(child.id(), None);
        println!(
            "  after the wrk runs: VmRSS {:.1} MiB, peak VmHWM {:.1} MiB",
            status_mib(child.id(), "VmRSS:"),
            status_mib(child.id(), "VmHWM:")
        );

        // 1,000 at once for one key nobody asked for yet
        let client = reqwest::Client::builder().http1_only().build().unwrap();
        let before = node.zts.requests("oauth2_token");
        let started = Instant::now();
        let answers: Vec<_> = (0..1000)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move {
                    client
                        .post(url)
                        .body(r#"{"domain":"domain.shopping","role":"users","expiry":5555}"#)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                })
            })
            .collect();
        let mut ok = 0;
        for a in answers {
            if matches!(a.await.unwrap(), Ok(200)) {
                ok += 1;
            }
        }
        println!(
            "  1000 concurrent requests for one uncached key: {ok} answered 200 in {:.0} ms with {} ZTS call(s)",
            started.elapsed().as_secs_f64() * 1e3,
            node.zts.requests("oauth2_token") - before
        );
        println!(
            "  after them: VmRSS {:.1} MiB, peak VmHWM {:.1} MiB",
            status_mib(child.id(), "VmRSS:"),
            status_mib(child.id(), "VmHWM:")
        );
        let _ = child.kill();
        let _ = child.wait();
    });
}
