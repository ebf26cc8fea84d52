//! `athenz-initializer`: see the library docs and `--help`.

use clap::Parser;

fn main() -> std::io::Result<()> {
    let config = athenz_initializer::Config::parse();
    let log_format = config.ops.log_format;
    athenz_core::daemon::run_until_terminated(log_format, |shutdown| {
        athenz_initializer::start(config, shutdown)
    })
}
