//! `athenz-volume-driver init | mount <dir> <json> | unmount <dir>`: see the library docs.

fn main() {
    // Exactly one JSON object on stdout on every path, a panic included, and nothing on stderr.
    athenz_volume_driver::install_panic_hook();
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let reply = athenz_volume_driver::run(&args, &athenz_volume_driver::host_dirs_from_env());
    athenz_volume_driver::print_and_exit(&reply);
}
