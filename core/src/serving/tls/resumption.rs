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
//! rustls keeps a `ServerConfig`'s verifier private, and the HTTP layer is handed only the config
//! (`Server::with_tls`). The config builders here therefore record each config's verifier by its
//! session cache ([`register`]), which every clone of the config shares, and
//! [`ResumedSessionCheck::for_config`] finds it again. A config built elsewhere has no record:
//! its resumed sessions are held to the validity period of their leaf certificate only.

use super::ExpiringSessionCache;
use crate::crypto::CertInfo;
use rustls::server::danger::ClientCertVerifier;
use rustls::time_provider::TimeProvider;
use rustls::{HandshakeKind, ServerConfig, ServerConnection};
use std::sync::{Arc, Mutex, PoisonError, Weak};
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
    /// The session's leaf certificate is outside its validity period now (a config whose
    /// verifier is not known here).
    #[error("the resumed session's client certificate is not valid now")]
    NotValidNow,
    /// The session's leaf certificate does not parse.
    #[error("the resumed session's client certificate does not parse")]
    Unreadable,
    /// The server's clock gave no time.
    #[error("the server's clock gives no time")]
    NoClock,
}

/// What the HTTP layer checks on every TLS connection of a server: resumed sessions against the
/// server's verifier, and how long the client's certificate has left, both on the server's clock.
pub struct ResumedSessionCheck {
    clock: Arc<dyn TimeProvider>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl std::fmt::Debug for ResumedSessionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumedSessionCheck")
            .field("clock", &self.clock)
            .field("verifier_known", &self.verifier.is_some())
            .finish()
    }
}

impl ResumedSessionCheck {
    /// The check of connections accepted with `config`: its clock, and its verifier when the
    /// config was built here.
    pub fn for_config(config: &ServerConfig) -> Self {
        Self {
            clock: Arc::clone(&config.time_provider),
            verifier: registered_verifier(config),
        }
    }

    /// Whether the server's verifier is known (the config was built here).
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
        let now = self
            .clock
            .current_time()
            .ok_or(ResumptionRefused::NoClock)?;
        match &self.verifier {
            Some(verifier) => verifier
                .verify_client_cert(leaf, intermediates, now)
                .map(drop)
                .map_err(ResumptionRefused::Untrusted),
            None => {
                let info =
                    CertInfo::from_der(leaf.as_ref()).map_err(|_| ResumptionRefused::Unreadable)?;
                let now = i64::try_from(now.as_secs())
                    .ok()
                    .and_then(|secs| OffsetDateTime::from_unix_timestamp(secs).ok())
                    .ok_or(ResumptionRefused::NoClock)?;
                // as webpki: valid from notBefore through notAfter, both included
                if info.not_before <= now && now <= info.not_after {
                    Ok(())
                } else {
                    Err(ResumptionRefused::NotValidNow)
                }
            }
        }
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

/// A config's verifier, recorded by the config's session cache.
struct Registered {
    cache: Weak<ExpiringSessionCache>,
    verifier: Arc<dyn ClientCertVerifier>,
}

/// Every config built here that verifies clients. An entry lives until its cache is dropped
/// (pruned at the next registration); its `Weak` keeps the cache's address from being reused,
/// so an address matches one cache only.
static REGISTERED: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

/// Records that the config whose session storage is `cache` verifies clients with `verifier`.
pub(super) fn register(cache: &Arc<ExpiringSessionCache>, verifier: Arc<dyn ClientCertVerifier>) {
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    registered.retain(|entry| entry.cache.strong_count() > 0);
    registered.push(Registered {
        cache: Arc::downgrade(cache),
        verifier,
    });
}

fn registered_verifier(config: &ServerConfig) -> Option<Arc<dyn ClientCertVerifier>> {
    let storage = Arc::as_ptr(&config.session_storage).cast::<()>();
    REGISTERED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|entry| {
            entry.cache.strong_count() > 0 && entry.cache.as_ptr().cast::<()>() == storage
        })
        .map(|entry| Arc::clone(&entry.verifier))
}

#[cfg(test)]
mod tests;
