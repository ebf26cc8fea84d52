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
        let name = service_name(service, namespace, &self.cluster_domain);
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

/// The service's name, absolute (a trailing dot): the node's resolver asks for it once, not
/// first under each of a cluster's search domains (a host-network pod's `resolv.conf` has
/// `ndots:5` and three or more of them, so the relative name cost ten queries, all
/// NXDOMAIN but the last, and most pods have no such Service at all).
fn service_name(service: &str, namespace: &str, cluster_domain: &str) -> String {
    format!(
        "{service}.{namespace}.svc.{}.",
        cluster_domain.trim_end_matches('.')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_name_is_absolute_whatever_the_domain_ends_with() {
        assert_eq!(
            service_name("web", "shop", "cluster.local"),
            "web.shop.svc.cluster.local."
        );
        assert_eq!(
            service_name("web", "shop", "cluster.local."),
            "web.shop.svc.cluster.local."
        );
    }
}
