//! Logging and metrics setup shared by every daemon (DESIGN.md 4.8).
//!
//! Logs go through `tracing`: human-readable by default, one JSON object per line with
//! `--log-format json`; the level comes from `RUST_LOG` (default `info`). Metrics are a
//! prometheus-client [`Registry`] encoded in the OpenMetrics text format.

use prometheus_client::registry::Registry;
use std::fmt;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// For people.
    #[default]
    Human,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "human" => Ok(Self::Human),
            "json" => Ok(Self::Json),
            other => Err(format!("unknown log format {other:?}: use human or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Human => "human",
            Self::Json => "json",
        })
    }
}

/// Installs the global tracing subscriber writing to stderr. Returns an error if one is already
/// installed (e.g. twice in one test process), which callers may ignore.
pub fn init_logging(format: LogFormat) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| e.to_string())
}

/// Encodes a registry in the OpenMetrics text format.
pub fn encode_metrics(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn formats_parse() {
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("human".parse::<LogFormat>().unwrap(), LogFormat::Human);
        assert!("xml".parse::<LogFormat>().is_err());
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[test]
    fn metrics_encode_as_openmetrics() {
        let mut registry = Registry::with_prefix("athenz_agent");
        let gauge = Gauge::<i64>::default();
        registry.register("cache_pods", "Pods in the kubelet cache", gauge.clone());
        gauge.set(7);
        let text = encode_metrics(&registry).unwrap();
        assert!(
            text.contains("# TYPE athenz_agent_cache_pods gauge"),
            "{text}"
        );
        assert!(text.contains("athenz_agent_cache_pods 7"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn logging_installs_once() {
        let first = init_logging(LogFormat::Json);
        let second = init_logging(LogFormat::Human);
        assert!(first.is_ok() || second.is_err());
        assert!(second.is_err(), "a second subscriber must be refused");
    }
}
