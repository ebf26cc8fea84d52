//! The refresh sidecar's metrics and health endpoint (`--metrics-server-addr`): `/metrics` with
//! each cached token's remaining life and the cache's size (k8s-athenz-sia's
//! `cached_token_bytes` and `cached_token_entries`), and `/healthz`.

use super::cache::{Kind, TokenCache};
use super::zts::unix_now;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;

/// Reads the cache at every scrape (nothing is kept between scrapes).
#[derive(Debug)]
pub struct TokenMetrics(pub Arc<TokenCache>);

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenCache({} tokens)", self.entries().len())
    }
}

impl Collector for TokenMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let entries = self.0.entries();
        let now = unix_now();
        {
            let mut family = encoder.encode_descriptor(
                "token_expires_in_seconds",
                "Seconds until the cached token expires (negative once expired)",
                None,
                MetricType::Gauge,
            )?;
            for entry in &entries {
                let labels = [
                    ("domain", entry.key.domain.clone()),
                    ("role", entry.key.roles_label()),
                    ("type", entry.key.kind.name().to_owned()),
                ];
                ConstGauge::new(entry.expires_at - now).encode(family.encode_family(&labels)?)?;
            }
        }
        let of_kind = |kind: Kind| entries.iter().filter(move |e| e.key.kind == kind);
        let bytes = |kind| of_kind(kind).map(|e| e.len as i64).sum::<i64>();
        let count = |kind| of_kind(kind).count() as i64;
        type Measure<'a> = &'a dyn Fn(Kind) -> i64;
        let sizes: [(&str, &str, Measure<'_>); 2] = [
            ("cached_token_bytes", "Bytes of the tokens cached", &bytes),
            ("cached_token_entries", "Tokens cached", &count),
        ];
        for (name, help, value) in sizes {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for kind in [Kind::Access, Kind::Role] {
                let labels = [("type", kind.name().to_owned())];
                ConstGauge::new(value(kind)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
