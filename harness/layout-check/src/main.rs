//! `athenz-layout-check [--root DIR]`: prints the house-rules report of the repository and exits
//! 1 if any rule is broken (2 if the check could not run).
//!
//! Without `--root` it checks the workspace around the current directory.

// A command-line tool: printing the report is its job (the workspace forbids it in components).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: athenz-layout-check [--root DIR]";

fn main() -> ExitCode {
    let mut root: Option<PathBuf> = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--root") => match args.next() {
                Some(dir) => root = Some(dir.into()),
                None => return usage("--root needs a directory"),
            },
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ => return usage(&format!("unexpected argument {}", arg.to_string_lossy())),
        }
    }
    let root = match root {
        Some(root) => root,
        None => {
            let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            match athenz_layout_check::workspace::find_root(&here) {
                Ok(root) => root,
                Err(e) => return fail(&e),
            }
        }
    };
    match athenz_layout_check::check(&root) {
        Ok(report) => {
            println!("{report}");
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(&e),
    }
}

fn usage(message: &str) -> ExitCode {
    eprintln!("athenz-layout-check: {message}\n{USAGE}");
    ExitCode::from(2)
}

fn fail(e: &athenz_layout_check::Error) -> ExitCode {
    eprintln!("athenz-layout-check: {e}");
    ExitCode::from(2)
}
