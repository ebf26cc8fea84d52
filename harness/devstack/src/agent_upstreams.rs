//! Where our identities' time goes, as the node agent itself counts it: its
//! `athenz_agent_upstream_duration_seconds` histogram (docs/operating.md, "Metrics") has the
//! calls and total time of each step that waits on another party (the kubelet's pod list, the
//! Service lookup, the jwt-service, ZTS). Both benches read it: `athenz-devstack bench` once
//! after its run, `cluster bench` before and after each phase of one of our kinds, where the
//! difference is that phase's calls and mean time per step: what a faster publish has to cut,
//! read beside the kubelet's own view of the volume (`volume_wait`).

use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeMap;

/// The histogram read.
const METRIC: &str = "athenz_agent_upstream_duration_seconds";
/// Most distinct upstreams accepted (the agent has five).
const MAX_UPSTREAMS: usize = 32;

/// A metrics page that is not what the agent serves.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// A `_sum` or `_count` sample of the histogram whose value is not a finite number ≥ 0.
    #[error("line {line}: {METRIC} sample value {value:?} is not a non-negative number")]
    Value { line: usize, value: String },
    /// A sample of the histogram without its `upstream` label.
    #[error("line {line}: {METRIC} sample without an upstream label")]
    NoUpstream { line: usize },
    /// More upstreams than the agent has.
    #[error("more than {MAX_UPSTREAMS} upstreams in {METRIC}")]
    TooManyUpstreams,
}

/// Each upstream's calls and seconds so far, as one scrape saw them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts(BTreeMap<String, Count>);

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Count {
    calls: f64,
    seconds: f64,
}

/// One step over one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    /// Calls the agent made.
    pub calls: u64,
    /// Their mean time, milliseconds.
    pub mean_ms: f64,
}

impl Counts {
    /// Reads the histogram's `_sum` and `_count` samples from a Prometheus text page; every
    /// other line is skipped.
    pub fn parse(page: &str) -> Result<Self, PageError> {
        let mut counts: BTreeMap<String, Count> = BTreeMap::new();
        for (index, line) in page.lines().enumerate() {
            let line_no = index + 1;
            let Some(rest) = line.strip_prefix(METRIC) else {
                continue;
            };
            let (is_sum, rest) = if let Some(rest) = rest.strip_prefix("_sum") {
                (true, rest)
            } else if let Some(rest) = rest.strip_prefix("_count") {
                (false, rest)
            } else {
                continue;
            };
            let upstream = upstream_label(rest).ok_or(PageError::NoUpstream { line: line_no })?;
            let value = rest
                .rsplit_once(' ')
                .map(|(_, v)| v.trim())
                .unwrap_or_default();
            let number = value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or_else(|| PageError::Value {
                    line: line_no,
                    value: value.chars().take(40).collect(),
                })?;
            if !counts.contains_key(upstream) && counts.len() == MAX_UPSTREAMS {
                return Err(PageError::TooManyUpstreams);
            }
            let count = counts.entry(upstream.to_owned()).or_default();
            if is_sum {
                count.seconds = number;
            } else {
                count.calls = number;
            }
        }
        Ok(Self(counts))
    }

    /// What happened between `before` and this scrape: calls and mean time per upstream
    /// called in between.
    pub fn since(&self, before: &Self) -> BTreeMap<String, Step> {
        self.0
            .iter()
            .filter_map(|(upstream, now)| {
                let then = before.0.get(upstream).copied().unwrap_or_default();
                let calls = now.calls - then.calls;
                (calls >= 1.0).then(|| {
                    let step = Step {
                        // a count of calls: whole, and within u64 for any real run
                        calls: calls.round() as u64,
                        mean_ms: (now.seconds - then.seconds).max(0.0) * 1e3 / calls,
                    };
                    (upstream.clone(), step)
                })
            })
            .collect()
    }
}

