//! How every TLS server here is configured, whatever its client CAs: the one place that sets
//! resumption, the session cache and the clock (docs/design.md §6).
//!
//! - TLS 1.2 session-ID resumption stays: ZTS resumes its sessions with the callback from its one
//!   long-lived `SSLContext` (docs/design.md §4.4). A session lives [`SESSION_MAX_AGE`] from its
//!   full handshake ([`ExpiringSessionCache`]); rustls stores it once and never again on a
//!   resumption, so a chain of resumptions ends then too. No TLS 1.2 tickets (rustls's default
//!   ticketer makes none): a ticket would carry the session past the cache's reach.
//! - No TLS 1.3 tickets (`send_tls13_tickets = 0`): on every resumed TLS 1.3 handshake rustls
//!   issues fresh tickets carrying the original client chain, stamped now, so a client
//!   reconnecting within each ticket's life would never be verified again. Our TLS 1.3 clients
//!   keep their connections and gain nothing from resuming.
//! - A resumed session is verified again by the HTTP layer before it serves
//!   ([`super::ResumedSessionCheck`]), with the verifier given to the config here: the config
//!   and its check are built together and handed on together ([`ServerTls`]), since rustls keeps
//!   a config's verifier private. A reloading client CA bundle empties the config's session cache
//!   when it changes ([`ReloadingClientCa::forget_sessions_on_change`]).
//! - The clock (rustls's `time_provider`) is the system clock, or one a test moves
//!   ([`super::clock::ManualClock`]): certificate validity, session age and the time left on a
//!   client certificate are all read from it.

use super::session_cache::SESSION_CAPACITY;
use super::{
    ClientAuth, ExpiringSessionCache, ReloadingClientCa, ResumedSessionCheck, SESSION_MAX_AGE,
    TlsError, provider, root_store,
};
use rustls::ServerConfig;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::time_provider::TimeProvider;
use rustls_pki_types::CertificateDer;
use std::sync::Arc;

/// Whom a server accepts as clients.
#[derive(Debug, Clone)]
pub enum ClientCas<'a> {
    /// Clients whose certificate chains to one of these CAs, under `ClientAuth`'s policy.
    Fixed(&'a [CertificateDer<'static>], ClientAuth),
    /// Clients whose certificate chains to the bundle as it is read now (a certificate is
    /// required).
    Reloading(Arc<ReloadingClientCa>),
    /// Any client: no certificate is asked (the admission webhook only).
    NotAsked,
}

/// What a TLS server serves with: the rustls config, and the check of its resumed sessions made
/// with the same verifier and clock as the config (docs/design.md §6). Only the builders here
/// make one, so a server never holds a config without the check that belongs to it.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    resumed: Arc<ResumedSessionCheck>,
}

impl ServerTls {
    /// The rustls config, for an acceptor (`tokio_rustls::TlsAcceptor::from`) or a
    /// `rustls::ServerConnection`. Whoever accepts with it outside `Server::with_tls` must ask
    /// [`Self::resumed_sessions`] about each connection before serving it.
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// The check of this config's resumed sessions, and of the time left on a client
    /// certificate, on the config's clock.
    pub fn resumed_sessions(&self) -> &Arc<ResumedSessionCheck> {
        &self.resumed
    }
}

/// A server config presenting `identity`, accepting `client_cas`, on `clock`. The four
/// `server_config*` functions are this on the system clock; tests pass a
/// [`super::clock::ManualClock`].
pub fn server_config_on_clock(
    identity: Arc<dyn ResolvesServerCert>,
    client_cas: ClientCas<'_>,
    clock: Arc<dyn TimeProvider>,
) -> Result<ServerTls, TlsError> {
    let cache =
        ExpiringSessionCache::with_clock(SESSION_CAPACITY, SESSION_MAX_AGE, Arc::clone(&clock));
    let builder = ServerConfig::builder_with_details(provider(), Arc::clone(&clock))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let (builder, resumed) = match client_cas {
        ClientCas::Fixed(cas, client_auth) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(root_store(cas)?, provider());
            let verifier = match client_auth {
                ClientAuth::Required => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            }
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
            (
                builder.with_client_cert_verifier(Arc::clone(&verifier)),
                ResumedSessionCheck::verifying(clock, verifier),
            )
        }
        ClientCas::Reloading(client_ca) => {
            client_ca.forget_sessions_on_change(&cache);
            let verifier: Arc<dyn ClientCertVerifier> = client_ca;
            (
                builder.with_client_cert_verifier(Arc::clone(&verifier)),
                ResumedSessionCheck::verifying(clock, verifier),
            )
        }
        ClientCas::NotAsked => (
            builder.with_no_client_auth(),
            ResumedSessionCheck::no_client_certificates(clock),
        ),
    };
    let mut config = builder.with_cert_resolver(identity);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::clone(&cache) as _;
    Ok(ServerTls {
        config: Arc::new(config),
        resumed: Arc::new(resumed),
    })
}
