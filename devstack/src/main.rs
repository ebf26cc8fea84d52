//! `athenz-devstack`: see the library docs and `--help`.

// A command-line tool: printing reports is its job (the workspace forbids it in the components).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod cli;

use athenz_devstack::{bench, chaos, cluster, demo, kube, load, multicall, soak, stack, userns};
use cli::{Cli, ClusterCommand, Command};

use anyhow::Context;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Some(code) = multicall::dispatch() {
        return code;
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("athenz-devstack: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// The runtime of a stand-in server (ZTS, the Kubernetes API and kubelet): the daemons' own
/// ([`athenz_core::daemon::server_runtime`]), seeded at start. The servers they stand in for run
/// for months; unseeded, their first-use seeding landed in the first identities a bench measured
/// (a flex arrival run's SIA p99 was 57.5 ms with it, 14.6–23.4 ms without).
fn stand_in_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    athenz_core::daemon::server_runtime().context("starting the runtime")
}

/// What a command that runs a stack gets first: this process, privileged (or the exit code of
/// its privileged re-run in a user namespace), and a temporary state dir.
enum Prepared {
    /// Go on here, with this state dir.
    Here(tempfile::TempDir),
    /// The command ran in a privileged re-run, which exited with this code.
    ReRan(ExitCode),
}

/// [`Prepared`] for a command whose temporary directories start with `prefix`.
fn prepare(prefix: &str) -> anyhow::Result<Prepared> {
    if let Some(code) = userns::ensure_privileged()? {
        return Ok(Prepared::ReRan(code));
    }
    let temp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")?;
    Ok(Prepared::Here(temp))
}

/// The options of a cluster command that installs `release` (checked, or built, first) on a
/// node with the default address and name.
fn with_release(
    args: crate::cli::ReleaseArgs,
    deploy: Option<std::path::PathBuf>,
) -> anyhow::Result<cluster::ClusterOptions> {
    let release = cluster::install::Release::new(args.image_archive, deploy);
    release.check()?;
    Ok(cluster::ClusterOptions {
        state_dir: args.state_dir,
        kube_bin: args.kube_bin.unwrap_or_else(cluster::default_kube_bin),
        node_ip: None,
        node_name: None,
        release: Some(release),
    })
}

/// Prints `report` as JSON, or for people with `human`.
fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    human: impl FnOnce(&T),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        human(report);
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Zts {
            state_dir,
            config,
            faults_file,
        } => {
            let _ = athenz_core::telemetry::init_logging(athenz_core::telemetry::LogFormat::Human);
            let config = match config {
                Some(path) => athenz_testbed::zts::DevZtsConfig::from_file(&path)?,
                None => athenz_testbed::zts::DevZtsConfig::default(),
            };
            stand_in_runtime()?.block_on(athenz_testbed::zts::run_standalone(
                config,
                &state_dir,
                faults_file,
                athenz_core::http::termination_signal(),
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::KubeStandins {
            state_dir,
            api_listen,
            node,
            faults_file,
        } => {
            stand_in_runtime()?.block_on(kube::run_standins(
                &state_dir,
                api_listen,
                &node,
                faults_file,
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Cluster { command } => {
            match command {
                ClusterCommand::Up {
                    state_dir,
                    bare,
                    image_archive,
                    deploy,
                    cert_minutes,
                    installer,
                    steps,
                    kube_bin,
                    node_ip,
                    node_name,
                } => {
                    let release = (!bare).then(|| cluster::install::Release {
                        cert_minutes,
                        installer,
                        steps_page: steps,
                        ..cluster::install::Release::new(image_archive, deploy)
                    });
                    if let Some(release) = &release {
                        release.check()?;
                    }
                    let options = cluster::ClusterOptions {
                        state_dir,
                        kube_bin: kube_bin.unwrap_or_else(cluster::default_kube_bin),
                        node_ip,
                        node_name,
                        release,
                    };
                    runtime()?.block_on(cluster::up(options))?;
                }
                ClusterCommand::Demo {
                    release,
                    deploy,
                    json,
                } => {
                    let options = with_release(release, deploy)?;
                    if !runtime()?.block_on(cluster::demo(options, json))? {
                        return Ok(ExitCode::FAILURE);
                    }
                }
                ClusterCommand::Bench {
                    release,
                    sequential,
                    interval,
                    burst,
                    churn,
                    churn_interval,
                    churn_lifetime,
                    systems,
                    json,
                } => {
                    let options = with_release(release, None)?;
                    let bench = cluster::bench::BenchOptions {
                        sequential,
                        interval,
                        burst,
                        churn: cluster::bench::Churn {
                            duration: churn,
                            interval: churn_interval,
                            lifetime: churn_lifetime,
                        },
                        systems: cluster::bench::Systems {
                            athenz: systems.contains(&crate::cli::BenchSystem::Athenz),
                            spire: systems.contains(&crate::cli::BenchSystem::Spire),
                        },
                    };
                    runtime()?.block_on(cluster::bench_command(options, bench, json))?;
                }
                ClusterCommand::StorageE2e {
                    release,
                    e2e_test,
                    report_dir,
                } => {
                    let options = with_release(release, None)?;
                    let e2e_test = e2e_test.unwrap_or_else(cluster::storage_e2e::default_e2e_test);
                    if !runtime()?.block_on(cluster::storage_e2e::storage_e2e(
                        options, e2e_test, report_dir,
                    ))? {
                        return Ok(ExitCode::FAILURE);
                    }
                }
                ClusterCommand::Down { state_dir } => {
                    runtime()?.block_on(cluster::down(&state_dir))?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::PodApp { credentials_dir } => {
            let report = athenz_devstack::identity::check(&credentials_dir)?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::PodRefreshOnce {
            socket,
            volume_dir,
            credentials_dir,
            key_source,
        } => {
            let answer = runtime()?.block_on(athenz_devstack::node::pod_refresh_once(
                &socket,
                &volume_dir,
                &credentials_dir,
                key_source,
            ))?;
            println!("{}", serde_json::to_string(&answer)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            json,
            state_dir,
            volume,
            key_source,
            runtime: pod_runtime,
        } => {
            let temp = match prepare("athenz-devstack-")? {
                Prepared::Here(temp) => temp,
                Prepared::ReRan(code) => return Ok(code),
            };
            let dir = state_dir.unwrap_or_else(|| temp.path().to_owned());
            let mut print = |line: String| {
                if !json {
                    println!("{line}");
                }
            };
            let report = runtime()?.block_on(demo::run(
                &dir,
                volume,
                key_source,
                pod_runtime,
                &mut print,
            ))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "\ndemo complete in {:.1} s: 3 identities issued and verified, 1 refreshed, \
                     1 refused after delete, 1 refused across nodes, 3 volumes unmounted",
                    report.seconds
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Up {
            state_dir,
            key,
            components,
            nodes,
            peer_check,
            volume,
            fault_injection,
            key_source,
            runtime: pod_runtime,
        } => {
            if let Some(code) = userns::ensure_privileged()? {
                return Ok(code);
            }
            if nodes == 0 {
                anyhow::bail!("--nodes must be at least 1");
            }
            let options = stack::StackOptions {
                components,
                nodes,
                peer_check,
                volume,
                fault_injection,
                key_source,
                runtime: pod_runtime,
                ..stack::StackOptions::new(state_dir, &key)
            };
            runtime()?.block_on(up(options))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chaos {
            pods,
            files_pods,
            lifetime_minutes,
            faults,
            sia_kills,
            components,
            key_source,
            runtime: pod_runtime,
            upgrade_to,
            json,
        } => {
            let temp = match prepare("athenz-devstack-chaos-")? {
                Prepared::Here(temp) => temp,
                Prepared::ReRan(code) => return Ok(code),
            };
            let options = chaos::ChaosOptions {
                pods,
                files_pods,
                lifetime_minutes,
                faults: if faults.is_empty() {
                    chaos::default_faults(pod_runtime)
                } else {
                    faults
                },
                sia_kills,
                components,
                key_source,
                runtime: pod_runtime,
                upgrade_to,
            };
            let report = runtime()?.block_on(chaos::run(temp.path(), &options))?;
            print_report(json, &report, chaos::print_human)?;
            Ok(if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Load {
            nodes,
            pods_per_node,
            rate,
            seconds,
            lifetime_minutes,
            components,
            json,
        } => {
            let temp = match prepare("athenz-devstack-load-")? {
                Prepared::Here(temp) => temp,
                Prepared::ReRan(code) => return Ok(code),
            };
            let options = load::LoadOptions {
                nodes,
                pods_per_node,
                rate,
                seconds,
                components,
                lifetime_minutes,
            };
            let report = runtime()?.block_on(load::run(temp.path(), &options))?;
            print_report(json, &report, load::print_human)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Soak {
            duration,
            pods,
            lifetime_minutes,
            sample,
            warmup,
            growth_percent,
            volume,
            components,
            csv,
            json,
        } => {
            let temp = match prepare("athenz-devstack-soak-")? {
                Prepared::Here(temp) => temp,
                Prepared::ReRan(code) => return Ok(code),
            };
            let options = soak::SoakOptions {
                duration,
                pods,
                lifetime_minutes,
                sample,
                warmup,
                growth: growth_percent / 100.0,
                volume,
                components,
                csv,
            };
            let report = runtime()?.block_on(soak::run(temp.path(), &options))?;
            print_report(json, &report, soak::print_human)?;
            Ok(if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Bench {
            pods,
            concurrency,
            key,
            json,
            components,
            peer_check,
            arrival,
            pod_size,
            volume,
            key_source,
            runtime: pod_runtime,
        } => {
            let temp = match prepare("athenz-devstack-bench-")? {
                Prepared::Here(temp) => temp,
                Prepared::ReRan(code) => return Ok(code),
            };
            let options = bench::BenchOptions {
                pods,
                concurrency,
                key,
                components,
                peer_check,
                arrival,
                pod_size,
                volumes: volume,
                key_sources: key_source,
                runtime: pod_runtime,
            };
            let reports = runtime()?.block_on(bench::run(temp.path(), &options))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                for report in &reports {
                    bench::print_human(report);
                    println!();
                }
                if reports.len() > 1 {
                    bench::print_comparison(&reports);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `up`: start, describe, supervise until Ctrl-C or SIGTERM, stop.
async fn up(options: stack::StackOptions) -> anyhow::Result<()> {
    let mut stack = stack::Stack::start(&options).await?;
    let info = &stack.info;
    println!(
        "athenz-devstack is up; stack.json: {}",
        stack.state_dir.join("stack.json").display()
    );
    println!(
        "  dev ZTS          {}  (CA {})",
        info.zts.url,
        info.zts.ca.display()
    );
    println!("  Kubernetes API   {}", info.kube_api.url);
    println!("  kubelet          {}", info.kubelet.url);
    println!("  jwt-service      {}", info.jwt_service.url);
    println!(
        "  callback         {}{}",
        info.callback.url, info.callback.base_path
    );
    println!("  initializer      {}/mutate", info.initializer.url);
    println!(
        "  agent            {}  (metrics {})",
        info.agent.socket.display(),
        info.agent.metrics_url
    );
    println!(
        "  volume driver    ATHENZ_VOLUMES_DIR={} ATHENZ_AGENT_DIR={} {}",
        info.volumes_dir.display(),
        info.agent_dir.display(),
        info.volume_driver.join(" ")
    );
    println!("  pod SIA          {}", info.sia.join(" "));
    println!(
        "  pods run by      {} ({})",
        info.runtime.kind, info.runtime.reason
    );
    for node in &info.nodes {
        println!(
            "  node {:<11} kubelet {}  agent {}",
            node.name,
            node.kubelet.url,
            node.agent.socket.display()
        );
    }
    println!(
        "  peer check       {} (pod cgroups under {})",
        info.peer_check,
        info.pod_cgroup_root
            .as_ref()
            .map_or_else(|| "none".to_owned(), |p| p.display().to_string())
    );
    println!(
        "  logs             {}",
        stack.state_dir.join("logs").display()
    );
    println!("Ctrl-C to stop.");
    let stop = athenz_core::http::termination_signal();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = tick.tick() => {
                for name in stack.restart_exited()? {
                    eprintln!("{name} exited; restarted it");
                }
            }
        }
    }
    println!("stopping");
    stack.stop().await;
    Ok(())
}
