//! What the real-node tests share: the devstack binary that brings the node up, and the checks
//! each of them makes.

#![allow(dead_code, clippy::unwrap_used)]

/// `cluster up` for the real-node tests.
pub mod cluster;
/// One node of several: its agent's files, kubelet root and volume records.
pub mod nodes;
/// The release before this one: its manifests, install steps and image.
pub mod previous_release;
/// The real-node tests' checks of audit, metrics, uninstall, and the release to upgrade from.
pub mod real_node;
/// The release image, the features pod's verdict, a CA change, Helm's release Secrets.
pub mod release;

/// The devstack binary under test.
pub static DEVSTACK: std::sync::LazyLock<std::path::PathBuf> =
    std::sync::LazyLock::new(|| athenz_testbed::bins::built("athenz-devstack"));
