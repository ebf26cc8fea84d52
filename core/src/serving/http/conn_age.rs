//! Every connection's maximum age (docs/design.md §6).
//!
//! A client's certificate is verified when its connection is made, and never again while the
//! connection lives. An HTTP/2 connection kept alive by its pings (or an HTTP/1.1 one kept busy)
//! would otherwise serve its client for ever: past its certificate's notAfter, past the removal
//! of its CA from a reloaded bundle. So every connection is closed gracefully, as at shutdown,
//! once it is [`MAX_CONNECTION_AGE`] old (the same bound as a TLS session's,
//! [`crate::tls::SESSION_MAX_AGE`]), or when its client certificate expires if that comes first:
//! no new request is read, in-flight requests finish, and the client reconnects and is verified
//! again. Plain TCP and Unix socket connections are aged alike: one rule for every connection.

use std::time::Duration;
use tokio::sync::watch;

/// How long a connection is served at most (5 minutes; [`super::ServerLimits`] can lower it).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// How long a connection may live: `limit`, or less when its client certificate has
/// `cert_left` before its notAfter.
pub(super) fn max_age(limit: Duration, cert_left: Option<Duration>) -> Duration {
    cert_left.map_or(limit, |left| left.min(limit))
}

/// Why a connection is being closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// The server is shutting down.
    Stopping,
    /// The connection reached its maximum age.
    Aged,
}

/// Resolves when the connection is to be closed: shutdown is signalled, or `max_age` passed.
pub(super) async fn closing(stopping: &mut watch::Receiver<bool>, max_age: Duration) -> Closing {
    tokio::select! {
        _ = stopping.wait_for(|stop| *stop) => Closing::Stopping,
        () = tokio::time::sleep(max_age) => Closing::Aged,
    }
}

#[cfg(test)]
mod tests;
