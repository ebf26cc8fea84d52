//! `athenz-control-sia`: identity for the control-plane services themselves (DESIGN.md 4.6).
//!
//! The callback, the jwt-service, the initializer and the node agents are part of the pod identity
//! path, so they cannot use it; they prove ownership of a service key registered in Athenz instead.
//! From `service.key` and `service.version` this signs an ntoken, sends ZTS a CSR made with the same
//! key (`POST /zts/v1/instance/{domain}/{service}/refresh`, the ntoken in `Athenz-Principal-Auth`),
//! and writes `service.cert.pem` (leaf + chain), `ca.cert.pem` and `ntoken` as one atomic set.

pub mod config;
pub mod identity;
pub mod run;

pub use config::{Cli, Command, Settings};
pub use identity::ControlSia;
