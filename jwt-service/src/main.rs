//! `athenz-jwt-service`: see the library docs and `--help`.

use clap::Parser;

fn main() -> std::io::Result<()> {
    let config = athenz_jwt_service::Config::parse();
    let log_format = config.ops.log_format;
    athenz_core::daemon::run_until_terminated(log_format, |shutdown| {
        athenz_jwt_service::start(config, shutdown)
    })
}
