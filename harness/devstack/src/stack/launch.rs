//! How the stack starts a component: its path arguments (`--flag=<path>`) and, for a daemon,
//! the wait for its `/readyz` before anything that needs it starts.

use crate::procs::{Command, Process};
use std::path::Path;

/// `--<flag>=<path>`.
pub(super) fn path_arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
}

/// Starts a daemon component from `bin` and waits for its `/readyz`.
pub(super) async fn run_daemon(
    bin: &Path,
    name: &str,
    binary: &str,
    args: Vec<String>,
    ops_port: u16,
    logs: &Path,
) -> anyhow::Result<Process> {
    let mut process = Process::start(Command::new(name, &bin.join(binary), args), logs)?;
    process
        .wait_http_ok(&format!("http://127.0.0.1:{ops_port}/readyz"))
        .await?;
    Ok(process)
}
