//! `athenz-volume-driver init | mount <dir> <json> | unmount <dir>`: see the library docs.

use std::io::Write;

fn main() {
    // Exactly one JSON object on stdout on every path, a panic included, and nothing on stderr.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".to_owned());
        let reply = athenz_volume_driver::Reply::failure(format!("internal error: {what}"));
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(reply.to_line().as_bytes());
        let _ = out.flush();
        std::process::exit(1);
    }));
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let reply = athenz_volume_driver::run(&args, &athenz_volume_driver::host_dirs_from_env());
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(reply.to_line().as_bytes());
    let _ = out.flush();
    std::process::exit(reply.exit_code());
}
