//! `athenz-initializer`: see the library docs and `--help`.

fn main() -> std::io::Result<()> {
    athenz_initializer::main_with_args(std::env::args_os())
}
