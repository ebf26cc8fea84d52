//! `athenz-volume-driver init | mount <dir> <json> | unmount <dir>`: see the library docs.

fn main() {
    // Exactly one JSON object on stdout on every path, a panic included, and nothing on stderr.
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    athenz_volume_driver::main_with_args(&args)
}
