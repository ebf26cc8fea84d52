//! `refresh` with the operations endpoint every daemon has (/healthz, /readyz, /metrics), served
//! by the daemons' own [`serve_ops`] so probes and scrapes see the same routes and formats.

use crate::identity::ControlSia;
use crate::metrics::Metrics;
use athenz_core::daemon::{Shutdown, serve_ops};
use std::future::Future;
use std::sync::Arc;
use thiserror::Error;

/// The bound operations address could not be served.
#[derive(Debug, Error)]
#[error("operations endpoint {addr}: {source}")]
pub struct OpsError {
    /// The address, as bound (or `?` when even that is unknown).
    pub addr: String,
    pub source: std::io::Error,
}

/// Runs [`crate::run::refresh`] until `stop`, serving its metrics and readiness on `listener`
/// (bound at start by [`crate::config::RefreshSettings::bind_ops`]) when there is one. The ops
/// server stops after the loop, so `/readyz` answers until the very end.
pub async fn refresh_serving(
    sia: &ControlSia,
    listener: Option<std::net::TcpListener>,
    stop: impl Future<Output = ()>,
) -> Result<(), OpsError> {
    let settings = sia.settings();
    let (metrics, registry) = Metrics::new(format!("{}.{}", settings.domain, settings.service));
    let shutdown = Shutdown::new();
    let server = match listener {
        Some(listener) => {
            let addr = listener
                .local_addr()
                .map_or_else(|_| "?".to_owned(), |a| a.to_string());
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|source| OpsError {
                    addr: addr.clone(),
                    source,
                })?;
            tracing::info!(ops = %addr, "operations endpoint listening");
            Some(tokio::spawn(serve_ops(
                listener,
                Arc::new(registry),
                metrics.readiness(),
                shutdown.wait(),
            )))
        }
        None => None,
    };
    crate::run::refresh(sia, &metrics, stop).await;
    shutdown.trigger();
    if let Some(server) = server {
        let _ = server.await;
    }
    Ok(())
}
