//! `athenz-core`: everything two or more parts of athenz-k8s-identity share.
//!
//! Each module owns one concern (see `DESIGN.md` section 2):
//!
//! | module | concern |
//! |---|---|
//! | [`identity_jwt`] | identity JWT claims and the jwt-service wire types |
//! | [`names`] | Athenz and Kubernetes name rules, namespace ↔ domain mapping, the pod CSR identity |
//! | [`subject`] | the attested pod subject and its `pod:` URI form |
//! | [`volume`] | the identity-volume layout shared by the flex driver and the agent |
//! | [`volume_mount`] | mounting identity volumes: the flex layout and the CSI files layout |
//! | [`pod_info`] | the pod a volume is for, as kubelet names it (flex options, CSI context) |
//! | `csi` | CSI v1 messages and gRPC stubs (feature `csi`) |
//! | [`crypto`] | key generation, CSRs, certificate and CSR reading |
//! | [`ntoken`] | Athenz principal tokens: build, sign, parse, verify |
//! | [`files`] | atomic replacement of a set of files (`..data` symlink swap) |
//! | [`tls`] | rustls configs with client-principal checks and hot reload |
//! | [`zts`] | ZTS wire types and client |
//! | [`random`] | randomness from the OS |
//! | [`refresh`] | when to refresh a certificate and how to back off |
//! | [`agent_api`] | wire types of the node agent's socket API |
//! | [`client`] | helpers for outgoing HTTP calls |
//! | [`daemon`] | settings and start-up shared by every TLS daemon |
//! | [`http`] | the small HTTP server layer every daemon uses |
//! | [`peer`] | which pod a process on the agent socket belongs to (cgroup, pinned pid) |
//! | [`telemetry`] | logging and metrics setup |
//! | [`secret`] | a wrapper that keeps secrets out of logs |

pub mod agent_api;
pub mod client;
pub mod crypto;
#[cfg(feature = "csi")]
pub mod csi;
pub mod daemon;
pub mod files;
pub mod http;
pub mod identity_jwt;
pub mod names;
pub mod ntoken;
pub mod peer;
pub mod pod_fields;
pub mod pod_info;
pub mod random;
pub mod refresh;
pub mod role_token;
pub mod secret;
pub mod subject;
pub mod telemetry;
pub mod tls;
pub mod unix_socket;
pub mod volume;
pub mod volume_mount;
pub mod zts;

/// Installs aws-lc-rs as the process-wide rustls crypto provider.
///
/// Every binary calls this first: with two providers compiled in, rustls panics at the first config
/// builder (STACK.md). Calling it more than once is harmless.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
