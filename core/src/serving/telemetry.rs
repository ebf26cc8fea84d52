//! Logging and metrics setup shared by every daemon (docs/design.md §4.8).
//!
//! Logs go through `tracing`: human-readable by default, one JSON object per line with
//! `--log-format json`; the level comes from `RUST_LOG` (default `info`), as a list of
//! `level` and `target=level` directives (`info,athenz_sia=debug`). That is tracing's
//! [`Targets`] filter rather than `EnvFilter`: the same syntax for what operators write, without
//! the regex engine `EnvFilter` compiles into every binary (about 300 KiB of code in the SIA that
//! every pod runs). Metrics are a prometheus-client [`Registry`] encoded in the OpenMetrics text
//! format.

use prometheus_client::registry::Registry;
use std::fmt;
use std::str::FromStr;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

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
/// installed (e.g. twice in one test process), which callers may ignore. A `RUST_LOG` that does
/// not parse leaves the level at `info` and is reported once installed, naming the value.
pub fn init_logging(format: LogFormat) -> Result<(), String> {
    let (filter, bad_directives) = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let registry = tracing_subscriber::registry().with(filter);
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Human => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json().flatten_event(true)).try_init(),
    };
    result.map_err(|e| e.to_string())?;
    if let Some((value, why)) = bad_directives {
        tracing::warn!(rust_log = %value, error = %why, "RUST_LOG not understood; logging at info");
    }
    Ok(())
}

/// The filter `RUST_LOG` asks for (`info` when unset or empty), and the value with the reason
/// when it does not parse.
fn log_filter(rust_log: Option<&str>) -> (Targets, Option<(String, String)>) {
    let default = || Targets::new().with_default(LevelFilter::INFO);
    match rust_log.map(str::trim).filter(|v| !v.is_empty()) {
        None => (default(), None),
        Some(value) => match value.parse::<Targets>() {
            Ok(targets) => (targets, None),
            Err(e) => (default(), Some((value.to_owned(), e.to_string()))),
        },
    }
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
    fn rust_log_directives_set_levels_per_target() {
        use tracing::Level;
        let (filter, bad) = log_filter(Some("warn,athenz_sia=debug"));
        assert!(bad.is_none());
        assert!(filter.would_enable("athenz_sia::run", &Level::DEBUG));
        assert!(!filter.would_enable("athenz_sia::run", &Level::TRACE));
        assert!(!filter.would_enable("hyper::proto", &Level::INFO));
        assert!(filter.would_enable("hyper::proto", &Level::WARN));
    }

    #[test]
    fn rust_log_unset_or_malformed_logs_at_info_and_names_the_value() {
        use tracing::Level;
        for unset in [None, Some(""), Some("  ")] {
            let (filter, bad) = log_filter(unset);
            assert!(bad.is_none(), "{unset:?}");
            assert!(filter.would_enable("any", &Level::INFO));
            assert!(!filter.would_enable("any", &Level::DEBUG));
        }
        let (filter, bad) = log_filter(Some("athenz_sia=loud"));
        let (value, why) = bad.expect("a malformed RUST_LOG is reported");
        assert_eq!(value, "athenz_sia=loud");
        assert!(!why.is_empty());
        assert!(filter.would_enable("athenz_sia", &Level::INFO));
        assert!(!filter.would_enable("athenz_sia", &Level::DEBUG));
    }

    #[test]
    fn logging_installs_once() {
        let first = init_logging(LogFormat::Json);
        let second = init_logging(LogFormat::Human);
        assert!(first.is_ok() || second.is_err());
        assert!(second.is_err(), "a second subscriber must be refused");
    }
}
