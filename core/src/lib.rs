//! `athenz-core`: everything two or more parts of athenz-k8s-identity share.
//!
//! Modules are grouped by concern (DESIGN.md 7), and each is also reachable at the crate root
//! (`athenz_core::volume`, `athenz_core::tls`, …), the paths every crate uses:
//!
//! | folder | module | concern |
//! |---|---|---|
//! | [`contracts`] | [`names`] | Athenz and Kubernetes name rules, namespace ↔ domain mapping, the pod CSR identity |
//! | | [`subject`] | the attested pod subject and its `pod:` URI form |
//! | | [`pod_info`] | the pod a volume is for, as kubelet names it (flex options, CSI context) |
//! | | [`pod_fields`] | the pod fields read from kubelet or API JSON |
//! | | [`agent_api`] | wire types of the node agent's socket API |
//! | | [`identity_jwt`] | identity JWT claims and the jwt-service wire types |
//! | | [`ntoken`] | Athenz principal tokens: build, sign, parse, verify |
//! | | [`role_token`] | Athenz role tokens |
//! | | [`zts`] | ZTS wire types and client |
//! | | `csi` | CSI v1 messages and gRPC stubs (feature `csi`) |
//! | [`node`] | [`volume`] | the identity-volume layout shared by the flex driver and the agent |
//! | | [`volume_mount`] | mounting identity volumes: the flex layout and the CSI files layout |
//! | | [`files`] | atomic replacement of a set of files (`..data` swap); [`files::single`]: of one file |
//! | | [`peer`] | which pod a process on the agent socket belongs to (cgroup, pinned pid) |
//! | [`serving`] | [`http`] | the small HTTP server layer every daemon uses |
//! | | [`tls`] | rustls configs with client-principal checks and hot reload |
//! | | [`daemon`] | settings and start-up shared by every TLS daemon |
//! | | [`periodic`] | the timer every reloader runs on |
//! | | [`unix_socket`] | gRPC servers on a Unix socket (CSI, SDS) |
//! | | [`client`] | helpers for outgoing HTTP calls |
//! | | [`telemetry`] | logging and metrics setup |
//! | (root) | [`crypto`] | key generation, CSRs, certificate and CSR reading |
//! | | [`random`] | randomness from the OS |
//! | | [`encoding`] | hex |
//! | | [`refresh`] | when to refresh a certificate and how to back off |
//! | | [`secret`] | a wrapper that keeps secrets out of logs |

pub mod contracts;
pub mod crypto;
pub mod encoding;
pub mod node;
pub mod random;
pub mod refresh;
pub mod secret;
pub mod serving;

#[cfg(feature = "csi")]
pub use contracts::csi;
pub use contracts::{
    agent_api, identity_jwt, names, ntoken, pod_fields, pod_info, role_token, subject, zts,
};
pub use node::{files, peer, volume, volume_mode, volume_mount};
pub use serving::{client, daemon, http, periodic, telemetry, tls, unix_socket};

/// Installs aws-lc-rs as the process-wide rustls crypto provider.
///
/// Every binary calls this first: with two providers compiled in, rustls panics at the first config
/// builder (STACK.md). Calling it more than once is harmless.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
