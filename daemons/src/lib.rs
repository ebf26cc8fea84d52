//! One binary for the six daemons (`athenz-daemons`), each run under its own name.
//!
//! The image ships the agent, the jwt-service, the callback, the initializer, the control
//! SIA and the node authorizer as links to this one static binary: they share most of their
//! code (tokio, hyper, rustls with aws-lc, kube, serde), which six separate static binaries
//! would each carry again. A link's name is `argv[0]`, so the manifests' commands (`athenz-callback`, …) and each
//! daemon's flags, environment and `--version` are exactly those of its own crate. The SIA (in
//! every pod, built for size) and the volume driver (copied onto the host) stay binaries of
//! their own. README.md ("What the image holds") says what this saves.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

/// The daemons this binary runs, by the names the manifests call them.
pub const DAEMONS: &[&str] = &[
    "athenz-identity-agent",
    "athenz-jwt-service",
    "athenz-callback",
    "athenz-initializer",
    "athenz-control-sia",
    "athenz-node-authorizer",
];

/// Runs the daemon named `name` (a file name, as in `argv[0]`) with `args` (the program name
/// first), or `None` when `name` is none of [`DAEMONS`].
pub fn dispatch(name: &str, args: Vec<OsString>) -> Option<ExitCode> {
    let served = |result: std::io::Result<()>| match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{name}: {e}");
            ExitCode::FAILURE
        }
    };
    Some(match name {
        "athenz-identity-agent" => athenz_identity_agent::main_dispatch(args),
        "athenz-jwt-service" => served(athenz_jwt_service::main_with_args(args)),
        "athenz-callback" => served(athenz_callback::main_with_args(args)),
        "athenz-initializer" => served(athenz_initializer::main_with_args(args)),
        "athenz-control-sia" => athenz_control_sia::main_with_args(args),
        "athenz-node-authorizer" => {
            served(athenz_initializer::node_authorizer::main_with_args(args))
        }
        _ => return None,
    })
}

/// The file name of `argv[0]`, if it has one in UTF-8.
pub fn invoked_name(args: &[OsString]) -> Option<&str> {
    args.first()
        .map(Path::new)
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
}

/// What `athenz-daemons --help` prints.
pub fn usage() -> String {
    format!(
        "athenz-daemons {}: the daemons of athenz-k8s-identity in one binary\n\n\
         Run as a link named after a daemon, or name it first:\n  athenz-daemons <daemon> [args...]\n\n\
         Daemons:\n  {}\n",
        env!("CARGO_PKG_VERSION"),
        DAEMONS.join("\n  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_is_no_daemon_is_not_run() {
        for name in [
            "athenz-sia",
            "athenz-volume-driver",
            "athenz-daemons",
            "",
            "sh",
        ] {
            assert!(
                dispatch(name, vec![OsString::from(name)]).is_none(),
                "{name}"
            );
        }
    }

    #[test]
    fn the_invoked_name_is_argv0s_file_name() {
        let args = |a: &str| vec![OsString::from(a), OsString::from("--version")];
        assert_eq!(
            invoked_name(&args("/usr/local/bin/athenz-callback")),
            Some("athenz-callback")
        );
        assert_eq!(
            invoked_name(&args("athenz-jwt-service")),
            Some("athenz-jwt-service")
        );
        assert_eq!(invoked_name(&[]), None);
        assert!(usage().contains("athenz-identity-agent"));
    }
}
