//! `athenz-identity-agent`: see the library docs and `--help`.

fn main() -> std::io::Result<()> {
    athenz_identity_agent::main_with_args(std::env::args_os())
}
