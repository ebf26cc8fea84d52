//! The optional lookup of a pod's Kubernetes service IP, for a service IP SAN.

use std::net::IpAddr;
use std::time::Duration;

/// Looks up a pod's Kubernetes service in DNS.
pub struct ServiceDns {
    cluster_domain: String,
    resolver: Option<athenz_core::serving::dns::Resolver>,
}

/// The system's resolver configuration, whose name servers the lookups ask when no server is
/// given.
const SYSTEM_RESOLV_CONF: &str = "/etc/resolv.conf";

impl ServiceDns {
    /// Looks names up under `cluster_domain`, through `server`, or else the name servers of
    /// `/etc/resolv.conf` (in process, read once). Only if that file names none does a lookup
    /// go through the system resolver (`getaddrinfo`, on a blocking thread).
    pub fn new(cluster_domain: String, server: Option<std::net::SocketAddr>) -> Self {
        use athenz_core::serving::dns;
        const TIMEOUT: Duration = Duration::from_secs(2);
        let resolver = match server {
            Some(addr) => Some(dns::resolver_via(addr, TIMEOUT)),
            None => dns::resolver_from(std::path::Path::new(SYSTEM_RESOLV_CONF), TIMEOUT)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "service IP lookups go through the system resolver")
                })
                .ok(),
        };
        Self {
            cluster_domain,
            resolver,
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
