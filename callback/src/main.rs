//! `athenz-callback`: see the library docs and `--help`.

fn main() -> std::io::Result<()> {
    athenz_callback::main_with_args(std::env::args_os())
}
