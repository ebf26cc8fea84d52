//! [`PodSubject`]: what the agent saw of a pod, and what the identity JWT vouches for.
//!
//! Its URI form `pod:<ns>/<name>?d=<domain>&n=<service>&i=<ip>&u=<uid>` is the JWT `sub` claim
//! (docs/design.md §4.3). Parsing is strict: every field is validated, every key must appear
//! exactly once, unknown keys are refused and percent-escapes must be well formed. Because each
//! field is validated after decoding, an escape can never smuggle a `/`, `&` or NUL into a field.

use crate::names::{self, NameError, Quoted};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use thiserror::Error;

/// Longest subject URI accepted; far above any valid subject (which is under 700 bytes).
pub const MAX_SUBJECT_URI_LEN: usize = 1024;

const URI_PREFIX: &str = "pod:";

/// Bytes that are escaped when a subject is written: everything but the unreserved set.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A pod as attested by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedPodSubject")]
pub struct PodSubject {
    /// Kubernetes namespace (DNS label).
    pub namespace: String,
    /// Pod name (DNS subdomain).
    pub name: String,
    /// Pod UID (lowercase UUID); the Athenz instance id.
    pub uid: String,
    /// Athenz domain mapped from the namespace.
    pub domain: String,
    /// Athenz service: the pod's service account.
    pub service: String,
    /// Pod IP; `None` when the certificate names none: a CSI files-mode volume is published
    /// before the pod's network exists, and one without `ipSAN` never names it (docs/design.md
    /// §4.10). Absent from the JSON form and empty (`i=`) in the URI form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
}

/// The JSON shape of a subject before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedPodSubject {
    namespace: String,
    name: String,
    uid: String,
    domain: String,
    service: String,
    #[serde(default)]
    ip: Option<String>,
}

impl TryFrom<UncheckedPodSubject> for PodSubject {
    type Error = SubjectError;

    fn try_from(raw: UncheckedPodSubject) -> Result<Self, Self::Error> {
        PodSubject::new(
            raw.namespace,
            raw.name,
            raw.uid,
            raw.domain,
            raw.service,
            raw.ip.as_deref(),
        )
    }
}

/// Why a subject was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubjectError {
    /// A field broke its name rule.
    #[error("subject {0}")]
    Field(#[from] NameError),
    /// The URI is not of the form `pod:<ns>/<name>?<query>`.
    #[error("subject URI is malformed: {reason} (got {value})")]
    Malformed {
        /// What was wrong.
        reason: &'static str,
        /// The received URI, escaped and truncated.
        value: Quoted,
    },
    /// The query holds a key other than `d`, `n`, `i`, `u`.
    #[error("subject URI has unknown key {0}")]
    UnknownKey(Quoted),
    /// A key appears twice.
    #[error("subject URI repeats key {0}")]
    DuplicateKey(Quoted),
    /// A key is missing.
    #[error("subject URI lacks key {0:?}")]
    MissingKey(&'static str),
    /// A `%` escape is not `%` + two hex digits, or decodes to invalid UTF-8.
    #[error("subject URI has a bad percent-escape in {field}")]
    BadEscape {
        /// The part holding the bad escape.
        field: &'static str,
    },
    /// The IP is not an IP address in canonical text form.
    #[error("subject ip is not a canonical IP address (got {0})")]
    BadIp(Quoted),
}

impl PodSubject {
    /// Builds a subject, validating every field; `ip` is `None` for a pod without one yet.
    pub fn new(
        namespace: String,
        name: String,
        uid: String,
        domain: String,
        service: String,
        ip: Option<&str>,
    ) -> Result<Self, SubjectError> {
        names::validate_dns_label("namespace", &namespace)?;
        names::validate_dns_subdomain("name", &name)?;
        names::validate_uid("uid", &uid)?;
        names::validate_domain("domain", &domain)?;
        names::validate_service("service", &service)?;
        let ip = ip.map(parse_canonical_ip).transpose()?;
        Ok(Self {
            namespace,
            name,
            uid,
            domain,
            service,
            ip,
        })
    }

    /// Re-validates a subject built field by field (e.g. by struct literal).
    pub fn validate(&self) -> Result<(), SubjectError> {
        names::validate_dns_label("namespace", &self.namespace)?;
        names::validate_dns_subdomain("name", &self.name)?;
        names::validate_uid("uid", &self.uid)?;
        names::validate_domain("domain", &self.domain)?;
        names::validate_service("service", &self.service)?;
        Ok(())
    }

    /// The `pod:` URI form (the JWT `sub` claim).
    pub fn to_uri(&self) -> String {
        let enc = |s: &str| utf8_percent_encode(s, ESCAPED).to_string();
        format!(
            "{URI_PREFIX}{}/{}?d={}&n={}&i={}&u={}",
            enc(&self.namespace),
            enc(&self.name),
            enc(&self.domain),
            enc(&self.service),
            self.ip.map(|ip| enc(&ip.to_string())).unwrap_or_default(),
            enc(&self.uid),
        )
    }

    /// Parses the `pod:` URI form strictly.
    pub fn parse_uri(uri: &str) -> Result<Self, SubjectError> {
        let malformed = |reason| SubjectError::Malformed {
            reason,
            value: Quoted::new(uri),
        };
        if uri.len() > MAX_SUBJECT_URI_LEN {
            return Err(malformed("longer than 1024 bytes"));
        }
        let rest = uri
            .strip_prefix(URI_PREFIX)
            .ok_or_else(|| malformed("does not start with \"pod:\""))?;
        let (path, query) = rest
            .split_once('?')
            .ok_or_else(|| malformed("has no query"))?;
        let (namespace, name) = path
            .split_once('/')
            .ok_or_else(|| malformed("path is not <namespace>/<name>"))?;
        if name.contains('/') {
            return Err(malformed("path has more than two segments"));
        }
        let namespace = decode("namespace", namespace)?;
        let name = decode("name", name)?;

        let (mut domain, mut service, mut ip, mut uid) = (None, None, None, None);
        for pair in query.split('&') {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| malformed("query item is not key=value"))?;
            let key = decode("query key", key)?;
            let (slot, field) = match key.as_str() {
                "d" => (&mut domain, "domain"),
                "n" => (&mut service, "service"),
                "i" => (&mut ip, "ip"),
                "u" => (&mut uid, "uid"),
                _ => return Err(SubjectError::UnknownKey(Quoted::new(&key))),
            };
            if slot.is_some() {
                return Err(SubjectError::DuplicateKey(Quoted::new(&key)));
            }
            *slot = Some(decode(field, value)?);
        }
        let ip = ip.ok_or(SubjectError::MissingKey("i"))?;
        Self::new(
            namespace,
            name,
            uid.ok_or(SubjectError::MissingKey("u"))?,
            domain.ok_or(SubjectError::MissingKey("d"))?,
            service.ok_or(SubjectError::MissingKey("n"))?,
            // `i=` (empty): the pod had no IP yet
            Some(ip.as_str()).filter(|ip| !ip.is_empty()),
        )
    }
}

