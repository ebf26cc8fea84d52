//! `athenz-volume-driver`: the kubelet flex volume driver (docs/design.md §4.1).
//!
//! Kubelet execs it once per pod volume — `init`, `mount <dir> <json>`, `unmount <dir>` — and
//! reads its stdout and stderr together with no timeout. [`run`] turns the arguments into exactly
//! one [`Reply`]; `main` prints it and exits with its code. Everything else goes to the log file in
//! the volumes dir. The mount steps themselves are `athenz_core::volume_mount`, shared with the
//! CSI driver's socket mode.

pub mod lock;
pub mod log;
pub mod options;
pub mod reply;

use athenz_core::volume::{VolumesDir, agent_dir_from_env};
pub use athenz_core::volume_mount::HostDirs;
use athenz_core::volume_mount::{mount_dir, steps as driver};
use options::MountOptions;
pub use reply::Reply;
use std::ffi::OsString;
use std::path::Path;

/// Host directories from `ATHENZ_VOLUMES_DIR` and `ATHENZ_AGENT_DIR` (or the defaults).
pub fn host_dirs_from_env() -> HostDirs {
    HostDirs::new(VolumesDir::from_env(), agent_dir_from_env())
}

/// Prints `reply` as the one line kubelet reads and exits with its code.
pub fn print_and_exit(reply: &Reply) -> ! {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(reply.to_line().as_bytes());
    let _ = out.flush();
    std::process::exit(reply.exit_code());
}

/// Makes a panic print a Failure object (and nothing on stderr) and exit 1, so kubelet always
/// gets exactly one JSON object.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".to_owned());
        print_and_exit(&Reply::failure(format!("internal error: {what}")));
    }));
}

/// The `athenz-volume-driver` command: `args` are the arguments after the program name. Prints
/// exactly one reply (a panic included) and exits with its code. `main` runs it, and so does
/// `athenz-devstack` when it re-executes itself under this name.
pub fn main_with_args(args: &[OsString]) -> ! {
    if let Some(text) = operator_text(args) {
        use std::io::Write;
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        std::process::exit(0);
    }
    install_panic_hook();
    print_and_exit(&run(args, &host_dirs_from_env()))
}

/// What `--help` prints: the driver's calls (kubelet's) and its environment.
pub const HELP: &str = "\
Kubelet flex volume driver of athenz-k8s-identity (kubelet execs it; it prints one JSON reply)

Usage: athenz-volume-driver init
       athenz-volume-driver mount <dir> <options json>
       athenz-volume-driver unmount <dir>

Options:
  -h, --help     Print help
  -V, --version  Print version

Environment:
  ATHENZ_VOLUMES_DIR  Directory of the volumes (the agent's --volumes-dir)
  ATHENZ_AGENT_DIR    Directory of the agent's socket (the agent's --agent-dir)
";

/// `--version` and `--help` (an operator's, never kubelet's calls): the text to print instead
/// of a JSON reply, or `None` for a kubelet call.
pub fn operator_text(args: &[OsString]) -> Option<String> {
    match args.first()?.to_str()? {
        "--version" | "-V" => Some(format!(
            "athenz-volume-driver {}\n",
            env!("CARGO_PKG_VERSION")
        )),
        "--help" | "-h" => Some(HELP.to_owned()),
        _ => None,
    }
}

/// One driver invocation, parsed and checked before anything touches the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `init`.
    Init,
    /// `mount <dir> <options json>`: the dir's form is checked and the options parsed.
    Mount {
        /// The mount dir kubelet named.
        dir: String,
        /// The pod the volume is for.
        options: MountOptions,
    },
    /// `unmount <dir>`: the dir's form is checked.
    Unmount {
        /// The mount dir kubelet named.
        dir: String,
    },
}

impl Command {
    /// Parses kubelet's arguments (after the program name). Pure: the fuzz target
    /// `flex_driver_args` drives it with arbitrary argv. A refusal is the one reply to print.
    pub fn parse(args: &[&str]) -> Result<Self, Reply> {
        match args {
            [] => Err(Reply::failure(
                "no command given: expected init, mount or unmount",
            )),
            ["init"] => Ok(Self::Init),
            ["mount", dir, options] => {
                mount_dir::check_form(dir).map_err(Reply::failure)?;
                let options =
                    MountOptions::parse(options).map_err(|e| Reply::failure(e.to_string()))?;
                Ok(Self::Mount {
                    dir: (*dir).to_owned(),
                    options,
                })
            }
            ["unmount", dir] => {
                mount_dir::check_form(dir).map_err(Reply::failure)?;
                Ok(Self::Unmount {
                    dir: (*dir).to_owned(),
                })
            }
            ["init", ..] => Err(Reply::failure("init takes no arguments")),
            ["mount", ..] => Err(Reply::failure(format!(
                "mount takes 2 arguments (<mount dir> <options json>), got {}",
                args.len() - 1
            ))),
            ["unmount", ..] => Err(Reply::failure(format!(
                "unmount takes 1 argument (<mount dir>), got {}",
                args.len() - 1
            ))),
            [other, ..] => Err(Reply::not_supported(other)),
        }
    }
}

