//! The stack bind-mounts volumes as kubelet's flex driver does, which takes CAP_SYS_ADMIN over a
//! mount namespace. As root that is the host's; as a normal user this re-executes itself inside a
//! new user + mount namespace (util-linux `unshare`), where the kernel allows it, and otherwise
//! says what it needs.

use anyhow::Context;
use std::process::ExitCode;

/// What to do about it, for every refusal.
const NEEDS_ROOT: &str = "athenz-devstack needs root: it bind-mounts pod volumes as kubelet's \
    driver does. Run it as root (sudo), or as a normal user on a kernel that allows unprivileged \
    user namespaces (sysctl user.max_user_namespaces > 0, and on Debian/Ubuntu \
    kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0) with \
    util-linux's `unshare` installed.";

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
    let unshare = [
        "--user",
        "--map-root-user",
        "--mount",
        "--propagation",
        "private",
    ];
    // Can we? (A refusal of the real run would be indistinguishable from the run failing.)
    let probe = std::process::Command::new("unshare")
        .args(unshare)
        .arg("true")
        .stderr(std::process::Stdio::piped())
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => anyhow::bail!(
            "{NEEDS_ROOT} The kernel refused a user namespace here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => anyhow::bail!("{NEEDS_ROOT} (`unshare` could not be run: {e})"),
    }
    let status = std::process::Command::new("unshare")
        .args(unshare)
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(REEXEC_MARK, "1")
        .status()
        .context("running unshare")?;
    Ok(Some(ExitCode::from(
        u8::try_from(status.code().unwrap_or(1)).unwrap_or(1),
    )))
}
