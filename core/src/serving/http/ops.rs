//! What every daemon serves besides its API: `GET /healthz`, `GET /readyz` and `GET /metrics` on
//! its operations address, the readiness flag behind `/readyz`, and the stop signal.

use super::{Body, ConnInfo, Handler, error_response, internal_error};
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Resolves when the process is asked to stop (SIGTERM, as Kubernetes sends, or SIGINT / Ctrl-C).
/// Pass it to [`Server::serve`] so in-flight requests drain within the grace period.
pub async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received; draining"),
                _ = int.recv() => tracing::info!("SIGINT received; draining"),
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            // Without signal handling the daemon can only be killed; say so and wait forever.
            tracing::error!(error = %e, "cannot install signal handlers");
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves `delay` after the process is asked to stop ([`termination_signal`]), or at once on a
/// second signal: a server stopped by it goes on accepting for `delay` (the drain delay of
/// `OpsArgs`), long enough for its Service endpoint to be removed everywhere.
pub async fn termination_signal_after(delay: std::time::Duration) {
    termination_signal().await;
    if delay.is_zero() {
        return;
    }
    tracing::info!(
        seconds = delay.as_secs_f64(),
        "still accepting while the endpoint is removed"
    );
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        () = termination_signal() => {}
    }
}

/// Whether the process is ready to serve; flipped by the daemon as its dependencies come up.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The operations endpoint of every daemon: `GET /healthz`, `GET /readyz`, `GET /metrics`.
pub struct OpsHandler {
    registry: Arc<Registry>,
    readiness: Readiness,
}

impl OpsHandler {
    /// Serves `registry` and reports `readiness`.
    pub fn new(registry: Arc<Registry>, readiness: Readiness) -> Self {
        Self {
            registry,
            readiness,
        }
    }
}

impl Handler for OpsHandler {
    async fn handle(&self, req: Request<Bytes>, _conn: Arc<ConnInfo>) -> Response<Body> {
        if req.method() != http::Method::GET {
            return error_response(StatusCode::METHOD_NOT_ALLOWED, "only GET is served here");
        }
        match req.uri().path() {
            "/healthz" => text_response(StatusCode::OK, "ok\n", "text/plain"),
            "/readyz" if self.readiness.is_ready() => {
                text_response(StatusCode::OK, "ready\n", "text/plain")
            }
            "/readyz" => {
                text_response(StatusCode::SERVICE_UNAVAILABLE, "not ready\n", "text/plain")
            }
            "/metrics" => match crate::telemetry::encode_metrics(&self.registry) {
                Ok(text) => text_response(
                    StatusCode::OK,
                    text,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
                Err(_) => internal_error(),
            },
            _ => error_response(StatusCode::NOT_FOUND, "no such route"),
        }
    }

    fn route(&self, req: &http::request::Parts) -> &'static str {
        match req.uri.path() {
            "/healthz" => "healthz",
            "/readyz" => "readyz",
            "/metrics" => "metrics",
            _ => "other",
        }
    }
}

fn text_response(
    status: StatusCode,
    body: impl Into<Bytes>,
    content_type: &'static str,
) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| internal_error())
}
