//! A resumed TLS session is verified again before its connection serves anything.
//!
//! On a resumed handshake rustls takes the client's chain from the stored session and asks the
//! verifier nothing: the chain was verified at the session's full handshake, up to
//! [`super::SESSION_MAX_AGE`] earlier. Since then the client certificate may have expired, or its
//! CA may have been removed from a reloaded bundle ([`super::ReloadingClientCa`]). So the HTTP
//! layer asks [`ResumedSessionCheck::check`] after every handshake, and closes a resumed
//! connection whose chain the server's verifier refuses now, before reading any request
//! (docs/design.md §6).
//!
//! rustls keeps a `ServerConfig`'s verifier private, so the check cannot be derived from a
//! config. It is made with the config instead, by [`super::server_config_on_clock`], from the
//! very verifier (and clock) the config was given, and the two travel together as a
//! [`super::ServerTls`], the only thing `Server::with_tls` accepts. A check that verifies no
//! chain exists only for the config that asks clients for no certificate
//! ([`ResumedSessionCheck::no_client_certificates`]), and it refuses any resumed session that
//! carries one.

use rustls::server::danger::ClientCertVerifier;
use rustls::time_provider::TimeProvider;
use rustls::{HandshakeKind, ServerConnection};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use time::OffsetDateTime;

/// Why a resumed connection is refused.
#[derive(Debug, Error)]
pub enum ResumptionRefused {
    /// The server's verifier refuses the session's chain now (expired, or its CA no longer
    /// trusted).
    #[error("the resumed session's client certificate is no longer accepted: {0}")]
    Untrusted(rustls::Error),
    /// The session carries a client certificate, on a server that asks for none: nothing here
    /// verified it.
    #[error("the resumed session carries a client certificate this server never asks for")]
    CertificateNotAsked,
    /// The server's clock gave no time.
    #[error("the server's clock gives no time")]
    NoClock,
}

/// What the HTTP layer checks on every TLS connection of a server: resumed sessions against the
/// server's verifier, and how long the client's certificate has left, both on the server's clock.
/// Made only with its config ([`super::ServerTls`]).
pub struct ResumedSessionCheck {
    clock: Arc<dyn TimeProvider>,
    /// The config's client-certificate verifier; `None` only for a config that asks for no
    /// client certificate.
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl std::fmt::Debug for ResumedSessionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumedSessionCheck")
            .field("clock", &self.clock)
            .field("verifies_chains", &self.verifier.is_some())
            .finish()
    }
}

impl ResumedSessionCheck {
    /// The check of a config that verifies client certificates with `verifier` on `clock`: the
    /// same verifier and clock the config was built with.
    pub(super) fn verifying(
        clock: Arc<dyn TimeProvider>,
        verifier: Arc<dyn ClientCertVerifier>,
    ) -> Self {
        Self {
            clock,
            verifier: Some(verifier),
        }
    }

    /// The check of a config on `clock` that asks for no client certificate (the admission
    /// webhook's): a resumed session has no chain to verify, and one that carries a chain is
    /// refused.
    pub(super) fn no_client_certificates(clock: Arc<dyn TimeProvider>) -> Self {
        Self {
            clock,
            verifier: None,
        }
    }

    /// Whether resumed chains are verified (false only for a config that asks for no client
    /// certificate).
    pub fn verifies_chains(&self) -> bool {
        self.verifier.is_some()
    }

    /// Accepts a full handshake (its chain was just verified) and a resumed one whose client
    /// chain the verifier accepts now; a session without a client certificate (a server that
    /// asks none, or lets a client go without) has nothing to check.
    pub fn check(&self, conn: &ServerConnection) -> Result<(), ResumptionRefused> {
        if conn.handshake_kind() != Some(HandshakeKind::Resumed) {
            return Ok(());
        }
        let Some((leaf, intermediates)) = conn
            .peer_certificates()
            .and_then(|chain| chain.split_first())
        else {
            return Ok(());
        };
        let verifier = self
            .verifier
            .as_ref()
            .ok_or(ResumptionRefused::CertificateNotAsked)?;
        let now = self
            .clock
            .current_time()
            .ok_or(ResumptionRefused::NoClock)?;
        verifier
            .verify_client_cert(leaf, intermediates, now)
            .map(drop)
            .map_err(ResumptionRefused::Untrusted)
    }

    /// How long until `not_after` (a client certificate's), on the server's clock; zero once it
    /// is past, or when the clock gives no time.
    pub fn time_left(&self, not_after: OffsetDateTime) -> Duration {
        let Some(now) = self.clock.current_time() else {
            return Duration::ZERO;
        };
        let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        u64::try_from(not_after.unix_timestamp().saturating_sub(now))
            .map_or(Duration::ZERO, Duration::from_secs)
    }
}

#[cfg(test)]
mod tests;
