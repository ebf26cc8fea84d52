//! What the Kubernetes API stand-in can be told to show, as a real API server shows it: a port
//! that refuses connections (down), answers of 429/5xx with a `Status` (overloaded or failing),
//! single-pod reads that find nothing (a deleted pod).

use super::{ApiHandler, status};
use athenz_core::http::{Body, Listener, Server};
use http::{Response, StatusCode};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16};

/// Faults the stand-in shows while they are set (chaos runs and tests inject them).
#[derive(Debug, Default)]
pub(super) struct ApiFaults {
    /// Single-pod reads answer 404, as for a deleted pod.
    pub(super) pod_reads_missing: AtomicBool,
    /// Every request is answered with this status (0: none) and a Kubernetes `Status`, as an
    /// overloaded or failing API server answers.
    pub(super) answer_status: AtomicU16,
}

/// The `Status` a failing API server answers with `code`, and its `Retry-After` (the API
/// server's priority and fairness sends one with every 429).
pub(super) fn failure(code: StatusCode) -> Response<Body> {
    let reason = match code.as_u16() {
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    };
    let mut response = status(
        code,
        reason,
        format!("the API stand-in is told to fail ({code})"),
    );
    if code == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
    }
    response
}

/// Whether the stand-in's port takes connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Serving {
    /// Listening.
    Up,
    /// The port closed: connections are refused, as with an API server that is down.
    Unreachable,
    /// Stopped for good.
    Stopped,
}

/// Serves on `listener` while the state is [`Serving::Up`]; closes the port while it is
/// [`Serving::Unreachable`] and binds `addr` again when it is up again; ends at
/// [`Serving::Stopped`]. Each state is reported on `in_force` once it holds: up once the port is
/// bound (a connection made then is taken), unreachable once the port is closed.
pub(super) async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    handler: Arc<ApiHandler>,
    mut watch: tokio::sync::watch::Receiver<Serving>,
    in_force: tokio::sync::watch::Sender<Serving>,
) {
    let mut listener = Some(listener);
    loop {
        let state = *watch.borrow_and_update();
        match state {
            Serving::Stopped => return,
            Serving::Unreachable => {
                // the first listener too, if the port is closed before it was ever served on
                drop(listener.take());
                in_force.send_replace(Serving::Unreachable);
                if watch.changed().await.is_err() {
                    return;
                }
            }
            Serving::Up => {
                let bound = match listener.take() {
                    Some(l) => l,
                    None => match tokio::net::TcpListener::bind(addr).await {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(%addr, error = %e, "the API stand-in cannot listen again; retrying");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                in_force.send_replace(Serving::Up);
                let mut stop = watch.clone();
                Server::new(Listener::Tcp(bound), handler.clone())
                    .serve(async move {
                        let _ = stop.wait_for(|s| *s != Serving::Up).await;
                    })
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::KubeApi;

    async fn connects(api: &KubeApi) -> bool {
        let addr = api.url().trim_start_matches("http://").to_owned();
        tokio::net::TcpStream::connect(addr).await.is_ok()
    }

    /// Once `set_unreachable`'s future has ended the port is in the state asked for: a test that
    /// awaits it never meets the previous state (a connection refused right after the API came
    /// back was once a flaky verdict).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_port_is_closed_and_bound_again_when_the_future_ends() {
        let api = KubeApi::start().await.unwrap();
        for round in 0..20 {
            api.set_unreachable(true).await;
            assert!(
                !connects(&api).await,
                "connected while unreachable, round {round}"
            );
            api.set_unreachable(false).await;
            assert!(connects(&api).await, "refused once reachable again");
        }
    }
}
