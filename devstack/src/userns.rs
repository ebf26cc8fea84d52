//! The stack bind-mounts volumes as kubelet's flex driver does, which takes CAP_SYS_ADMIN over a
//! mount namespace. As root that is the host's; as a normal user this re-executes itself inside a
//! new user + mount namespace (util-linux `unshare`), where the kernel allows it, and otherwise
//! says what it needs.

use anyhow::Context;
use std::process::ExitCode;

/// Set in the re-executed process, so it never tries twice.
const REEXEC_MARK: &str = "ATHENZ_DEVSTACK_USERNS";

/// `None`: carry on here (root, or already inside the namespace). `Some(code)`: this process
/// re-executed itself in a user namespace and that run ended with `code`.
pub fn ensure_privileged() -> anyhow::Result<Option<ExitCode>> {
    if nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    if std::env::var_os(REEXEC_MARK).is_some() {
        anyhow::bail!(
            "inside the user namespace but not root there; athenz-devstack needs root (mounts)"
        );
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let status = std::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(REEXEC_MARK, "1")
        .status();
    match status {
        Ok(s) if s.code() == Some(1) && !s.success() => {
            // unshare itself reports "Operation not permitted" on stderr and exits 1; so may the
            // devstack; either way the message above it says which.
            Ok(Some(ExitCode::FAILURE))
        }
        Ok(s) => Ok(Some(ExitCode::from(
            u8::try_from(s.code().unwrap_or(1)).unwrap_or(1),
        ))),
        Err(e) => anyhow::bail!(
            "athenz-devstack needs root: it bind-mounts pod volumes as kubelet's driver does. \
             Run it as root (sudo), or install util-linux's `unshare` on a kernel that allows \
             unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
             user.max_user_namespaces > 0) so it can run in its own user + mount namespace \
             ({e})"
        ),
    }
}
