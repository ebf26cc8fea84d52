//! `soak`: the stack for a long time with short certificate lifetimes, every daemon and pod
//! sampled; exits 1 on growth past the bound, an expired or torn set, or a process that exits.

use super::{passed_or_failed, print_report, privileged_in_temp_dir, runtime};
use athenz_devstack::soak::{self, SoakOptions};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    #[command(flatten)]
    options: SoakOptions,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: SoakArgs) -> anyhow::Result<ExitCode> {
    privileged_in_temp_dir("athenz-devstack-soak-", |temp| {
        let report = runtime()?.block_on(soak::run(temp, &args.options))?;
        print_report(args.json, &report, soak::print_human)?;
        Ok(passed_or_failed(report.passed))
    })
}
