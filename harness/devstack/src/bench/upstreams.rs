//! The agent's calls to what it depends on during a bench run, from its metrics endpoint: where
//! a pod's SIA init waits (kubelet, jwt-service, ZTS register).

use serde::Serialize;
use std::collections::BTreeMap;

/// One upstream's calls as the agent counted them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct UpstreamCalls {
    pub calls: u64,
    /// Their mean duration, ms.
    pub mean_ms: f64,
}

/// The agent's upstream histogram (`*upstream_duration_seconds_sum` and `_count` by
/// `upstream`) from its metrics endpoint; empty when it cannot be read (the report says so by
/// being empty, the run is not failed for it).
pub(super) async fn agent_upstreams(metrics_url: &str) -> BTreeMap<String, UpstreamCalls> {
    let text = match reqwest::get(metrics_url).await {
        Ok(answer) => answer.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    parse_upstreams(&text)
}

fn parse_upstreams(text: &str) -> BTreeMap<String, UpstreamCalls> {
    let mut sums: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for line in text.lines() {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let is_sum = name_labels.contains("upstream_duration_seconds_sum{");
        let is_count = name_labels.contains("upstream_duration_seconds_count{");
        if !is_sum && !is_count {
            continue;
        }
        let Some(upstream) = name_labels
            .split("upstream=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let entry = sums.entry(upstream.to_owned()).or_default();
        if is_sum {
            entry.0 = value.parse().unwrap_or(0.0);
        } else {
            entry.1 = value.parse().unwrap_or(0);
        }
    }
    sums.into_iter()
        .filter(|(_, (_, calls))| *calls > 0)
        .map(|(upstream, (sum, calls))| {
            let mean_ms = sum * 1e3 / calls as f64;
            (upstream, UpstreamCalls { calls, mean_ms })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The agent's histogram as prometheus-client writes it, read into means per upstream.
    #[test]
    fn the_agents_upstream_histogram_is_read_per_upstream() {
        let text = "\
# HELP athenz_agent_upstream_duration_seconds Time spent in calls to upstreams.
# TYPE athenz_agent_upstream_duration_seconds histogram
athenz_agent_upstream_duration_seconds_sum{upstream=\"kubelet\"} 0.25
athenz_agent_upstream_duration_seconds_count{upstream=\"kubelet\"} 100
athenz_agent_upstream_duration_seconds_bucket{le=\"0.005\",upstream=\"kubelet\"} 90
athenz_agent_upstream_duration_seconds_sum{upstream=\"zts_register\"} 0.3
athenz_agent_upstream_duration_seconds_count{upstream=\"zts_register\"} 100
athenz_agent_upstream_duration_seconds_sum{upstream=\"dns\"} 0
athenz_agent_upstream_duration_seconds_count{upstream=\"dns\"} 0
# EOF
";
        let calls = parse_upstreams(text);
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls["kubelet"].calls, 100);
        assert!((calls["kubelet"].mean_ms - 2.5).abs() < 1e-9);
        assert!((calls["zts_register"].mean_ms - 3.0).abs() < 1e-9);
        assert!(parse_upstreams("garbage\n{}{} 1").is_empty());
    }
}
