//! `cargo bench -p athenz-sia`: the node path with every component.
//!
//! - init latency through the agent (agent → kubelet → jwt-service → key + CSR → ZTS → callback →
//!   Kubernetes API → certificate), P-256 and RSA-2048, p50 and p99;
//! - the agent's memory as its own process after 110 volumes are initialised (VmRSS and VmHWM);
//! - `athenz-sia refresh`'s memory as a process (VmRSS and VmHWM).
//!
//! The agent process is this benchmark binary re-executed with `--agent-role` (it carries the
//! agent library), so the figures are those of the agent alone.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

// the whole node the end-to-end tests stand up (harness/e2e/tests/node/common)
#[path = "../../harness/e2e/tests/node/common/mod.rs"]
mod common;

use athenz_sia::client::AgentClient;
use athenz_testbed::stats::percentile;
use clap::Parser;
use std::time::{Duration, Instant};

const SIA: &str = env!("CARGO_BIN_EXE_athenz-sia");

fn status_kib(pid: u32, field: &str) -> u64 {
    athenz_testbed::stats::proc_status_kib(pid, field).unwrap()
}

fn agent_role() {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let config = athenz_identity_agent::Config::try_parse_from(
        std::iter::once("athenz-identity-agent".to_owned()).chain(args),
    )
    .unwrap();
    athenz_core::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_, task) = athenz_identity_agent::start(config, athenz_core::daemon::Shutdown::new())
            .await
            .unwrap();
        let _ = task.await;
    });
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--agent-role") {
        agent_role();
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("node path: agent + kubelet + jwt-service + dev ZTS + callback + API stand-in, all on this machine");
        for (alg, n) in [("p256", 300usize), ("rsa2048", 60)] {
            let node = common::node(alg).await;
            let ids: Vec<_> = (0..n)
                .map(|i| common::pod_with_volume(&node, &format!("pod-{i}"), &common::uid(i), &format!("10.{}.{}.{}", 1 + i / 65_000, (i / 250) % 250, 1 + i % 250)))
                .collect();
            // warm up connections
            AgentClient::new(node.socket.clone(), ids[0].clone(), Duration::from_secs(30)).init().await.unwrap();
            let mut lat = Vec::new();
            for id in &ids[1..] {
                let c = AgentClient::new(node.socket.clone(), id.clone(), Duration::from_secs(30));
                let t = Instant::now();
                c.init().await.unwrap();
                lat.push(t.elapsed());
            }
            lat.sort();
            println!(
                "  init {alg:<8} p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms ({} sequential inits)",
                percentile(&lat, 0.5).as_secs_f64() * 1e3,
                percentile(&lat, 0.9).as_secs_f64() * 1e3,
                percentile(&lat, 0.99).as_secs_f64() * 1e3,
                lat.len()
            );
        }

        // the agent as its own process, 110 volumes
        let node = common::node("p256").await;
        let dir = tempfile::tempdir().unwrap();
        let agent_dir = dir.path().join("agent");
        let volumes_dir = dir.path().join("volumes");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--agent-role")
            .arg(format!("--agent-dir={}", agent_dir.display()))
            .arg(format!("--volumes-dir={}", volumes_dir.display()))
            .args(&node.agent_args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let socket = agent_dir.join("agent.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the agent process did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let idle = status_kib(child.id(), "VmRSS:");
        let volumes = athenz_core::volume::VolumesDir::new(&volumes_dir);
        for i in 0..110 {
            let uid = common::uid(10_000 + i);
            let name = format!("p-{i}");
            node.kube.cluster().put_pod(athenz_testbed::kube_api::running_pod(
                athenz_testbed::fixtures::NAMESPACE,
                &name,
                &uid,
                athenz_testbed::fixtures::SERVICE,
                &format!("10.9.{}.{}", i / 200, 1 + i % 200),
                common::NODE,
            ));
            let id = common::volume_in(&volumes, &name, &uid);
            init_when_ready(&AgentClient::new(socket.clone(), id, Duration::from_secs(30))).await;
        }
        println!(
            "  agent process: VmRSS {:.1} MiB idle, {:.1} MiB after 110 inits (peak VmHWM {:.1} MiB)",
            idle as f64 / 1024.0,
            status_kib(child.id(), "VmRSS:") as f64 / 1024.0,
            status_kib(child.id(), "VmHWM:") as f64 / 1024.0
        );
        let _ = child.kill();
        let _ = child.wait();

        // athenz-sia refresh as a process
        let id = common::pod_with_volume(&node, "sia-pod", &common::uid(50_000), "10.8.0.1");
        let out = node.dir.path().join("sia-out");
        let paths = node.volumes.volume(&id);
        let env = |cmd: &mut std::process::Command| {
            cmd.env("ID_FILE", &paths.id_file)
                .env("ENDPOINT", &node.socket)
                .env("OUT_DIR", &out)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
        };
        // SIA_BIN measures another build of the SIA (e.g. the static one the image ships)
        let sia_bin = std::env::var("SIA_BIN").unwrap_or_else(|_| SIA.to_owned());
        println!("  (SIA binary: {sia_bin})");
        let mut init = std::process::Command::new(&sia_bin);
        init.arg("init");
        env(&mut init);
        assert!(tokio::task::spawn_blocking(move || init.status().unwrap()).await.unwrap().success());
        let mut refresh = std::process::Command::new(&sia_bin);
        refresh.arg("refresh").env("REFRESH_INTERVAL", "1s");
        env(&mut refresh);
        let mut child = refresh.spawn().unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        println!(
            "  athenz-sia refresh process: VmRSS {:.1} MiB (anonymous {:.1} MiB, file-backed {:.1} MiB), peak VmHWM {:.1} MiB (after ~3 refreshes)",
            status_kib(child.id(), "VmRSS:") as f64 / 1024.0,
            status_kib(child.id(), "RssAnon:") as f64 / 1024.0,
            status_kib(child.id(), "RssFile:") as f64 / 1024.0,
            status_kib(child.id(), "VmHWM:") as f64 / 1024.0
        );
        let _ = child.kill();
        let _ = child.wait();

        // athenz-sia refresh serving SDS: memory with 10 streams, push latency on 100
        let sds_socket = node.dir.path().join("sds/sds.sock");
        let sds_process = |streams: usize| {
            let mut refresh = std::process::Command::new(&sia_bin);
            refresh
                .arg("refresh")
                .env("REFRESH_INTERVAL", "1s")
                .env("SDS_SOCKET", &sds_socket);
            env(&mut refresh);
            let child = refresh.spawn().unwrap();
            println!("  ({streams} SDS streams, a rotation a second)");
            child
        };
        for streams in [10usize, 100] {
            // the socket of the previous run (killed) is stale: wait for this run's own
            let _ = std::fs::remove_file(&sds_socket);
            let mut child = sds_process(streams);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !sds_socket.exists() {
                assert!(Instant::now() < deadline, "no SDS socket");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let latencies = sds_push_latencies(&sds_socket, &out, streams, 5).await;
            println!(
                "  athenz-sia refresh with SDS, {streams} streams: VmRSS {:.1} MiB, peak VmHWM {:.1} MiB; push after the files swap p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} pushes)",
                status_kib(child.id(), "VmRSS:") as f64 / 1024.0,
                status_kib(child.id(), "VmHWM:") as f64 / 1024.0,
                percentile(&latencies, 0.5).as_secs_f64() * 1e3,
                percentile(&latencies, 0.99).as_secs_f64() * 1e3,
                latencies.last().unwrap().as_secs_f64() * 1e3,
                latencies.len()
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    });
}

/// `init`, retried while the agent answers "try again" (a fresh agent process serves its socket
/// before it holds its node identity).
async fn init_when_ready(client: &AgentClient) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.init().await {
            Ok(_) => return,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("init: {e}"),
        }
    }
}

