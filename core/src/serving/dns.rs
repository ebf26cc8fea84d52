//! Name lookups in process, through one given DNS server (a cluster's DNS Service: a host process,
//! the agent on the host network or a ZTS beside a cluster, asks the cluster's DNS for the
//! cluster's names, which the host's `/etc/resolv.conf` may not know) or through the name servers
//! a `resolv.conf` names. Either way no `getaddrinfo`: glibc's resolver reads `/etc/hosts` and
//! `nsswitch.conf` on every call and blocks a thread for it, which the agent paid once per
//! identity it issued (5 % of its CPU on the real node).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The resolver [`resolver_via`] makes.
pub type Resolver = hickory_resolver::TokioResolver;

/// How long an answer that a name does not exist (NXDOMAIN) is kept at most: for the
/// time-to-live its zone's SOA gave it, never longer than this. CoreDNS gives its cluster's names
/// 5 s (its `kubernetes` plugin's default `ttl`) and keeps an NXDOMAIN as long itself, so a
/// Service made since the last lookup is seen no later than by a pod asking CoreDNS. Most
/// files-mode pods have no Service of their account's name, and their agent asked CoreDNS so on
/// every publish. Found addresses are not kept: a Service deleted since the last lookup must not
/// be answered from memory, where it would put an address in a certificate request that the
/// callback refuses.
pub const MAX_NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// How many answers are kept: a node's pods name a few hundred service accounts at most.
const ANSWER_CACHE_SIZE: usize = 256;

/// A resolver that asks only `server`, over UDP falling back to TCP, once per lookup, with
/// `timeout`; it keeps no address it found, and a name's absence for its SOA's time-to-live up to
/// [`MAX_NEGATIVE_TTL`].
pub fn resolver_via(server: SocketAddr, timeout: Duration) -> Resolver {
    resolver_for(&[server], timeout)
}

/// [`resolver_via`] for `servers`, asked in order.
fn resolver_for(servers: &[SocketAddr], timeout: Duration) -> Resolver {
    use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
    let mut group = NameServerConfigGroup::new();
    for server in servers {
        group.merge(NameServerConfigGroup::from_ips_clear(
            &[server.ip()],
            server.port(),
            true,
        ));
    }
    let config = ResolverConfig::from_parts(None, Vec::new(), group);
    let mut builder = hickory_resolver::TokioResolver::builder_with_config(
        config,
        hickory_resolver::name_server::TokioConnectionProvider::default(),
    );
    builder.options_mut().timeout = timeout;
    builder.options_mut().attempts = 1;
    let options = builder.options_mut();
    options.cache_size = ANSWER_CACHE_SIZE;
    options.positive_max_ttl = Some(Duration::ZERO);
    options.negative_max_ttl = Some(MAX_NEGATIVE_TTL);
    builder.build()
}

/// The most of a `resolv.conf` read: real ones are a few hundred bytes.
const RESOLV_CONF_LIMIT: u64 = 64 * 1024;

/// Why a `resolv.conf` gave no resolver.
#[derive(Debug, thiserror::Error)]
pub enum ResolvConfError {
    /// It could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is larger than any real one.
    #[error("{path} is larger than {RESOLV_CONF_LIMIT} bytes")]
    TooLarge {
        /// The file.
        path: String,
    },
    /// It does not parse as a `resolv.conf`.
    #[error("{path} is not a resolv.conf: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// The parser's complaint.
        reason: String,
    },
    /// It names no name server.
    #[error("{path} names no nameserver")]
    NoNameServer {
        /// The file.
        path: String,
    },
}

