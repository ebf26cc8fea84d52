//! `athenz-devstack`: see the library docs and `--help`.

// A command-line tool: printing reports is its job (the workspace forbids it in the components).
#![allow(clippy::print_stdout, clippy::print_stderr)]
// A binary, not a library: an item has a doc where it says something, not to satisfy the lint.
#![allow(missing_docs)]

mod cli;
mod commands;

use athenz_devstack::multicall;
use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Some(code) = multicall::dispatch() {
        return code;
    }
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("athenz-devstack: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Each command to the module that runs it.
fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Up(args) => commands::up::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Load(args) => commands::load::run(args),
        Command::Soak(args) => commands::soak::run(args),
        Command::Chaos(args) => commands::chaos::run(args),
        Command::Cluster { command } => commands::cluster::run(command),
        Command::Zts(args) => commands::stand_ins::zts(args),
        Command::KubeStandins(args) => commands::stand_ins::kube(args),
        Command::PodRefreshOnce(args) => commands::pod::refresh_once(args),
        Command::PodApp(args) => commands::pod::app(args),
    }
}
