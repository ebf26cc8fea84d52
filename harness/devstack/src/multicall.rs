//! One binary, every component. `athenz-devstack` starts each part of the system as its own
//! process by executing itself under the component's name (a symlink in `<state>/bin`), so the
//! processes, arguments, sockets, mounts and TLS are those of a cluster while `cargo run` builds
//! only this crate.

use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The component binaries of their own (beside the daemons of `athenz-daemons`) this one can
/// act as.
const OWN_BINARIES: &[&str] = &["athenz-volume-driver", "athenz-sia"];

/// Runs the component this process was executed as (the file name of `argv[0]`), if it is one:
/// the six daemons as `athenz-daemons` runs them, the driver and the SIA from their crates.
pub fn dispatch() -> Option<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let name = athenz_daemons::invoked_name(&args)?.to_owned();
    match name.as_str() {
        "athenz-volume-driver" => athenz_volume_driver::main_with_args(&args[1..]),
        "athenz-sia" => Some(athenz_sia::main_with_args(args)),
        _ => athenz_daemons::dispatch(&name, args),
    }
}

/// Makes `dir` hold one symlink per component, each pointing at this executable — or, with
/// `components`, at the separately built binary of that name there (e.g. the static driver and
/// SIA a cluster runs, to measure them); returns `dir`.
pub fn install_bin_dir(dir: &Path, components: Option<&Path>) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in OWN_BINARIES
        .iter()
        .chain(athenz_daemons::DAEMONS)
        .chain(std::iter::once(&"athenz-devstack"))
    {
        let link = dir.join(name);
        let target = match components {
            Some(c) if *name != "athenz-devstack" => {
                let built = c.join(name);
                if !built.is_file() {
                    anyhow::bail!("--components {}: no {name} there", c.display());
                }
                std::fs::canonicalize(&built)
                    .with_context(|| format!("resolving {}", built.display()))?
            }
            _ => exe.clone(),
        };
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("linking {} to {}", link.display(), target.display()))?;
    }
    Ok(dir.to_owned())
}
