//! Reading the Prometheus text the stack's processes serve (`/metrics` of the agents, the API
//! stand-in's `apiserver_request_total`): what `chaos` and `load` judge from, as an operator's
//! monitoring would.

use anyhow::Context;
use std::time::Duration;

/// How long a scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest page read: an agent's is a few KiB, a real API server's a few MiB.
const MAX_PAGE: usize = 16 << 20;

/// The text at `url` (`GET`, a success status required, at most [`MAX_PAGE`] bytes of UTF-8).
pub async fn text(url: &str) -> anyhow::Result<String> {
    let response = reqwest::Client::new()
        .get(url)
        .timeout(SCRAPE_TIMEOUT)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("reading {url}"))?;
    let page = athenz_core::client::read_limited(response, MAX_PAGE)
        .await
        .with_context(|| format!("reading {url}"))?;
    String::from_utf8(page).with_context(|| format!("{url}: not UTF-8"))
}

/// Every sample of the metric whose name ends with `name` (a registry may prefix it): its
/// labels (the text between the braces, empty without) and its value.
pub fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            metric
                .ends_with(name)
                .then(|| value.trim().parse::<f64>().ok().map(|v| (labels, v)))
                .flatten()
        })
}

/// The value of `label` in a sample's labels (`a="x",b="y"`), if it has one.
pub fn label<'a>(labels: &'a str, label: &str) -> Option<&'a str> {
    labels
        .split(&format!("{label}=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn samples_and_labels_are_read_as_prometheus_writes_them() {
        let text = "# HELP x_total X\n# TYPE x_total counter\n\
                    athenz_agent_x_total{kind=\"register\",outcome=\"ok\"} 3\n\
                    athenz_agent_x_total{kind=\"refresh\",outcome=\"error\"} 1\n\
                    athenz_agent_expiry_seconds 1795644164\n\
                    other_total{a=\"b\"} 7\n";
        let x: Vec<(&str, f64)> = samples(text, "x_total").collect();
        assert_eq!(x.len(), 2);
        assert_eq!(label(x[0].0, "outcome"), Some("ok"));
        assert_eq!(label(x[1].0, "kind"), Some("refresh"));
        assert_eq!(label(x[1].0, "missing"), None);
        assert_eq!(
            samples(text, "expiry_seconds").collect::<Vec<_>>(),
            [("", 1_795_644_164.0)]
        );
    }
}