impl fmt::Display for PodSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_uri())
    }
}

impl FromStr for PodSubject {
    type Err = SubjectError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_uri(s)
    }
}

/// Decodes percent-escapes, refusing a `%` not followed by two hex digits and non-UTF-8 results.
fn decode(field: &'static str, raw: &str) -> Result<String, SubjectError> {
    let bytes = raw.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' {
            let well_formed = bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
            if !well_formed {
                return Err(SubjectError::BadEscape { field });
            }
        }
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| SubjectError::BadEscape { field })
}

/// Parses an IP address that is in its canonical text form, so the URI round trip is exact.
fn parse_canonical_ip(raw: &str) -> Result<IpAddr, SubjectError> {
    match raw.parse::<IpAddr>() {
        Ok(ip) if ip.to_string() == raw => Ok(ip),
        _ => Err(SubjectError::BadIp(Quoted::new(raw))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> PodSubject {
        PodSubject::new(
            "media-sports".into(),
            "web-7d9f".into(),
            "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c".into(),
            "media.sports".into(),
            "web".into(),
            Some("10.1.2.3"),
        )
        .unwrap()
    }

    const URI: &str = "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c";

    #[test]
    fn uri_form_is_exact() {
        assert_eq!(subject().to_uri(), URI);
        assert_eq!(PodSubject::parse_uri(URI).unwrap(), subject());
    }

    /// A pod without an IP yet: `i=` in the URI, no `ip` in the JSON; an empty IP in JSON is
    /// still refused (absent is the one spelling of "none").
    #[test]
    fn a_subject_without_an_ip() {
        let s = PodSubject {
            ip: None,
            ..subject()
        };
        let uri = s.to_uri();
        assert_eq!(uri, URI.replace("i=10.1.2.3", "i="));
        assert_eq!(PodSubject::parse_uri(&uri).unwrap(), s);
        let json = serde_json::to_string(&s).unwrap();
        assert!(!json.contains("\"ip\""), "{json}");
        assert_eq!(serde_json::from_str::<PodSubject>(&json).unwrap(), s);
        let empty = json.replace("}", r#","ip":""}"#);
        assert!(
            serde_json::from_str::<PodSubject>(&empty).is_err(),
            "{empty}"
        );
        assert!(
            PodSubject::parse_uri(&URI.replace("&i=10.1.2.3", "")).is_err(),
            "i is still required"
        );
    }

    #[test]
    fn round_trip_with_ipv6_and_underscores() {
        let mut s = subject();
        s.ip = Some("fd00::1".parse().unwrap());
        s.service = "_web_".into();
        let uri = s.to_uri();
        assert!(uri.contains("i=fd00%3A%3A1"), "{uri}");
        assert_eq!(PodSubject::parse_uri(&uri).unwrap(), s);
    }

    #[test]
    fn round_trip_is_exact_over_many_subjects() {
        let namespaces = ["a", "kube-system", "x-y--z", &"n".repeat(63)];
        let names = [
            "p",
            "web-7d9f.abc",
            &format!("{}.{}", "a".repeat(63), "b".repeat(63)),
        ];
        let domains = ["a", "k8s.admin.kube-system", "x.y-z", "_u.V-9"];
        let services = ["s", "_web-", &"S".repeat(63)];
        let ips = [
            "10.0.0.1",
            "255.255.255.255",
            "::1",
            "fd00::10",
            "2001:db8::8a2e:370:7334",
        ];
        let mut checked = 0;
        for ns in namespaces {
            for name in names {
                for domain in domains {
                    for service in services {
                        for ip in ips {
                            let s = PodSubject::new(
                                ns.into(),
                                name.into(),
                                "0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c".into(),
                                domain.into(),
                                service.into(),
                                Some(ip),
                            )
                            .unwrap();
                            let uri = s.to_uri();
                            assert_eq!(PodSubject::parse_uri(&uri).unwrap(), s, "{uri}");
                            assert_eq!(PodSubject::parse_uri(&uri).unwrap().to_uri(), uri);
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 3 * 4 * 3 * 5);
    }

    #[test]
    fn keys_in_any_order_and_needless_escapes_are_accepted() {
        let uri = "pod:media%2Dsports/web-7d9f?u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c&i=10.1.2.3&n=w%65b&d=media.sports";
        assert_eq!(PodSubject::parse_uri(uri).unwrap(), subject());
    }

    #[test]
    fn hostile_uris_are_refused() {
        let cases: &[&str] = &[
            "",
            "pod:",
            "http://media-sports/web?d=a&n=b&i=10.1.2.3&u=x",
            "pod:media-sports/web-7d9f",
            "pod:media-sports?d=media.sports",
            "pod:media-sports/web/x?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            // escapes that decode to separators or NUL
            "pod:media-sports/..%2Fetc?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports%26n%3Dx&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web%00&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            // double encoding stays encoded and then fails validation
            "pod:media-sports/web%252Fx?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            // bad escapes
            "pod:media-sports/web-7d9f?d=media.sports&n=web%&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web%zz&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=%C3%28&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            // keys
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c&x=1",
            "pod:media-sports/web-7d9f?d=media.sports&d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            // field values
            "pod:Media/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media..sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=we.b&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.300&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=010.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=FD00%3A%3A1&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u=0B6E4C1E-8F57-4D5E-9A51-1F0F3C1A2B3C",
        ];
        for uri in cases {
            assert!(PodSubject::parse_uri(uri).is_err(), "accepted {uri:?}");
        }
        let long = format!("{URI}{}", "&x=1".repeat(300));
        let err = PodSubject::parse_uri(&long).unwrap_err();
        assert!(err.to_string().contains("1024"), "{err}");
    }

    #[test]
    fn errors_name_the_field() {
        let err = PodSubject::parse_uri(&URI.replace("n=web", "n=we.b")).unwrap_err();
        assert!(err.to_string().contains("invalid service"), "{err}");
        let err = PodSubject::parse_uri(&URI.replace("&u=", "&z=")).unwrap_err();
        assert!(err.to_string().contains("unknown key \"z\""), "{err}");
    }

    #[test]
    fn json_form_is_validated() {
        let json = serde_json::to_string(&subject()).unwrap();
        assert_eq!(
            json,
            r#"{"namespace":"media-sports","name":"web-7d9f","uid":"0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c","domain":"media.sports","service":"web","ip":"10.1.2.3"}"#
        );
        assert_eq!(
            serde_json::from_str::<PodSubject>(&json).unwrap(),
            subject()
        );
        let bad = json.replace("\"web\"", "\"../web\"");
        let err = serde_json::from_str::<PodSubject>(&bad).unwrap_err();
        assert!(err.to_string().contains("invalid service"), "{err}");
        let extra = json.replace("{", "{\"extra\":1,");
        assert!(serde_json::from_str::<PodSubject>(&extra).is_err());
        let missing = r#"{"namespace":"a","name":"b"}"#;
        assert!(serde_json::from_str::<PodSubject>(missing).is_err());
    }
}
