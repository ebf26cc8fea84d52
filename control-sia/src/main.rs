//! `athenz-control-sia init|refresh`: see the library docs and `--help`.

fn main() -> std::process::ExitCode {
    athenz_control_sia::main_with_args(std::env::args_os())
}
