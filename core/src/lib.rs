//! `athenz-core`: everything two or more parts of athenz-k8s-identity share.
//!
//! Modules are grouped in folders by concern (docs/design.md §7): [`contracts`], [`node`],
//! [`serving`] and a few at the root. Most are also reachable at the crate root
//! (`athenz_core::volume`, `athenz_core::tls`, …), the paths every crate uses. The one list of the
//! modules, what each is for and which uses which, is in docs/architecture.md ("`athenz-core`").

#![warn(missing_docs)]

pub mod contracts;
pub mod crypto;
pub mod encoding;
pub mod names;
pub mod node;
pub mod random;
pub mod refresh;
pub mod secret;
pub mod serving;

#[cfg(feature = "csi")]
pub use contracts::csi;
pub use contracts::{
    agent_api, identity_jwt, issuance, ntoken, pod_fields, role_token, subject, zts,
};
pub use node::{files, peer, pod_info, volume, volume_mode, volume_mount};
pub use serving::{client, daemon, http, periodic, telemetry, tls, unix_socket};

/// Installs aws-lc-rs as the process-wide rustls crypto provider.
///
/// Every binary calls this first: with two providers compiled in, rustls panics at the first config
/// builder (docs/development.md, "Dependency pitfalls"). Calling it more than once is harmless.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
