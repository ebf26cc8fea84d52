//! The webhook's admission latency as the API server itself measures it: its
//! `apiserver_admission_webhook_admission_duration_seconds` histogram for our webhook (each call
//! from the API server's side: connection, TLS, the review, the patch's decoding), read before
//! and after a window so the difference is the window's calls alone, and its quantiles
//! interpolated within buckets as Prometheus's `histogram_quantile` does.

use serde::Serialize;

/// The API server's histogram of each webhook call.
const METRIC: &str = "apiserver_admission_webhook_admission_duration_seconds_bucket";
/// More buckets than this on one page is not the API server's histogram.
const MAX_BUCKETS: usize = 64;

/// A page that is not the API server's histogram.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HistogramError {
    #[error("a {METRIC} sample without an le label: {0:?}")]
    NoBound(String),
    #[error("{METRIC} le={0:?} is not a number")]
    Bound(String),
    #[error("{METRIC} has a count that is not a whole number at or above zero: {0}")]
    Count(f64),
    #[error("{METRIC} has more than {MAX_BUCKETS} buckets for one webhook")]
    TooManyBuckets,
    #[error("{METRIC} counts fall as le grows: not a cumulative histogram")]
    NotCumulative,
}

/// One webhook's cumulative buckets: `(upper bound in seconds, calls at or below it)`, sorted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buckets(Vec<(f64, f64)>);

impl Buckets {
    /// The buckets of webhook `name`'s mutating CREATE calls (every outcome) on `page`.
    pub fn parse(page: &str, name: &str) -> Result<Self, HistogramError> {
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for (labels, count) in crate::scrape::samples(page, METRIC) {
            let label = |key| crate::scrape::label(labels, key);
            if label("name") != Some(name)
                || label("type") != Some("admit")
                || label("operation") != Some("CREATE")
            {
                continue;
            }
            let le = label("le").ok_or_else(|| HistogramError::NoBound(labels.to_owned()))?;
            let bound = match le {
                "+Inf" => f64::INFINITY,
                other => other
                    .parse::<f64>()
                    .ok()
                    .filter(|b| b.is_finite() && *b >= 0.0)
                    .ok_or_else(|| HistogramError::Bound(other.to_owned()))?,
            };
            if !(count.is_finite() && count >= 0.0 && count.fract() == 0.0) {
                return Err(HistogramError::Count(count));
            }
            // rejected and admitted calls are two series: add them bucket by bucket
            if let Some((_, c)) = buckets.iter_mut().find(|(b, _)| *b == bound) {
                *c += count;
            } else if buckets.len() == MAX_BUCKETS {
                return Err(HistogramError::TooManyBuckets);
            } else {
                buckets.push((bound, count));
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
            return Err(HistogramError::NotCumulative);
        }
        Ok(Self(buckets))
    }

    /// The calls made since `before` (a scrape of the same histogram, earlier).
    pub fn since(&self, before: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(bound, count)| {
                    let then = before
                        .0
                        .iter()
                        .find(|(b, _)| b == bound)
                        .map_or(0.0, |(_, c)| *c);
                    (*bound, (count - then).max(0.0))
                })
                .collect(),
        )
    }

    /// Calls counted.
    pub fn calls(&self) -> f64 {
        self.0.last().map_or(0.0, |(_, c)| *c)
    }

    /// The `q` quantile in milliseconds, linear within its bucket (from the bucket below's
    /// bound, 0 for the first); `None` with no calls. A quantile in the `+Inf` bucket is the
    /// highest finite bound (all the histogram can say: "above it").
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.calls();
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let mut below = (0.0, 0.0);
        for &(bound, count) in &self.0 {
            if count >= rank {
                if bound.is_infinite() {
                    return Some(below.0 * 1e3);
                }
                let within = count - below.1;
                let share = if within > 0.0 {
                    (rank - below.1) / within
                } else {
                    1.0
                };
                return Some((below.0 + (bound - below.0) * share) * 1e3);
            }
            below = (bound, count);
        }
        Some(below.0 * 1e3)
    }
}

