//! `athenz-volume-driver`: the kubelet flex volume driver (DESIGN.md 4.1).
//!
//! Kubelet execs it once per pod volume — `init`, `mount <dir> <json>`, `unmount <dir>` — and
//! reads its stdout and stderr together with no timeout. [`run`] turns the arguments into exactly
//! one [`Reply`]; `main` prints it and exits with its code. Everything else goes to the log file in
//! the volumes dir.

pub mod driver;
pub mod lock;
pub mod log;
pub mod mount_dir;
pub mod mountinfo;
pub mod options;
pub mod reply;

use athenz_core::volume::{VolumesDir, agent_dir_from_env};
use driver::HostDirs;
use options::MountOptions;
pub use reply::Reply;
use std::ffi::OsString;
use std::path::Path;

/// Host directories from `ATHENZ_VOLUMES_DIR` and `ATHENZ_AGENT_DIR` (or the defaults).
pub fn host_dirs_from_env() -> HostDirs {
    HostDirs {
        volumes: VolumesDir::from_env(),
        agent: agent_dir_from_env(),
    }
}

/// Runs one driver command. `args` are the arguments after the program name.
pub fn run(args: &[OsString], host: &HostDirs) -> Reply {
    let args: Vec<&str> = match args.iter().map(|a| a.to_str()).collect::<Option<Vec<_>>>() {
        Some(a) => a,
        None => return Reply::failure("arguments must be UTF-8"),
    };
    let reply = match args.as_slice() {
        [] => Reply::failure("no command given: expected init, mount or unmount"),
        ["init"] => Reply::init(),
        ["mount", dir, options] => with_volumes(host, |host| mount(host, dir, options)),
        ["unmount", dir] => with_volumes(host, |host| unmount(host, dir)),
        ["init", ..] => Reply::failure("init takes no arguments"),
        ["mount", ..] => Reply::failure(format!(
            "mount takes 2 arguments (<mount dir> <options json>), got {}",
            args.len() - 1
        )),
        ["unmount", ..] => Reply::failure(format!(
            "unmount takes 1 argument (<mount dir>), got {}",
            args.len() - 1
        )),
        [other, ..] => Reply::not_supported(other),
    };
    if let Some(command @ ("mount" | "unmount")) = args.first().copied() {
        let dir = args.get(1).copied().unwrap_or_default();
        log::append(
            host.volumes.root(),
            &format!(
                "{command} {} -> {:?} {}",
                athenz_core::names::Quoted::new(dir),
                reply.status,
                reply.message.as_deref().unwrap_or("")
            ),
        );
    }
    reply
}

/// Ensures the volumes dir and holds the driver lock around `f`.
fn with_volumes(host: &HostDirs, f: impl FnOnce(&HostDirs) -> Result<(), String>) -> Reply {
    if let Err(e) = host.volumes.ensure() {
        return Reply::failure(e.to_string());
    }
    let _lock = match lock::acquire(host.volumes.root()) {
        Ok(l) => l,
        Err(e) => return Reply::failure(e),
    };
    match f(host) {
        Ok(()) => Reply::success(),
        Err(e) => Reply::failure(e),
    }
}

fn mount(host: &HostDirs, dir: &str, options: &str) -> Result<(), String> {
    mount_dir::check_form(dir)?;
    let opts = MountOptions::parse(options).map_err(|e| e.to_string())?;
    mount_dir::check_on_disk(Path::new(dir), host.volumes.root(), &host.agent)?;
    driver::mount_volume(host, dir, &opts)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn unmount(host: &HostDirs, dir: &str) -> Result<(), String> {
    mount_dir::check_form(dir)?;
    driver::unmount_volume(host, dir)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
