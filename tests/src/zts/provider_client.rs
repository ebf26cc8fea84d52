//! ZTS's calls to instance providers: mutual TLS with ZTS's own certificate, the provider's
//! server certificate CN required to be the provider's name (checked in the handshake, before the
//! attestation data is sent), `<endpoint>/instance` for launches and `<endpoint>/refresh` for
//! refreshes, and the Athenz outcome rules: 200 confirms, anything else denies with the provider's
//! message, no answer is a gateway timeout.

use super::registry::ProviderEntry;
use athenz_core::client::{error_chain, read_limited};
use athenz_core::http::ErrorBody;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use rustls_pki_types::CertificateDer;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Largest provider answer read.
const MAX_ANSWER: usize = 256 * 1024;

/// Which provider route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderRoute {
    /// `/instance`: a launch.
    Instance,
    /// `/refresh`: a refresh.
    Refresh,
}

impl ProviderRoute {
    fn path(self) -> &'static str {
        match self {
            Self::Instance => "/instance",
            Self::Refresh => "/refresh",
        }
    }
}

/// How a provider call ended, when it did not confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    /// The provider answered non-200; its message.
    Denied(String),
    /// No answer (connect, TLS, timeout).
    Unreachable(String),
}

/// Clients for every provider, built on first use.
pub struct ProviderClients {
    cas: Vec<CertificateDer<'static>>,
    identity: ClientIdentity,
    timeout: Duration,
    clients: Mutex<HashMap<String, reqwest::Client>>,
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
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn client(&self, provider: &str) -> Result<reqwest::Client, String> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = clients.get(provider) {
            return Ok(c.clone());
        }
        let config = tls::client_config_expecting(&self.cas, Some(self.identity.clone()), provider)
            .map_err(|e| e.to_string())?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .timeout(self.timeout)
            .connect_timeout(self.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        clients.insert(provider.to_owned(), client.clone());
        Ok(client)
    }

    /// Asks `provider` to confirm; returns its (echoed) confirmation on 200.
    pub async fn confirm(
        &self,
        provider: &ProviderEntry,
        route: ProviderRoute,
        confirmation: &InstanceConfirmation,
    ) -> Result<InstanceConfirmation, ProviderOutcome> {
        let client = self
            .client(&provider.name)
            .map_err(ProviderOutcome::Unreachable)?;
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
            .map_err(|e| ProviderOutcome::Unreachable(error_chain(&e)))?;
        let status = resp.status();
        let body = read_limited(resp, MAX_ANSWER)
            .await
            .map_err(|e| ProviderOutcome::Unreachable(e.to_string()))?;
        if status != reqwest::StatusCode::OK {
            let message = serde_json::from_slice::<ErrorBody>(&body)
                .map(|e| e.message)
                .unwrap_or_else(|_| {
                    athenz_core::names::Quoted::new(&String::from_utf8_lossy(&body)).to_string()
                });
            return Err(ProviderOutcome::Denied(format!(
                "provider answered {}: {message}",
                status.as_u16()
            )));
        }
        serde_json::from_slice(&body).map_err(|e| {
            ProviderOutcome::Denied(format!("provider answered an unreadable confirmation: {e}"))
        })
    }
}
