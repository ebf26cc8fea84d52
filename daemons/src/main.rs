//! `athenz-daemons`: run under a daemon's name (a link), or as `athenz-daemons <daemon> …`.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let name = athenz_daemons::invoked_name(&args)
        .unwrap_or_default()
        .to_owned();
    if let Some(code) = athenz_daemons::dispatch(&name, args.clone()) {
        return code;
    }
    // `athenz-daemons <daemon> args...`: the daemon's own name becomes its argv[0]
    let rest: Vec<OsString> = args.into_iter().skip(1).collect();
    let first = rest
        .first()
        .and_then(|a| a.to_str())
        .unwrap_or_default()
        .to_owned();
    if let Some(code) = athenz_daemons::dispatch(&first, rest) {
        return code;
    }
    match first.as_str() {
        "--version" | "-V" => {
            let _ = writeln!(
                std::io::stdout(),
                "athenz-daemons {}",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::SUCCESS
        }
        "--help" | "-h" => {
            let _ = std::io::stdout().write_all(athenz_daemons::usage().as_bytes());
            ExitCode::SUCCESS
        }
        other => {
            let _ = writeln!(
                std::io::stderr(),
                "athenz-daemons: {:?} is not a daemon\n\n{}",
                other,
                athenz_daemons::usage()
            );
            ExitCode::from(2)
        }
    }
}