/// The value of `upstream="..."` in a sample's label set (`{upstream="kubelet"} 12`).
fn upstream_label(rest: &str) -> Option<&str> {
    let labels = rest.strip_prefix('{')?;
    let labels = &labels[..labels.find('}')?];
    let value = labels
        .split(',')
        .find_map(|pair| pair.trim().strip_prefix("upstream=\""))?;
    let value = value.strip_suffix('"')?;
    (!value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    .then_some(value)
}

/// Scrapes the agent's metrics page at `metrics_url`.
pub async fn scrape(metrics_url: &str) -> anyhow::Result<Counts> {
    let page = crate::scrape::text(metrics_url).await?;
    Counts::parse(&page).with_context(|| format!("the agent's metrics at {metrics_url}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP athenz_agent_upstream_duration_seconds Upstream call latency.
# TYPE athenz_agent_upstream_duration_seconds histogram
athenz_agent_upstream_duration_seconds_sum{upstream=\"kubelet\"} 0.5
athenz_agent_upstream_duration_seconds_count{upstream=\"kubelet\"} 100
athenz_agent_upstream_duration_seconds_bucket{le=\"0.001\",upstream=\"kubelet\"} 3
athenz_agent_upstream_duration_seconds_sum{upstream=\"zts_register\"} 1.2
athenz_agent_upstream_duration_seconds_count{upstream=\"zts_register\"} 100
athenz_agent_identities_issued_total{verb=\"csi_publish\",key_source=\"agent\"} 100
# EOF
";

    #[test]
    fn a_phase_is_the_difference_of_two_scrapes() {
        let before = Counts::parse(PAGE).unwrap();
        let after = Counts::parse(
            &PAGE
                .replace("} 0.5", "} 0.7")
                .replace("kubelet\"} 100", "kubelet\"} 110"),
        )
        .unwrap();
        let steps = after.since(&before);
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps["kubelet"].calls, 10);
        assert!((steps["kubelet"].mean_ms - 20.0).abs() < 1e-9);
        // an upstream first seen after the first scrape counts from zero
        let first = after.since(&Counts::default());
        assert_eq!(first["zts_register"].calls, 100);
        assert!((first["zts_register"].mean_ms - 12.0).abs() < 1e-9);
    }

    /// The histogram as prometheus-client writes it, read once over an agent's whole life (what
    /// `athenz-devstack bench` reports): an upstream never called is left out.
    #[test]
    fn one_scrape_reads_the_means_per_upstream() {
        let page = format!(
            "{PAGE}{METRIC}_sum{{upstream=\"dns\"}} 0\n{METRIC}_count{{upstream=\"dns\"}} 0\n"
        );
        let calls = Counts::parse(&page).unwrap().since(&Counts::default());
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls["kubelet"].calls, 100);
        assert!((calls["kubelet"].mean_ms - 5.0).abs() < 1e-9);
        assert!((calls["zts_register"].mean_ms - 12.0).abs() < 1e-9);
        assert!(
            Counts::parse("garbage\n{}{} 1")
                .unwrap()
                .since(&Counts::default())
                .is_empty()
        );
    }

    #[test]
    fn a_malformed_sample_is_named() {
        let bad_value = format!("{METRIC}_sum{{upstream=\"kubelet\"}} NaN\n");
        assert!(matches!(
            Counts::parse(&bad_value),
            Err(PageError::Value { line: 1, .. })
        ));
        let negative = format!("\n{METRIC}_count{{upstream=\"kubelet\"}} -3\n");
        assert!(matches!(
            Counts::parse(&negative),
            Err(PageError::Value { line: 2, .. })
        ));
        for hostile in [
            format!("{METRIC}_sum 1"),
            format!("{METRIC}_sum{{le=\"1\"}} 1"),
            format!("{METRIC}_sum{{upstream=\"../../x\"}} 1"),
            format!("{METRIC}_sum{{upstream=\"kubelet\" 1"),
            format!("{METRIC}_sum{{upstream=\"\"}} 1"),
        ] {
            assert!(
                matches!(
                    Counts::parse(&hostile),
                    Err(PageError::NoUpstream { line: 1 })
                ),
                "{hostile}"
            );
        }
        let many: String = (0..=MAX_UPSTREAMS)
            .map(|n| format!("{METRIC}_count{{upstream=\"u{n}\"}} 1\n"))
            .collect();
        assert!(matches!(
            Counts::parse(&many),
            Err(PageError::TooManyUpstreams)
        ));
        // binary and unrelated pages hold none of its samples
        assert_eq!(
            Counts::parse("\u{0}\u{1}garbage\nmetric 1\n").unwrap(),
            Counts::default()
        );
    }
}
