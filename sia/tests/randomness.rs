//! The SIA's cryptography seeds its random generator from the kernel, not from aws-lc's
//! CPU-jitter entropy source: that source costs about 30 ms of CPU at a process's first random
//! number, and the SIA is a new process in every pod that makes its key at once
//! (`.cargo/config.toml`, `AWS_LC_SYS_NO_JITTER_ENTROPY`). Read from the built binary's symbol
//! table with binutils' `nm`, so a build that lost the setting fails here, not only in a
//! benchmark.
#![allow(clippy::expect_used)]

use std::process::Command;

fn defined_symbols(binary: &str) -> Vec<String> {
    let out = Command::new("nm")
        .args(["--defined-only", binary])
        .output()
        .expect("nm (binutils) runs");
    assert!(
        out.status.success(),
        "nm {binary}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

#[test]
fn the_sia_is_built_without_aws_lc_cpu_jitter_entropy() {
    let symbols = defined_symbols(env!("CARGO_BIN_EXE_athenz-sia"));
    // the table is there to read (a stripped binary would pass the check below for nothing)
    assert!(
        symbols.iter().any(|s| s.ends_with("_RAND_bytes")),
        "no aws-lc RAND_bytes among {} symbols: is the binary stripped?",
        symbols.len()
    );
    // the jitterentropy library's own functions (`jent_*`) are compiled in only with the source
    // on; aws-lc's `tree_jitter_*` names stay either way, as stubs when it is off
    let jitter: Vec<&String> = symbols.iter().filter(|s| s.contains("_jent_")).collect();
    assert!(
        jitter.is_empty(),
        "aws-lc was built with its CPU-jitter entropy source ({jitter:?}): every SIA would pay \
         ~30 ms of CPU for its first key; build with .cargo/config.toml's \
         AWS_LC_SYS_NO_JITTER_ENTROPY=1"
    );
}
