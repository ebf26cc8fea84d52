//! The optional lookup of a pod's Kubernetes service IP, for a service IP SAN.

use std::net::IpAddr;
use std::time::Duration;

/// Looks up a pod's Kubernetes service in DNS.
pub struct ServiceDns {
    cluster_domain: String,
    resolver: Option<athenz_core::serving::dns::Resolver>,
}

impl ServiceDns {
    /// Looks names up under `cluster_domain`, through `server` or the system resolver.
    pub fn new(cluster_domain: String, server: Option<std::net::SocketAddr>) -> Self {
        Self {
            cluster_domain,
            resolver: server
                .map(|addr| athenz_core::serving::dns::resolver_via(addr, Duration::from_secs(2))),
        }
    }

    /// The first address of `<service>.<namespace>.svc.<cluster-domain>`, within 2 s.
    pub async fn lookup(&self, service: &str, namespace: &str) -> Option<IpAddr> {
        let name = format!("{service}.{namespace}.svc.{}", self.cluster_domain);
        match &self.resolver {
            Some(resolver) => {
                athenz_core::serving::dns::first_address(resolver, &name, Duration::from_secs(3))
                    .await
            }
            None => {
                let lookup = tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::net::lookup_host(format!("{name}:0")),
                )
                .await;
                lookup.ok()?.ok()?.next().map(|a| a.ip())
            }
        }
    }
}