/// Runs one driver command. `args` are the arguments after the program name.
pub fn run(args: &[OsString], host: &HostDirs) -> Reply {
    let args: Vec<&str> = match args.iter().map(|a| a.to_str()).collect::<Option<Vec<_>>>() {
        Some(a) => a,
        None => return Reply::failure("arguments must be UTF-8"),
    };
    let reply = match Command::parse(&args) {
        Err(refusal) => refusal,
        Ok(Command::Init) => Reply::init(),
        Ok(Command::Mount { dir, options }) => {
            with_volumes(host, |host| mount(host, &dir, &options))
        }
        Ok(Command::Unmount { dir }) => with_volumes(host, |host| unmount(host, &dir)),
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

fn mount(host: &HostDirs, dir: &str, options: &MountOptions) -> Result<(), String> {
    mount_dir::check_on_disk(Path::new(dir), host.volumes.root(), &host.agent)?;
    driver::mount_volume(host, dir, &options.request())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn unmount(host: &HostDirs, dir: &str) -> Result<(), String> {
    // A dir that still exists must be the real path: unmounting `<dir>/connect` through a
    // symlinked component would unmount something else.
    if let Ok(canonical) = std::fs::canonicalize(dir)
        && canonical != Path::new(dir)
    {
        return Err(format!(
            "mount dir {} is reached through a symlink (it is really {})",
            athenz_core::names::Quoted::new(dir),
            canonical.display()
        ));
    }
    driver::unmount_volume(host, dir)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";
    const DIR: &str =
        "/var/lib/kubelet/pods/0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c/volumes/athenz~identity/athenz";

    #[test]
    fn version_and_help_are_for_operators_and_kubelet_calls_are_not_taken_for_them() {
        let arg = |a: &str| vec![OsString::from(a)];
        let version = operator_text(&arg("--version")).unwrap();
        assert_eq!(
            version,
            format!("athenz-volume-driver {}\n", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(operator_text(&arg("-V")), Some(version));
        assert!(
            operator_text(&arg("--help"))
                .unwrap()
                .contains("ATHENZ_VOLUMES_DIR")
        );
        for kubelet in ["init", "mount", "unmount", "--versions", ""] {
            assert_eq!(operator_text(&arg(kubelet)), None, "{kubelet}");
        }
        assert_eq!(operator_text(&[]), None);
    }

    fn options() -> String {
        serde_json::json!({
            "kubernetes.io/pod.namespace": "ns",
            "kubernetes.io/pod.name": "p",
            "kubernetes.io/pod.uid": UID,
            "kubernetes.io/serviceAccount.name": "sa",
        })
        .to_string()
    }

    fn refusal(args: &[&str]) -> String {
        let reply = Command::parse(args).unwrap_err();
        assert_eq!(reply.exit_code(), 1, "{args:?}");
        reply.message.unwrap_or_default()
    }

    #[test]
    fn commands_parse_before_anything_touches_the_disk() {
        assert_eq!(Command::parse(&["init"]).unwrap(), Command::Init);
        let opts = options();
        match Command::parse(&["mount", DIR, &opts]).unwrap() {
            Command::Mount { dir, options } => {
                assert_eq!(dir, DIR);
                assert_eq!(options.pod.pod_uid, UID);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            Command::parse(&["unmount", DIR]).unwrap(),
            Command::Unmount { dir: DIR.into() }
        );
    }

    #[test]
    fn bad_argv_is_refused_naming_what_is_wrong() {
        let opts = options();
        assert!(refusal(&[]).contains("no command given"));
        assert!(refusal(&["init", "x"]).contains("init takes no arguments"));
        assert!(refusal(&["mount", DIR]).contains("got 1"));
        assert!(refusal(&["mount", DIR, &opts, "x"]).contains("got 3"));
        assert!(refusal(&["unmount"]).contains("got 0"));
        assert!(refusal(&["mount", "relative/dir", &opts]).contains("must be an absolute path"));
        assert!(refusal(&["unmount", "/a/../b"]).contains("not normalised"));
        assert!(refusal(&["mount", DIR, "[]"]).contains("JSON object"));
        assert!(refusal(&["mount", DIR, "{"]).contains("not valid JSON"));
        let huge = format!("{{\"x\":\"{}\"}}", "a".repeat(70_000));
        assert!(refusal(&["mount", DIR, &huge]).contains("more than the limit"));
        let not_supported = Command::parse(&["attach", "x"]).unwrap_err();
        assert_eq!(not_supported.status, reply::Status::NotSupported);
    }

    const CHILD: &str = "ATHENZ_DRIVER_PANIC_CHILD";

    /// Runs in a child process (see below): installs the hook and panics.
    #[test]
    fn panic_child() {
        if std::env::var_os(CHILD).is_some() {
            install_panic_hook();
            panic!("boom");
        }
    }

    #[test]
    fn a_panic_prints_one_failure_object_and_nothing_on_stderr() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::panic_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stdout = String::from_utf8(out.stdout).unwrap();
        // the test harness prints its own progress first, on the same line
        assert_eq!(stdout.matches("{\"status\"").count(), 1, "{stdout}");
        assert!(
            stdout.ends_with("{\"status\":\"Failure\",\"message\":\"internal error: boom\"}\n"),
            "{stdout}"
        );
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
