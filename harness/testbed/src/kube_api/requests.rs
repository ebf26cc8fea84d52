//! The API stand-in's `GET /metrics`: resource requests counted as the real API server counts
//! them in `apiserver_request_total`.

use http::{Method, StatusCode};
use std::collections::BTreeMap;

/// Resource requests served, as the real API server counts them in `apiserver_request_total`
/// (its `/metrics`): by verb (`GET`, `LIST`, `POST`, `PUT`, `PATCH`, `DELETE`), group, version,
/// resource, subresource and status code. What `athenz-devstack load` reads to say how many API
/// requests an identity costs.
#[derive(Default)]
pub(super) struct RequestCounts(std::sync::Mutex<BTreeMap<[String; 6], u64>>);

impl RequestCounts {
    /// Counts `req`, answered `code`, if it is a resource request.
    pub(super) fn record(&self, method: &Method, path: &str, code: StatusCode) {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest): (&str, &str, &[&str]) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", version, rest),
            ["apis", group, version, rest @ ..] => (group, version, rest),
            _ => return,
        };
        let rest = match rest {
            ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
            other => other,
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, ""),
            [resource, name] => (*resource, Some(*name), ""),
            [resource, name, sub, ..] => (*resource, Some(*name), *sub),
            [] => return,
        };
        let verb = match (method.as_str(), name) {
            ("GET", None) => "LIST",
            (m, _) => m,
        };
        let key = [verb, group, version, resource, subresource, code.as_str()].map(str::to_owned);
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    /// The counts in the Prometheus text format.
    pub(super) fn exposition(&self) -> String {
        let counts = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut text = String::from(
            "# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, version, resource, subresource and HTTP response code.\n# TYPE apiserver_request_total counter\n",
        );
        for ([verb, group, version, resource, subresource, code], n) in counts.iter() {
            text.push_str(&format!(
                "apiserver_request_total{{code=\"{code}\",group=\"{group}\",resource=\"{resource}\",subresource=\"{subresource}\",verb=\"{verb}\",version=\"{version}\"}} {n}\n"
            ));
        }
        text
    }
}
