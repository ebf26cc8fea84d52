//! `chaos`: one fault at a time into a stack whose pods renew short-lived certificates; exits 1
//! if a bound broke.

use super::{passed_or_failed, print_report, privileged_in_temp_dir, runtime};
use athenz_devstack::chaos::{self, ChaosOptions};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    #[command(flatten)]
    options: ChaosOptions,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    privileged_in_temp_dir("athenz-devstack-chaos-", |temp| {
        let report = runtime()?.block_on(chaos::run(temp, &args.options))?;
        print_report(args.json, &report, chaos::print_human)?;
        Ok(passed_or_failed(report.passed))
    })
}
