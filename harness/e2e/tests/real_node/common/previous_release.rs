//! The release before this one (athenz_devstack::cluster::previous_release), as the upgrade
//! tests take it: extracted from this repository, its image built once and kept.

pub use athenz_devstack::cluster::previous_release::PreviousRelease;
use std::path::PathBuf;

/// The previous release, extracted; fails the test saying why it cannot be had.
pub fn previous_release() -> PreviousRelease {
    PreviousRelease::from_changelog(&athenz_testbed::bins::repo_root())
        .unwrap_or_else(|e| panic!("the previous release: {e:#}"))
}

/// Its image, from the release cache or built into it (and waited for while CI builds it).
pub fn previous_image(previous: &PreviousRelease) -> PathBuf {
    previous
        .image(&athenz_testbed::bins::repo_root())
        .unwrap_or_else(|e| panic!("the previous release's image: {e:#}"))
}
