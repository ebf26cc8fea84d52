//! ZTS's calls to instance providers, as Athenz makes them (`InstanceHttpProvider`,
//! `InstanceProviderClient`, `ProviderHostnameVerifier` in `libs/java/instance_provider`):
//!
//! - a new client, so a new mutual-TLS connection, for every confirmation (`ZTSImpl` gets a
//!   fresh `InstanceHttpProvider` per request and closes it afterwards); no connection is pooled.
//!   Every client is made from ZTS's one `SSLContext` (`ZTSUtils.getAthenzServerSSLContext`,
//!   `TLSv1.2`), made at start-up, so TLS 1.2 only, and a new connection resumes the session
//!   of an earlier one to the same host and port when the provider's server still holds it;
//! - the provider's server certificate must chain to ZTS's trust store and have the provider's
//!   service name as its CN; its host names are not checked (`ProviderHostnameVerifier.verify`
//!   stands in for the host name check). This is checked in the handshake, before the attestation
//!   data is sent;
//! - `<endpoint>/instance` for launches, `<endpoint>/refresh` for refreshes
//!   (`postInstanceConfirmation`, `postRefreshConfirmation`);
//! - outcomes: 200 confirms with the provider's answer, read as Jersey and Jackson read it
//!   ([`super::provider_answer`]); a connect or read failure is `GATEWAY_TIMEOUT`; any other
//!   status is kept with the provider's answer text (newlines made spaces), as
//!   `ProviderResourceException(code, text)` whose message is `ResourceException (<code>): <text>`.
//!
//! Athenz's own `InstanceHttpProvider` is run beside this port on the same cases by
//! callback/tests/athenz_provider_client.rs (harness/peers/athenz/java): both must conclude the same.

use super::provider_addresses::ProviderAddresses;
use super::provider_answer;
use super::registry::ProviderEntry;
use athenz_core::client::{error_chain, read_limited};
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use rustls_pki_types::CertificateDer;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest provider answer read.
const MAX_ANSWER: usize = 256 * 1024;

/// `ProviderResourceException.GATEWAY_TIMEOUT`.
const GATEWAY_TIMEOUT: u16 = 504;

/// Which provider route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderRoute {
    /// `/instance`: a launch.
    Instance,
    /// `/refresh`: a refresh.
    Refresh,
}

/// The Java class Athenz's provider client reads a confirmation into (libs/java/instance_provider).
const CONFIRMATION: &str = "com.yahoo.athenz.instance.provider.InstanceConfirmation";

impl ProviderRoute {
    fn path(self) -> &'static str {
        match self {
            Self::Instance => "/instance",
            Self::Refresh => "/refresh",
        }
    }
}

/// A provider call that did not confirm: Athenz's `ProviderResourceException`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRefusal {
    /// The provider's status, or 504 when it could not be reached or did not answer.
    pub code: u16,
    /// `ResourceException (<code>): <text>`.
    pub message: String,
}

impl ProviderRefusal {
    fn new(code: u16, text: &str) -> Self {
        Self {
            code,
            message: format!("ResourceException ({code}): {}", text.replace('\n', " ")),
        }
    }

    /// Whether ZTS answers its own client 504 (else 403): only for a provider's 504, which
    /// includes no answer (`ZTSImpl.validateConfirmationData`).
    pub fn is_gateway_timeout(&self) -> bool {
        self.code == GATEWAY_TIMEOUT
    }
}

/// Makes a provider client per confirmation, from a TLS configuration made once per provider.
pub struct ProviderClients {
    cas: Vec<CertificateDer<'static>>,
    identity: ClientIdentity,
    timeout: Duration,
    configs: Mutex<HashMap<String, Arc<rustls::ClientConfig>>>,
    resolver: Option<athenz_core::serving::dns::Resolver>,
    addresses: ProviderAddresses,
}

impl ProviderClients {
    /// Clients that trust `cas` for provider servers and present `identity`.
    pub fn new(
        cas: Vec<CertificateDer<'static>>,
        identity: ClientIdentity,
        timeout: Duration,
    ) -> Self {
        Self {
            cas,
            identity,
            timeout,
            configs: Mutex::new(HashMap::new()),
            resolver: None,
            addresses: ProviderAddresses::default(),
        }
    }

    /// Resolves endpoint host names through `server` (when given) instead of the host's resolver.
    #[must_use]
    pub fn with_dns_server(mut self, server: Option<SocketAddr>) -> Self {
        self.resolver = server.map(|s| athenz_core::serving::dns::resolver_via(s, self.timeout));
        self
    }