/// Opens `streams` SDS streams and, over `rotations` rotations, how long after the new set
/// appears on disk (polled every 0.5 ms) each stream receives it.
async fn sds_push_latencies(
    socket: &std::path::Path,
    out: &std::path::Path,
    streams: usize,
    rotations: usize,
) -> Vec<Duration> {
    use athenz_testbed::sds_client::{SdsStream, connect, request};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let seen_on_disk: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watcher = {
        let (seen, set) = (
            Arc::clone(&seen_on_disk),
            athenz_core::files::FileSet::new(out),
        );
        tokio::spawn(async move {
            loop {
                if let Ok(files) = set.read(&[athenz_core::files::CERT_FILE]) {
                    let pem = String::from_utf8(files[0].clone()).unwrap();
                    let serial = athenz_core::crypto::CertInfo::from_pem(&pem)
                        .unwrap()
                        .serial_hex;
                    seen.lock()
                        .unwrap()
                        .entry(serial)
                        .or_insert_with(Instant::now);
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        })
    };
    let mut client = connect(socket).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let mut stream = SdsStream::open(&mut client, request(&["default", "ROOTCA"], None, None))
            .await
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let mut received = Vec::new();
            let first = stream.next().await.unwrap().unwrap();
            stream
                .send(request(&["default", "ROOTCA"], Some(&first), None))
                .await
                .unwrap();
            for _ in 0..rotations {
                let push = stream.next().await.unwrap().unwrap();
                received.push((push.version_info.clone(), Instant::now()));
                stream
                    .send(request(&["default", "ROOTCA"], Some(&push), None))
                    .await
                    .unwrap();
            }
            received
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        for (version, at) in task.await.unwrap() {
            let on_disk = seen_on_disk.lock().unwrap().get(&version).copied();
            // a push that beat the 0.5 ms poll to the new files counts as 0
            latencies.push(on_disk.map_or(Duration::ZERO, |d| at.saturating_duration_since(d)));
        }
    }
    watcher.abort();
    latencies.sort();
    latencies
}
