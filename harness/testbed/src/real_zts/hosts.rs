//! Names ZTS's JVM must resolve that only another DNS server knows: a provider endpoint named
//! after its in-cluster Service (`https://athenz-callback.k8s-admin.svc.cluster.local`), which
//! the dev ZTS resolves through [`DevZtsConfig::provider_dns_server`]. The JVM has no
//! per-process DNS server; it takes a hosts file instead (`-Djdk.net.hosts.file`, read on every
//! lookup, and then the only source of names). So this writes one: the machine's own names
//! (ZTS looks up its host name at start), and each provider endpoint's host as that server
//! answers for it, asked again every [`REFRESH`] while ZTS runs (a Service may appear after
//! ZTS starts, as the cluster's callback does).

use super::RealZtsError;
use crate::zts::DevZtsConfig;
use athenz_core::serving::dns::{Resolver, first_address, resolver_via};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the endpoints' names are asked again.
pub(super) const REFRESH: Duration = Duration::from_secs(5);
/// How long one name may take to answer.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// The hosts file ZTS reads and how its provider names are resolved.
pub(super) struct HostsFile {
    path: PathBuf,
    names: Vec<String>,
    resolver: Resolver,
}

impl HostsFile {
    /// `None` when the settings name no DNS server for providers (ZTS then uses the host's
    /// resolver, as the dev ZTS does).
    pub(super) fn for_settings(settings: &DevZtsConfig, path: PathBuf) -> Option<Self> {
        let server: SocketAddr = settings.provider_dns_server?;
        Some(Self {
            path,
            names: endpoint_names(settings),
            resolver: resolver_via(server, LOOKUP_TIMEOUT),
        })
    }

    /// The file's path, for `-Djdk.net.hosts.file`.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves every endpoint name now and rewrites the file when what it says changed; a
    /// name the server does not know yet is left out (ZTS then finds no address, as it would
    /// through DNS).
    pub(super) async fn refresh(&self) -> Result<(), RealZtsError> {
        let mut addresses = BTreeMap::new();
        for name in &self.names {
            if let Some(ip) = first_address(&self.resolver, name, LOOKUP_TIMEOUT).await {
                addresses.insert(name.clone(), ip);
            }
        }
        let text = render(&machine_name(), &addresses);
        if std::fs::read_to_string(&self.path).ok().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        let temporary = self.path.with_extension("tmp");
        crate::pki::write_file(&temporary, text.as_bytes(), 0o644)?;
        std::fs::rename(&temporary, &self.path).map_err(|source| RealZtsError::Io {
            what: format!("moving {} into place", self.path.display()),
            source,
        })
    }

    /// Refreshes every [`REFRESH`] until the task is aborted (when ZTS stops); a failed round is
    /// logged and tried again.
    pub(super) fn spawn_refresher(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "refreshing ZTS's hosts file");
                }
            }
        })
    }
}

