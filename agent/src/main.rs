//! `athenz-identity-agent`: see the library docs and `--help`; `athenz-identity-agent status`
//! shows the node's identity volumes.

fn main() -> std::process::ExitCode {
    athenz_identity_agent::main_dispatch(std::env::args_os().collect())
}
