//! What `refresh` reports on its operations endpoint.
//!
//! The control plane's own certificates come from here, and when one lapses its service stops:
//! the admission webhook (failurePolicy Fail) then blocks every pod creation. The daemon beside
//! this sidecar only notices once the certificate it reloads has expired; these gauges let an
//! alert fire hours before, while the refresh loop is still retrying.

use athenz_core::crypto::CertInfo;
use athenz_core::http::Readiness;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use time::OffsetDateTime;

/// Prefix of every metric name.
pub const PREFIX: &str = "athenz_control_sia";

/// Labels of the refresh counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `ok` or `error`.
    pub outcome: &'static str,
}

/// The metrics and the readiness flag of one `refresh` process.
#[derive(Debug, Clone)]
pub struct Metrics {
    certificate_expiry: Gauge,
    ntoken_expiry: Gauge,
    refreshes: Family<OutcomeLabels, Counter>,
    readiness: Readiness,
}

impl Metrics {
    /// Creates the metrics in a registry of their own, every one labelled with `service` (the
    /// full Athenz name, e.g. `k8s.admin.athenz-callback`): the three control-plane services'
    /// sidecars look alike to a scraper otherwise, and an alert should say whose certificate.
    pub fn new(service: String) -> (Self, Registry) {
        let mut registry = Registry::with_prefix_and_labels(
            PREFIX,
            [(Cow::Borrowed("service"), Cow::Owned(service))].into_iter(),
        );
        let metrics = Self {
            certificate_expiry: Gauge::default(),
            ntoken_expiry: Gauge::default(),
            refreshes: Family::default(),
            readiness: Readiness::default(),
        };
        registry.register(
            "certificate_expiry_seconds",
            "Expiry (Unix time) of the service certificate on disk; 0 while there is none",
            metrics.certificate_expiry.clone(),
        );
        registry.register(
            "ntoken_expiry_seconds",
            "Expiry (Unix time) of the ntoken on disk; 0 while there is none",
            metrics.ntoken_expiry.clone(),
        );
        registry.register(
            "refreshes",
            "Certificate requests to ZTS, by outcome",
            metrics.refreshes.clone(),
        );
        // Both outcomes are served from the start: Prometheus's increase() sees nothing in a
        // series whose first sample is already 1, so the first failure would go unnoticed.
        for outcome in ["ok", "error"] {
            let _ = metrics.refreshes.get_or_create(&OutcomeLabels { outcome });
        }
        (metrics, registry)
    }

    /// The flag behind `/readyz`.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Records the certificate on disk (`None`: there is none) as seen at `now`: its expiry, and
    /// readiness while it is valid.
    pub fn certificate(&self, current: Option<&CertInfo>, now: OffsetDateTime) {
        self.certificate_expiry
            .set(current.map_or(0, |c| c.not_after.unix_timestamp()));
        self.readiness
            .set(current.is_some_and(|c| c.is_valid_at(now)));
    }

    /// Records an ntoken written that expires at `expires` (Unix time).
    pub fn ntoken_written(&self, expires: i64) {
        self.ntoken_expiry.set(expires);
    }

    /// Counts a certificate request to ZTS.
    pub fn refreshed(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.refreshes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

/// A service certificate of the callback, issued now by a throwaway CA (the unit tests').
#[cfg(test)]
pub(crate) fn test_certificate() -> CertInfo {
    let issued = athenz_testbed::pki::CertAuthority::new_root("test CA")
        .and_then(|ca| {
            ca.issue(
                &athenz_testbed::pki::LeafSpec::service("k8s.admin.athenz-callback", &[]),
                athenz_core::crypto::KeyAlgorithm::P256,
            )
        })
        .expect("a test certificate");
    CertInfo::from_pem(&issued.cert_pem).expect("a test certificate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::telemetry::encode_metrics;

    #[test]
    fn served_with_prefix_service_label_and_both_outcomes_from_the_start() {
        let (metrics, registry) = Metrics::new("k8s.admin.athenz-callback".into());
        let text = encode_metrics(&registry).unwrap();
        for line in [
            "athenz_control_sia_certificate_expiry_seconds{service=\"k8s.admin.athenz-callback\"} 0",
            "athenz_control_sia_ntoken_expiry_seconds{service=\"k8s.admin.athenz-callback\"} 0",
            "athenz_control_sia_refreshes_total{service=\"k8s.admin.athenz-callback\",outcome=\"ok\"} 0",
            "athenz_control_sia_refreshes_total{service=\"k8s.admin.athenz-callback\",outcome=\"error\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(!metrics.readiness().is_ready());

        metrics.refreshed(false);
        metrics.ntoken_written(1_700_000_000);
        let text = encode_metrics(&registry).unwrap();
        assert!(text.contains("outcome=\"error\"} 1"), "{text}");
        assert!(
            text.contains(
                "ntoken_expiry_seconds{service=\"k8s.admin.athenz-callback\"} 1700000000"
            ),
            "{text}"
        );
    }

    #[test]
    fn ready_only_while_the_certificate_is_valid() {
        let (metrics, registry) = Metrics::new("k8s.admin.athenz-callback".into());
        let info = test_certificate();
        metrics.certificate(Some(&info), OffsetDateTime::now_utc());
        assert!(metrics.readiness().is_ready());
        let text = encode_metrics(&registry).unwrap();
        assert!(
            text.contains(&format!(
                "certificate_expiry_seconds{{service=\"k8s.admin.athenz-callback\"}} {}",
                info.not_after.unix_timestamp()
            )),
            "{text}"
        );
        // the same certificate, once past its end: still reported, no longer ready
        metrics.certificate(Some(&info), info.not_after + time::Duration::seconds(1));
        assert!(!metrics.readiness().is_ready());
        metrics.certificate(None, OffsetDateTime::now_utc());
        assert!(!metrics.readiness().is_ready());
    }
}
