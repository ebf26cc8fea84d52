//! `athenz-jwt-service`: see the library docs and `--help`.

fn main() -> std::io::Result<()> {
    athenz_jwt_service::main_with_args(std::env::args_os())
}