/// The name servers `path` (a `resolv.conf`) names, each on port 53, in its order.
pub fn name_servers(path: &std::path::Path) -> Result<Vec<SocketAddr>, ResolvConfError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let read = |source| ResolvConfError::Read {
        path: shown.clone(),
        source,
    };
    let mut text = Vec::new();
    std::fs::File::open(path)
        .map_err(read)?
        .take(RESOLV_CONF_LIMIT + 1)
        .read_to_end(&mut text)
        .map_err(read)?;
    if text.len() as u64 > RESOLV_CONF_LIMIT {
        return Err(ResolvConfError::TooLarge { path: shown });
    }
    let parsed = resolv_conf::Config::parse(&text).map_err(|e| ResolvConfError::Malformed {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let servers: Vec<SocketAddr> = parsed
        .nameservers
        .iter()
        .map(|ns| SocketAddr::new(IpAddr::from(ns), 53))
        .collect();
    if servers.is_empty() {
        return Err(ResolvConfError::NoNameServer { path: shown });
    }
    Ok(servers)
}

/// A resolver that asks the name servers `resolv_conf` names (read once: a changed file takes
/// a restart), as [`resolver_via`] asks its one: in order, once per lookup each, with `timeout`,
/// absences kept as there. Its search domains are not used: callers look up absolute names.
pub fn resolver_from(
    resolv_conf: &std::path::Path,
    timeout: Duration,
) -> Result<Resolver, ResolvConfError> {
    Ok(resolver_for(&name_servers(resolv_conf)?, timeout))
}

/// The first address of the fully qualified `name` (no trailing dot needed), or `None` when
/// the server has none or does not answer within `deadline`.
///
/// An IPv4 address is asked for first and an IPv6 one only when the name exists without one.
/// An NXDOMAIN answer says the name has no records of any type (RFC 8020), so it ends the lookup:
/// most pods have no Service of their account's name, and the agent asks on the path of every
/// files-mode publish, where hickory's `lookup_ip` would ask a second time for nothing.
pub async fn first_address(resolver: &Resolver, name: &str, deadline: Duration) -> Option<IpAddr> {
    let fqdn = format!("{}.", name.trim_end_matches('.'));
    let lookup = async {
        match resolver.ipv4_lookup(fqdn.as_str()).await {
            Ok(found) => {
                if let Some(a) = found.iter().next() {
                    return Some(IpAddr::V4(a.0));
                }
            }
            Err(e) if e.is_nx_domain() => return None,
            Err(_) => {}
        }
        let found = resolver.ipv6_lookup(fqdn.as_str()).await.ok()?;
        found.iter().next().map(|aaaa| IpAddr::V6(aaaa.0))
    };
    tokio::time::timeout(deadline, lookup).await.ok()?
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
    use hickory_resolver::proto::rr::{RData, Record, RecordType, rdata::A, rdata::AAAA};
    use hickory_resolver::proto::serialize::binary::BinEncodable;

    fn resolv_conf(text: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_resolv_conf_names_its_servers_in_order() {
        let (_dir, path) = resolv_conf(
            b"# kubelet-written\nsearch default.svc.cluster.local svc.cluster.local\n\
              nameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5\n",
        );
        assert_eq!(
            name_servers(&path).unwrap(),
            [
                "10.96.0.10:53".parse::<SocketAddr>().unwrap(),
                "[fd00::a]:53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn a_bad_resolv_conf_is_refused_naming_the_file_and_why() {
        let (_dir, none) = resolv_conf(b"search cluster.local\noptions ndots:5\n");
        let err = name_servers(&none).unwrap_err();
        assert!(matches!(err, ResolvConfError::NoNameServer { .. }), "{err}");
        assert!(err.to_string().contains("resolv.conf names no nameserver"));

        let (_dir, malformed) = resolv_conf(b"nameserver not-an-address\n");
        let err = name_servers(&malformed).unwrap_err();
        assert!(matches!(err, ResolvConfError::Malformed { .. }), "{err}");

        let (_dir, binary) = resolv_conf(&[0xff, 0xfe, 0x00, b'\n', 0x80]);
        assert!(name_servers(&binary).is_err());

        let mut huge = b"nameserver 10.0.0.1\n".to_vec();
        huge.resize(RESOLV_CONF_LIMIT as usize + 1, b'#');
        let (_dir, huge) = resolv_conf(&huge);
        let err = name_servers(&huge).unwrap_err();
        assert!(matches!(err, ResolvConfError::TooLarge { .. }), "{err}");

        let err = name_servers(std::path::Path::new("/nonexistent/resolv.conf")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/resolv.conf"),
            "{err}"
        );
        assert!(resolver_from(&none, Duration::from_secs(1)).is_err());
    }

    /// A DNS server on loopback that knows `web.shop.svc.cluster.local.` (10.96.0.7) and
    /// `v6.shop.svc.cluster.local.` (fd00::7, no IPv4 address), and answers every other name
    /// NXDOMAIN, with its zone's SOA as CoreDNS does if `soa`; every answer has time-to-live
    /// `ttl`. It counts the queries it is asked.
    async fn dns_server(
        ttl: u32,
        soa: bool,
    ) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&asked);
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let query = Message::from_vec(&buf[..n]).unwrap();
                let mut answer = Message::new();
                answer
                    .set_id(query.id())
                    .set_message_type(MessageType::Response)
                    .set_op_code(query.op_code())
                    .set_recursion_desired(query.recursion_desired())
                    .set_recursion_available(true);
                answer.add_queries(query.queries().to_vec());
                for q in query.queries() {
                    let known = match (q.name().to_ascii().as_str(), q.query_type()) {
                        ("web.shop.svc.cluster.local.", RecordType::A) => {
                            Some(Some(RData::A(A::new(10, 96, 0, 7))))
                        }
                        ("v6.shop.svc.cluster.local.", RecordType::AAAA) => {
                            Some(Some(RData::AAAA(AAAA::new(0xfd00, 0, 0, 0, 0, 0, 0, 7))))
                        }
                        ("web.shop.svc.cluster.local." | "v6.shop.svc.cluster.local.", _) => {
                            Some(None)
                        }
                        _ => None,
                    };
                    match known {
                        Some(Some(rdata)) => {
                            answer.add_answer(Record::from_rdata(q.name().clone(), ttl, rdata));
                        }
                        // the name exists without that type: NOERROR and no answer (NODATA)
                        Some(None) => {}
                        None => {
                            answer.set_response_code(ResponseCode::NXDomain);
                            if soa {
                                answer.add_name_server(zone_soa(ttl));
                            }
                        }
                    }
                }
                socket
                    .send_to(&answer.to_bytes().unwrap(), peer)
                    .await
                    .unwrap();
            }
        });
        (addr, asked)
    }

    /// `cluster.local.`'s SOA as CoreDNS sends it with an NXDOMAIN, its minimum `ttl`.
    fn zone_soa(ttl: u32) -> Record {
        use hickory_resolver::proto::rr::{Name, rdata::SOA};
        let zone = Name::from_ascii("cluster.local.").unwrap();
        let soa = SOA::new(
            Name::from_ascii("ns.dns.cluster.local.").unwrap(),
            Name::from_ascii("hostmaster.cluster.local.").unwrap(),
            1,
            7200,
            1800,
            86400,
            ttl,
        );
        Record::from_rdata(zone, ttl, RData::SOA(soa))
    }

    fn asked_so_far(asked: &std::sync::atomic::AtomicUsize) -> usize {
        asked.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn the_resolver_finds_only_what_its_server_knows() {
        let (server, _) = dns_server(5, true).await;
        let resolver = resolver_via(server, Duration::from_secs(2));
        let lookup = |name| first_address(&resolver, name, Duration::from_secs(3));
        assert_eq!(
            lookup("web.shop.svc.cluster.local").await,
            Some("10.96.0.7".parse().unwrap())
        );
        assert_eq!(lookup("none.shop.svc.cluster.local.").await, None);
        assert_eq!(
            lookup("v6.shop.svc.cluster.local").await,
            Some("fd00::7".parse().unwrap()),
            "a name with only an IPv6 address is found by its second question"
        );
    }

    /// A name's absence is kept for its SOA's time-to-live and asked about again after it; a
    /// found address is asked for every time.
    #[tokio::test]
    async fn an_absence_is_kept_for_its_time_to_live_and_an_address_not_at_all() {
        let (server, asked) = dns_server(1, true).await;
        let resolver = resolver_via(server, Duration::from_secs(2));
        let lookup = |name| first_address(&resolver, name, Duration::from_secs(3));
        for _ in 0..3 {
            assert!(lookup("none.shop.svc.cluster.local").await.is_none());
        }
        assert_eq!(asked_so_far(&asked), 1, "one question within the TTL");
        for _ in 0..3 {
            assert!(lookup("web.shop.svc.cluster.local").await.is_some());
        }
        assert_eq!(asked_so_far(&asked), 4, "a found address is never kept");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(lookup("none.shop.svc.cluster.local").await.is_none());
        assert_eq!(asked_so_far(&asked), 5, "asked again once the TTL ran out");
    }

    /// An NXDOMAIN with a zero TTL, or without its zone's SOA, is not kept.
    #[tokio::test]
    async fn an_absence_without_a_time_to_live_is_not_kept() {
        for (ttl, soa, why) in [(0, true, "TTL 0"), (5, false, "no SOA, no time-to-live")] {
            let (server, asked) = dns_server(ttl, soa).await;
            let resolver = resolver_via(server, Duration::from_secs(2));
            for _ in 0..2 {
                let none = first_address(
                    &resolver,
                    "none.shop.svc.cluster.local",
                    Duration::from_secs(3),
                );
                assert!(none.await.is_none());
            }
            assert_eq!(asked_so_far(&asked), 2, "{why}");
        }
    }

    /// An hour-long TTL on an NXDOMAIN is kept no longer than [`MAX_NEGATIVE_TTL`].
    #[tokio::test]
    async fn a_long_time_to_live_is_cut_to_the_cap() {
        let (server, _) = dns_server(3600, true).await;
        let resolver = resolver_via(server, Duration::from_secs(2));
        let none = resolver
            .ipv4_lookup("none.shop.svc.cluster.local.")
            .await
            .unwrap_err();
        let negative_ttl = match none.proto().map(|p| p.kind()) {
            Some(hickory_resolver::proto::ProtoErrorKind::NoRecordsFound {
                negative_ttl, ..
            }) => *negative_ttl,
            other => panic!("not a negative answer: {other:?}"),
        };
        assert_eq!(negative_ttl, Some(5), "an NXDOMAIN kept {negative_ttl:?} s");
    }

    #[tokio::test]
    async fn a_name_that_does_not_exist_is_asked_about_once() {
        let (server, asked) = dns_server(5, true).await;
        let resolver = resolver_via(server, Duration::from_secs(2));
        let lookup = first_address(
            &resolver,
            "none.shop.svc.cluster.local",
            Duration::from_secs(3),
        );
        assert_eq!(lookup.await, None);
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "NXDOMAIN ends the lookup: no AAAA question follows it"
        );
        let exists_without_v4 = first_address(
            &resolver,
            "v6.shop.svc.cluster.local",
            Duration::from_secs(3),
        );
        assert!(exists_without_v4.await.is_some());
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "a name that exists without an IPv4 address is asked for IPv6 too"
        );
    }
}
