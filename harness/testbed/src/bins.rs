//! Where the end-to-end tests find the repository and the workspace's binaries: the binaries
//! under test are built by `cargo test --workspace` for their own crates' tests, into the
//! target directory the running test lives in (`target/<profile>/<name>`), so a test in another
//! crate runs the same build.

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `harness/testbed`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The workspace binary `name` next to the running test's directory, or a panic naming the
/// command that builds it (a test without its binary must fail, not skip).
pub fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own path: {e}"));
    // target/<profile>/deps/<test>: the binaries are in target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} has no target/<profile> above it", exe.display()));
    let binary = profile_dir.join(name);
    assert!(
        binary.exists(),
        "{} is missing: build it with `cargo build --bin {name}` (cargo test --workspace does)",
        binary.display()
    );
    binary
}