    /// Where the endpoint's host name points, through the configured DNS server (an answer is
    /// reused for 30 s, as ZTS's JVM reuses it: [`ProviderAddresses`]); `None` when none is
    /// configured or the host is an address. A name the server cannot resolve is the provider
    /// being unreachable (504, as an unknown host is to ZTS).
    async fn resolve(&self, endpoint: &str) -> Result<Option<(String, SocketAddr)>, String> {
        let Some(resolver) = &self.resolver else {
            return Ok(None);
        };
        let url = reqwest::Url::parse(endpoint)
            .map_err(|e| format!("provider endpoint {endpoint}: {e}"))?;
        let Some(host) = url.host_str() else {
            return Ok(None);
        };
        if host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
        {
            return Ok(None);
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let ip = match self.addresses.get(host, Instant::now()) {
            Some(ip) => ip,
            None => {
                let ip = athenz_core::serving::dns::first_address(resolver, host, self.timeout)
                    .await
                    .ok_or_else(|| format!("provider endpoint host {host} has no address"))?;
                self.addresses.put(host, ip, Instant::now());
                ip
            }
        };
        Ok(Some((host.to_owned(), SocketAddr::new(ip, port))))
    }

    /// The TLS configuration for `provider`'s server, as ZTS's: TLS 1.2 only (ZTS's provider
    /// clients use the context `ZTSUtils.getAthenzServerSSLContext` makes with
    /// `SSLContext.getInstance("TLSv1.2")`), and one session cache for every confirmation. ZTS
    /// makes a new client and connection per confirmation, but they all share that one
    /// `SSLContext`, made at start-up, whose client session cache lets a new connection to the
    /// same host and port resume (docs/design.md §4.4).
    fn config(&self, provider: &str) -> Result<Arc<rustls::ClientConfig>, String> {
        let mut configs = self
            .configs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = configs.get(provider) {
            return Ok(c.clone());
        }
        let config = tls::client_config_expecting_cn_only(
            &self.cas,
            Some(self.identity.clone()),
            provider,
            &[&rustls::version::TLS12],
        )
        .map_err(|e| e.to_string())?;
        // the clients made from clones of this config share its session store
        let config = Arc::new(config);
        configs.insert(provider.to_owned(), config.clone());
        Ok(config)
    }

    /// A client used for one confirmation and dropped with its connection.
    fn client(
        &self,
        provider: &str,
        resolved: Option<(String, SocketAddr)>,
    ) -> Result<reqwest::Client, String> {
        let builder = match resolved {
            Some((host, addr)) => reqwest::Client::builder().resolve(&host, addr),
            None => reqwest::Client::builder(),
        };
        builder
            .tls_backend_preconfigured((*self.config(provider)?).clone())
            .timeout(self.timeout)
            .connect_timeout(self.timeout)
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())
    }

    /// Asks `provider` to confirm; returns its confirmation on 200.
    pub async fn confirm(
        &self,
        provider: &ProviderEntry,
        route: ProviderRoute,
        confirmation: &InstanceConfirmation,
    ) -> Result<InstanceConfirmation, ProviderRefusal> {
        let resolved = self
            .resolve(&provider.endpoint)
            .await
            .map_err(|e| ProviderRefusal::new(GATEWAY_TIMEOUT, &e))?;
        let client = self
            .client(&provider.name, resolved)
            .map_err(|e| ProviderRefusal::new(GATEWAY_TIMEOUT, &e))?;
        let url = format!(
            "{}{}",
            provider.endpoint.trim_end_matches('/'),
            route.path()
        );
        let resp = client
            .post(url)
            .json(confirmation)
            .send()
            .await
            .map_err(|e| ProviderRefusal::new(GATEWAY_TIMEOUT, &error_chain(&e)))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_limited(resp, MAX_ANSWER).await;
        if status != 200 {
            // `responseText`: the answer with newlines made spaces, or N/A if none could be read.
            return Err(ProviderRefusal::new(
                status,
                &provider_answer::refusal_text(body.as_deref().ok()),
            ));
        }
        // Whatever Athenz's client cannot read as a confirmation is an exception outside
        // ProviderResourceException: ZTS answers 403 (code 200 here says so).
        let unreadable = |why: String| ProviderRefusal {
            code: 200,
            message: format!("the provider's confirmation is unreadable: {why}"),
        };
        let body = body.map_err(|e| unreadable(e.to_string()))?;
        if !provider_answer::is_json(content_type.as_deref()) {
            // Jersey's words, as real ZTS passes them on (harness/testbed/data/zts-recorded.json,
            // register_provider_unreadable_200), with no "unreadable" prefix of ours
            return Err(ProviderRefusal {
                code: 200,
                message: format!(
                    "MessageBodyReader not found for media type={}, type=class {CONFIRMATION}, genericType=class {CONFIRMATION}.",
                    content_type
                        .as_deref()
                        .unwrap_or("application/octet-stream")
                ),
            });
        }
        provider_answer::read_confirmation(&body).map_err(unreadable)
    }
}
