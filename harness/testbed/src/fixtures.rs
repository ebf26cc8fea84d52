//! The sample pod every test talks about, so that tests across crates agree on one set of names.

use athenz_core::names::{CsrIdentity, PodIdentityInput};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Namespace of the sample pod.
pub const NAMESPACE: &str = "media-sports";
/// Athenz domain the sample namespace maps to.
pub const DOMAIN: &str = "media.sports";
/// Service account (Athenz service) of the sample pod.
pub const SERVICE: &str = "web";
/// Pod name.
pub const POD_NAME: &str = "web-7d9f";
/// Pod UID (the instance id).
pub const POD_UID: &str = "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";
/// Pod IP.
pub const POD_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
/// Cluster IP of the pod's Kubernetes service.
pub const SERVICE_IP: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x10));
/// Provider (the callback's service name).
pub const PROVIDER: &str = "k8s.admin.athenz-callback";
/// DNS suffix of the SANs.
pub const DNS_SUFFIX: &str = "athenz.cloud";
/// Admin domain of system namespaces.
pub const ADMIN_DOMAIN: &str = "k8s.admin";

/// Namespace of the node agent pods (deploy/'s).
pub const AGENT_NAMESPACE: &str = "athenz-system";
/// Service account of the node agent pods.
pub const AGENT_SERVICE_ACCOUNT: &str = "athenz-agent";
/// The node agents' Athenz principal.
pub const AGENT_PRINCIPAL: &str = "k8s.admin.athenz-agent";
/// Audience of the agents' projected service-account tokens.
pub const NODE_TOKEN_AUDIENCE: &str = "athenz-node";

/// The sample pod's certificate identity, with the service IP SAN.
pub fn pod_identity() -> CsrIdentity {
    CsrIdentity::for_pod(&PodIdentityInput {
        domain: DOMAIN,
        service: SERVICE,
        provider: PROVIDER,
        dns_suffix: DNS_SUFFIX,
        instance_id: POD_UID,
        pod_ip: Some(POD_IP),
        service_ip: Some(SERVICE_IP),
    })
    .unwrap_or_else(|e| unreachable!("the sample identity is valid: {e}"))
}

/// The sample pod's certificate identity without the service IP SAN (its Service does not exist
/// unless a test creates it).
pub fn pod_identity_without_service_ip() -> CsrIdentity {
    CsrIdentity::for_pod(&PodIdentityInput {
        domain: DOMAIN,
        service: SERVICE,
        provider: PROVIDER,
        dns_suffix: DNS_SUFFIX,
        instance_id: POD_UID,
        pod_ip: Some(POD_IP),
        service_ip: None,
    })
    .unwrap_or_else(|e| unreachable!("the sample identity is valid: {e}"))
}
