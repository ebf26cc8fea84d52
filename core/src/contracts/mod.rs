//! The contracts with the other parts and with Athenz and Kubernetes: names and the pod's
//! identity, the pod fields read from kubelet and the API, the agent's socket API, the identity
//! JWT, Athenz tokens, ZTS and CSI wire types. Defined once, used by both ends of each.

pub mod agent_api;
#[cfg(feature = "csi")]
pub mod csi;
pub mod identity_jwt;
pub mod issuance;
pub mod ntoken;
pub mod pod_fields;
pub mod role_token;
pub mod subject;
pub mod zts;
