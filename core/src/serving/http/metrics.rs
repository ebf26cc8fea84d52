//! What a server counts: requests by route and status, their latency, and a TLS server's
//! handshakes by version and kind.

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Route label from [`super::Handler::route`].
    pub route: &'static str,
    /// HTTP status code.
    pub status: u16,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Route label from [`super::Handler::route`].
    pub route: &'static str,
}

/// Labels of the TLS handshake counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// `1.2` or `1.3`.
    pub version: &'static str,
    /// `full` (the client's certificate verified), `resumed` (taken from its session, and
    /// verified again) or `refused` (a resumed session whose client certificate is no longer
    /// accepted: the connection is closed before any request).
    pub kind: &'static str,
}

impl HandshakeLabels {
    /// The labels of a completed handshake.
    pub fn of(session: &rustls::ServerConnection) -> Self {
        let version = match session.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_2) => "1.2",
            Some(rustls::ProtocolVersion::TLSv1_3) => "1.3",
            _ => "other",
        };
        let kind = match session.handshake_kind() {
            Some(rustls::HandshakeKind::Resumed) => "resumed",
            _ => "full",
        };
        Self { version, kind }
    }

    /// The labels of a resumed handshake whose session was refused.
    pub fn refused(session: &rustls::ServerConnection) -> Self {
        Self {
            kind: "refused",
            ..Self::of(session)
        }
    }
}

/// Request metrics of one server.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    /// Only a TLS server's ([`HttpMetrics::register_tls`]).
    handshakes: Option<Family<HandshakeLabels, Counter>>,
}

impl HttpMetrics {
    /// A TLS server's: [`HttpMetrics::register`]'s and `tls_handshakes`.
    pub fn register_tls(registry: &mut Registry) -> Self {
        let handshakes = Family::<HandshakeLabels, Counter>::default();
        registry.register(
            "tls_handshakes",
            "TLS handshakes completed, by version and kind (full, resumed from a session, or \
             refused: a resumed session no longer accepted)",
            handshakes.clone(),
        );
        Self {
            handshakes: Some(handshakes),
            ..Self::register(registry)
        }
    }

    /// Creates and registers `http_requests` and `http_request_duration_seconds` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ])
        });
        registry.register(
            "http_requests",
            "Requests served, by route and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time to answer a request, by route",
            latency.clone(),
        );
        Self {
            requests,
            latency,
            handshakes: None,
        }
    }

    pub(super) fn record_handshake(&self, session: &rustls::ServerConnection, refused: bool) {
        if let Some(handshakes) = &self.handshakes {
            let labels = if refused {
                HandshakeLabels::refused(session)
            } else {
                HandshakeLabels::of(session)
            };
            handshakes.get_or_create(&labels).inc();
        }
    }

    pub(super) fn record(&self, route: &'static str, status: StatusCode, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                status: status.as_u16(),
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels { route })
            .observe(elapsed.as_secs_f64());
    }
}
