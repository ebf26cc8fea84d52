//! What the devstack's integration tests share: the binary and how to read its JSON reports.

#![allow(dead_code, clippy::unwrap_used)]

use std::process::Command;

/// The binary under test.
pub const DEVSTACK: &str = env!("CARGO_BIN_EXE_athenz-devstack");

/// Runs the devstack with `args` and reads the JSON it prints, failing with its output when
/// that is not JSON.
pub fn json_run(args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let out = Command::new(DEVSTACK).args(args).output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}