/// The webhook's calls in a window, as the API server measured them.
#[derive(Debug, Clone, Serialize)]
pub struct WebhookLatency {
    pub calls: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The smallest bucket bound at or above which every call ended (the p99's true ceiling
    /// when it falls inside a wide bucket).
    pub p99_at_most_ms: Option<f64>,
}

impl WebhookLatency {
    /// The figures of `window` (the difference of two scrapes).
    pub fn of(window: &Buckets) -> Self {
        let calls = window.calls();
        let p99_at_most_ms = window
            .0
            .iter()
            .find(|(_, count)| *count >= 0.99 * calls && calls > 0.0)
            .map(|(bound, _)| bound * 1e3);
        Self {
            calls,
            p50_ms: window.quantile_ms(0.5),
            p99_ms: window.quantile_ms(0.99),
            p99_at_most_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn page(lines: &[(&str, &str, f64)]) -> String {
        lines
            .iter()
            .map(|(name, le, count)| {
                format!(
                    "{METRIC}{{name=\"{name}\",operation=\"CREATE\",rejected=\"false\",type=\"admit\",le=\"{le}\"}} {count}\n"
                )
            })
            .collect()
    }

    #[test]
    fn quantiles_interpolate_within_the_window_buckets() {
        let before = Buckets::parse(
            &page(&[
                ("w", "0.005", 10.0),
                ("w", "0.025", 10.0),
                ("w", "+Inf", 10.0),
            ]),
            "w",
        )
        .unwrap();
        let after = Buckets::parse(
            &page(&[
                ("w", "0.005", 60.0),
                ("w", "0.025", 109.0),
                ("w", "+Inf", 110.0),
                ("other", "0.005", 500.0),
            ]),
            "w",
        )
        .unwrap();
        let window = after.since(&before);
        assert_eq!(window.calls(), 100.0);
        // 50 of 100 calls at or below 5 ms: the median is the first bucket's top
        assert!((window.quantile_ms(0.5).unwrap() - 5.0).abs() < 1e-9);
        // the 99th call is the last of the second bucket's 49
        assert!((window.quantile_ms(0.99).unwrap() - 25.0).abs() < 1e-9);
        let latency = WebhookLatency::of(&window);
        assert_eq!(latency.p99_at_most_ms, Some(25.0));
        // a quantile past every finite bound says only "above the last"
        assert_eq!(window.quantile_ms(1.0), Some(25.0));
        assert_eq!(Buckets::default().quantile_ms(0.5), None);
    }

    #[test]
    fn rejected_and_admitted_series_add_up() {
        let mut text = page(&[("w", "0.005", 3.0), ("w", "+Inf", 3.0)]);
        text.push_str(&page(&[("w", "0.005", 1.0), ("w", "+Inf", 2.0)]));
        assert_eq!(Buckets::parse(&text, "w").unwrap().calls(), 5.0);
    }

    #[test]
    fn a_page_that_is_no_histogram_is_refused_by_what_is_wrong() {
        let no_le = format!("{METRIC}{{name=\"w\",operation=\"CREATE\",type=\"admit\"}} 1\n");
        assert!(matches!(
            Buckets::parse(&no_le, "w"),
            Err(HistogramError::NoBound(_))
        ));
        assert!(matches!(
            Buckets::parse(&page(&[("w", "soon", 1.0)]), "w"),
            Err(HistogramError::Bound(_))
        ));
        assert!(matches!(
            Buckets::parse(&page(&[("w", "-1", 1.0)]), "w"),
            Err(HistogramError::Bound(_))
        ));
        assert_eq!(
            Buckets::parse(&page(&[("w", "0.1", 1.5)]), "w"),
            Err(HistogramError::Count(1.5))
        );
        assert_eq!(
            Buckets::parse(&page(&[("w", "0.1", 5.0), ("w", "1", 4.0)]), "w"),
            Err(HistogramError::NotCumulative)
        );
        let many: Vec<String> = (0..=MAX_BUCKETS).map(|i| format!("{i}")).collect();
        let lines: Vec<(&str, &str, f64)> = many.iter().map(|le| ("w", le.as_str(), 1.0)).collect();
        assert_eq!(
            Buckets::parse(&page(&lines), "w"),
            Err(HistogramError::TooManyBuckets)
        );
        // other metrics and other webhooks are skipped, whatever they hold
        assert_eq!(
            Buckets::parse("garbage line\n{}{{ 1\n", "w").unwrap(),
            Buckets::default()
        );
    }
}
