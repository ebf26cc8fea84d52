//! `load`: what the shared parts (the jwt-service and the callback) cost at size, driven at a
//! rate on a fresh stack.

use super::{print_report, privileged_in_temp_dir, runtime};
use athenz_devstack::load::{self, LoadOptions};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    options: LoadOptions,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: LoadArgs) -> anyhow::Result<ExitCode> {
    privileged_in_temp_dir("athenz-devstack-load-", |temp| {
        let report = runtime()?.block_on(load::run(temp, &args.options))?;
        print_report(args.json, &report, load::print_human)?;
        Ok(ExitCode::SUCCESS)
    })
}
