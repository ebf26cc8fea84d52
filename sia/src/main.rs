//! `athenz-sia init|refresh`: see the library docs and `--help`.

fn main() -> std::process::ExitCode {
    athenz_sia::main_with_args(std::env::args_os())
}
