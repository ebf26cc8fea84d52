//! Name lookups through one given DNS server (a cluster's DNS Service), not the host's resolver:
//! a host process (the agent on the host network, a ZTS beside a cluster) asks the cluster's DNS
//! for the cluster's names, which the host's `/etc/resolv.conf` does not know.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The resolver [`resolver_via`] makes.
pub type Resolver = hickory_resolver::TokioResolver;

/// A resolver that asks only `server`, over UDP falling back to TCP, once per lookup, with
/// `timeout`, and keeps no answer cache: a Service deleted since the last lookup must not be
/// answered from memory.
pub fn resolver_via(server: SocketAddr, timeout: Duration) -> Resolver {
    use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
    let config = ResolverConfig::from_parts(
        None,
        Vec::new(),
        NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true),
    );
    let mut builder = hickory_resolver::TokioResolver::builder_with_config(
        config,
        hickory_resolver::name_server::TokioConnectionProvider::default(),
    );
    builder.options_mut().timeout = timeout;
    builder.options_mut().attempts = 1;
    builder.options_mut().cache_size = 0;
    builder.build()
}

/// The first address of the fully qualified `name` (no trailing dot needed), or `None` when
/// the server has none or does not answer within `deadline`.
pub async fn first_address(resolver: &Resolver, name: &str, deadline: Duration) -> Option<IpAddr> {
    let fqdn = format!("{}.", name.trim_end_matches('.'));
    let lookup = tokio::time::timeout(deadline, resolver.lookup_ip(fqdn)).await;
    lookup.ok()?.ok()?.iter().next()
}
