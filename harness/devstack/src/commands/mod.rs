//! One module per command (or group of commands): each takes its clap arguments as they are
//! parsed and runs the command. What they share is here: the async runtimes, the privileged
//! re-run with a temporary state dir, and printing a report.

pub mod bench;
pub mod chaos;
pub mod cluster;
pub mod demo;
pub mod load;
pub mod pod;
pub mod soak;
pub mod stand_ins;
pub mod up;

use anyhow::Context;
use athenz_devstack::userns;
use std::path::Path;
use std::process::ExitCode;

/// The runtime a command's async work runs on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// The runtime of a stand-in server (ZTS, the Kubernetes API and kubelet): the daemons' own
/// ([`athenz_core::daemon::server_runtime`]), seeded at start. The servers they stand in for run
/// for months; unseeded, their first-use seeding landed in the first identities a bench measured
/// (a flex arrival run's SIA p99 was 57.5 ms with it, 14.6–23.4 ms without).
pub fn stand_in_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    athenz_core::daemon::server_runtime().context("starting the runtime")
}

/// Runs `command`, which runs a stack, privileged with a temporary state dir whose name starts
/// with `prefix` (removed afterwards); or, where this process is not privileged, re-runs the
/// whole command line privileged in a user namespace and returns that run's exit code.
pub fn privileged_in_temp_dir(
    prefix: &str,
    command: impl FnOnce(&Path) -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    if let Some(code) = userns::ensure_privileged()? {
        return Ok(code);
    }
    let temp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")?;
    command(temp.path())
}

/// Prints `report` as JSON, or for people with `human`.
pub fn print_report<T: serde::Serialize>(
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

/// Success when every bound held, else failure (what `chaos` and `soak` exit with).
pub fn passed_or_failed(passed: bool) -> ExitCode {
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
