//! `deploy/sbom.py`, which reads the release image's digest and writes its SBOM from the
//! dependency lists the binaries embed (`deploy/image.sh` runs it), refuses malformed, oversized
//! and hostile input: its tests, `deploy/test_sbom.py` (python3's unittest, standard library
//! only), run here so that `cargo test` runs them. Alone: `python3 -m unittest
//! deploy/test_sbom.py` from the repository's root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn sbom_py_passes_its_tests() {
    let repo = athenz_testbed::bins::repo_root();
    let out = Command::new("python3")
        .args(["-m", "unittest", "deploy/test_sbom.py"])
        .current_dir(&repo)
        // no __pycache__ left in deploy/
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| {
            panic!("python3: {e} (harness/setup's Debian image has it: apt-get install python3)")
        });
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python3 -m unittest deploy/test_sbom.py failed ({}):\n{report}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    // unittest's summary: "Ran N tests in ...", then "OK" (with what it skipped)
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("Ran ") && !l.starts_with("Ran 0 ")),
        "deploy/test_sbom.py ran no test:\n{report}"
    );
}
