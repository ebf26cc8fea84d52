//! The optional lookup of a pod's Kubernetes service IP, for a service IP SAN.

use std::net::IpAddr;
use std::time::Duration;

/// Looks up a pod's Kubernetes service in DNS.
pub struct ServiceDns {
    cluster_domain: String,
    resolver: Option<hickory_resolver::TokioResolver>,
}

impl ServiceDns {
    /// Looks names up under `cluster_domain`, through `server` or the system resolver.
    pub fn new(cluster_domain: String, server: Option<std::net::SocketAddr>) -> Self {
        use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
        let resolver = server.map(|addr| {
            let config = ResolverConfig::from_parts(
                None,
                Vec::new(),
                NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true),
            );
            let mut builder = hickory_resolver::TokioResolver::builder_with_config(
                config,
                hickory_resolver::name_server::TokioConnectionProvider::default(),
            );
            builder.options_mut().timeout = Duration::from_secs(2);
            builder.options_mut().attempts = 1;
            // no answer cache: a Service deleted since the last lookup must not put its old IP
            // in a CSR the callback would then refuse; one query per init is cheap
            builder.options_mut().cache_size = 0;
            builder.build()
        });
        Self {
            cluster_domain,
            resolver,
        }
    }

    /// The first address of `<service>.<namespace>.svc.<cluster-domain>`, within 2 s.
    pub async fn lookup(&self, service: &str, namespace: &str) -> Option<IpAddr> {
        let name = format!("{service}.{namespace}.svc.{}", self.cluster_domain);
        match &self.resolver {
            Some(resolver) => {
                let lookup = tokio::time::timeout(
                    Duration::from_secs(3),
                    resolver.lookup_ip(format!("{name}.")),
                )
                .await;
                lookup.ok()?.ok()?.iter().next()
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
