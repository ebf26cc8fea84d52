//! `athenz-daemons` as a process: each daemon by its link's name or named first, its own flags
//! on its page (docs/binaries/athenz-daemons.md), and a name that is no daemon refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_athenz-daemons");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn run(argv0: Option<&Path>, args: &[&str]) -> Output {
    let program = argv0.unwrap_or(Path::new(BIN));
    Command::new(program).args(args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn each_daemon_runs_by_its_links_name_and_named_first() {
    let dir = tempfile::tempdir().unwrap();
    for daemon in athenz_daemons::DAEMONS {
        let link = dir.path().join(daemon);
        std::os::unix::fs::symlink(BIN, &link).unwrap();
        let out = run(Some(&link), &["--version"]);
        assert!(out.status.success(), "{daemon}");
        assert_eq!(stdout(&out), format!("{daemon} {VERSION}\n"));
        let out = run(None, &[daemon, "--version"]);
        assert_eq!(stdout(&out), format!("{daemon} {VERSION}\n"));
        // a bad setting is the daemon's own refusal (clap's exit 2), not the dispatcher's
        let out = run(Some(&link), &["--no-such-flag"]);
        assert_eq!(out.status.code(), Some(2), "{daemon}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    }
}

#[test]
fn its_own_flags_and_refusals() {
    let out = run(None, &["--version"]);
    assert_eq!(stdout(&out), format!("athenz-daemons {VERSION}\n"));
    let out = run(None, &["--help"]);
    assert!(out.status.success());
    for daemon in athenz_daemons::DAEMONS {
        assert!(stdout(&out).contains(daemon), "{daemon}");
    }
    for refused in [&["athenz-sia"][..], &["sh", "-c", "id"], &[]] {
        let out = run(None, refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("is not a daemon"));
    }
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/binaries/athenz-daemons.md"),
    )
    .unwrap();
    for flag in ["--version", "--help", "-V", "-h"] {
        assert!(
            page.contains(&format!("`{flag}`")),
            "{flag} not on its page"
        );
    }
}
