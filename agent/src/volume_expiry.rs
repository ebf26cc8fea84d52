//! `athenz_agent_csi_volume_certificate_expiry_seconds{namespace, pod}`: when the certificate in
//! each files-mode volume this agent rotates expires, so an operator sees which pod's identity
//! is about to lapse, not only the node's count of abnormal volumes. Its cardinality is bounded:
//! at most [`MAX_SERIES`] series, the earliest-expiring (the ones that need attention), and a
//! volume's series goes when the volume does.

use athenz_csi_driver::rotation::VolumeExpiry;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashSet;

/// The most series one agent exports: above what a kubelet runs on one node by default (110
/// pods) and with room for nodes raised to 250, so in practice every volume.
pub const MAX_SERIES: usize = 512;

/// One volume's labels: its pod.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct VolumeLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
}

/// The gauge family and the series it shows now.
pub struct VolumeExpiryGauge {
    family: Family<VolumeLabels, Gauge<i64>>,
    shown: HashSet<VolumeLabels>,
}

impl VolumeExpiryGauge {
    /// A gauge whose family is `family` (registered by the caller).
    pub fn new(family: Family<VolumeLabels, Gauge<i64>>) -> Self {
        Self {
            family,
            shown: HashSet::new(),
        }
    }

    /// Shows `expiries` (the earliest first, at most [`MAX_SERIES`] taken) and removes the series
    /// of volumes no longer among them.
    pub fn update(&mut self, expiries: &[VolumeExpiry]) {
        let mut now = HashSet::new();
        for expiry in expiries.iter().take(MAX_SERIES) {
            let labels = VolumeLabels {
                namespace: expiry.namespace.clone(),
                pod: expiry.pod.clone(),
            };
            self.family
                .get_or_create(&labels)
                .set(expiry.not_after.unix_timestamp());
            now.insert(labels);
        }
        for gone in self.shown.difference(&now) {
            self.family.remove(gone);
        }
        self.shown = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use time::OffsetDateTime;

    fn expiry(pod: &str, unix: i64) -> VolumeExpiry {
        VolumeExpiry {
            namespace: "bank-vault".into(),
            pod: pod.into(),
            not_after: OffsetDateTime::from_unix_timestamp(unix).unwrap(),
        }
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn each_volume_is_a_series_until_it_goes_and_the_count_is_bounded() {
        let mut registry = Registry::with_prefix("athenz_agent");
        let family = Family::default();
        registry.register(
            "csi_volume_certificate_expiry_seconds",
            "expiry",
            family.clone(),
        );
        let mut gauge = VolumeExpiryGauge::new(family);
        gauge.update(&[
            expiry("reader", 1_900_000_000),
            expiry("writer", 1_900_000_100),
        ]);
        let text = scrape(&registry);
        assert!(text.contains(
            "athenz_agent_csi_volume_certificate_expiry_seconds{namespace=\"bank-vault\",pod=\"reader\"} 1900000000"
        ), "{text}");
        assert!(text.contains("pod=\"writer\"} 1900000100"), "{text}");

        // the reader's volume unpublished, the writer's rotated
        gauge.update(&[expiry("writer", 1_900_086_500)]);
        let text = scrape(&registry);
        assert!(!text.contains("pod=\"reader\""), "{text}");
        assert!(text.contains("pod=\"writer\"} 1900086500"), "{text}");

        let many: Vec<VolumeExpiry> = (0..MAX_SERIES + 10)
            .map(|n| expiry(&format!("p{n}"), 1_900_000_000 + n as i64))
            .collect();
        gauge.update(&many);
        let series = scrape(&registry)
            .lines()
            .filter(|l| l.starts_with("athenz_agent_csi_volume_certificate_expiry_seconds{"))
            .count();
        assert_eq!(series, MAX_SERIES);
    }
}
