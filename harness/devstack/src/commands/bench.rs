//! `bench`: the full path for many pods, measured on a fresh stack per volume kind and key
//! source, each reported and, when there are several, compared.

use super::{privileged_in_temp_dir, runtime};
use athenz_devstack::bench::{self, BenchOptions};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    options: BenchOptions,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    privileged_in_temp_dir("athenz-devstack-bench-", |temp| {
        let reports = runtime()?.block_on(bench::run(temp, &args.options))?;
        if args.json {
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
    })
}