/// The host names of the providers' endpoints (addresses need no name).
fn endpoint_names(settings: &DevZtsConfig) -> Vec<String> {
    let mut names: Vec<String> = settings
        .providers
        .iter()
        .filter_map(|p| reqwest::Url::parse(&p.endpoint).ok())
        .filter_map(|url| url.host_str().map(str::to_owned))
        .filter(|host| host.trim_matches(['[', ']']).parse::<IpAddr>().is_err())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// This machine's host name (ZTS names itself with it), `localhost` when unknown.
fn machine_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|n| n.trim().to_owned())
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The file: loopback for the machine's names, then each resolved name.
fn render(machine: &str, addresses: &BTreeMap<String, IpAddr>) -> String {
    let mut text = format!("127.0.0.1 localhost {machine}\n::1 localhost\n");
    for (name, ip) in addresses {
        text.push_str(&format!("{ip} {name}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zts::registry::ProviderEntry;

    fn provider(endpoint: &str) -> ProviderEntry {
        ProviderEntry {
            name: "k8s.admin.athenz-callback".into(),
            endpoint: endpoint.into(),
            dns_suffixes: Vec::new(),
            launch: Vec::new(),
        }
    }

    #[test]
    fn only_endpoint_names_are_looked_up_and_only_with_a_dns_server() {
        let mut settings = DevZtsConfig {
            providers: vec![
                provider("https://athenz-callback.k8s-admin.svc.cluster.local:443"),
                provider("https://127.0.0.1:9443/callback"),
                provider("https://[::1]:9443/callback"),
                provider("not a url"),
            ],
            ..DevZtsConfig::default()
        };
        assert!(HostsFile::for_settings(&settings, "/h".into()).is_none());
        assert_eq!(
            endpoint_names(&settings),
            ["athenz-callback.k8s-admin.svc.cluster.local"]
        );
        settings.provider_dns_server = Some(([127, 0, 0, 1], 53).into());
        assert!(HostsFile::for_settings(&settings, "/h".into()).is_some());
    }

    #[test]
    fn the_file_names_the_machine_and_each_resolved_endpoint() {
        let addresses = BTreeMap::from([(
            "athenz-callback.k8s-admin.svc.cluster.local".to_owned(),
            IpAddr::from([10, 96, 0, 20]),
        )]);
        assert_eq!(
            render("node-1", &addresses),
            "127.0.0.1 localhost node-1\n::1 localhost\n\
             10.96.0.20 athenz-callback.k8s-admin.svc.cluster.local\n"
        );
    }

    /// A DNS server on loopback answering every A question with `ip` (AAAA: no address).
    async fn dns_answering(ip: std::net::Ipv4Addr) -> SocketAddr {
        use hickory_resolver::proto::op::{Message, MessageType};
        use hickory_resolver::proto::rr::{RData, Record, RecordType, rdata::A};
        use hickory_resolver::proto::serialize::binary::BinEncodable;
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((len, from)) = socket.recv_from(&mut buf).await {
                let Ok(query) = Message::from_vec(&buf[..len]) else {
                    continue;
                };
                let mut answer = Message::new();
                answer
                    .set_id(query.id())
                    .set_message_type(MessageType::Response)
                    .set_op_code(query.op_code())
                    .set_recursion_desired(query.recursion_desired())
                    .set_recursion_available(true)
                    .add_queries(query.queries().to_vec());
                for q in query.queries() {
                    if q.query_type() == RecordType::A {
                        answer.add_answer(Record::from_rdata(
                            q.name().clone(),
                            60,
                            RData::A(A(ip)),
                        ));
                    }
                }
                let _ = socket.send_to(&answer.to_bytes().unwrap(), from).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_endpoint_name_is_written_as_the_server_answers_it_and_rewritten_when_it_moves() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = "https://athenz-callback.k8s-admin.svc.cluster.local:443";
        let mut settings = DevZtsConfig {
            providers: vec![provider(endpoint)],
            provider_dns_server: Some(dns_answering([10, 96, 0, 20].into()).await),
            ..DevZtsConfig::default()
        };
        let hosts = HostsFile::for_settings(&settings, dir.path().join("hosts")).unwrap();
        hosts.refresh().await.unwrap();
        let text = std::fs::read_to_string(hosts.path()).unwrap();
        assert!(
            text.ends_with("10.96.0.20 athenz-callback.k8s-admin.svc.cluster.local\n"),
            "{text}"
        );

        // the Service is made again with another address: the next round says so
        settings.provider_dns_server = Some(dns_answering([10, 96, 7, 7].into()).await);
        let moved = HostsFile::for_settings(&settings, dir.path().join("hosts")).unwrap();
        moved.refresh().await.unwrap();
        let text = std::fs::read_to_string(moved.path()).unwrap();
        assert!(
            text.contains("10.96.7.7 athenz-callback") && !text.contains("10.96.0.20"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_name_the_server_does_not_answer_is_left_out_and_the_file_still_written() {
        let dir = tempfile::tempdir().unwrap();
        // a DNS server that is not there: nothing answers on this loopback port
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let settings = DevZtsConfig {
            providers: vec![provider("https://callback.example.test:443")],
            provider_dns_server: Some(silent.local_addr().unwrap()),
            ..DevZtsConfig::default()
        };
        let hosts = HostsFile::for_settings(&settings, dir.path().join("hosts")).unwrap();
        hosts.refresh().await.unwrap();
        let text = std::fs::read_to_string(hosts.path()).unwrap();
        assert!(text.starts_with("127.0.0.1 localhost "), "{text}");
        assert!(!text.contains("callback.example.test"), "{text}");
    }
}
