//! A provider's answer read as ZTS reads it: Athenz's `InstanceProviderClient` hands the response
//! to Jersey with Jackson (`libs/java/instance_provider`), and what that accepts is what ZTS acts
//! on. Checked against Athenz's own client by callback/tests/athenz_provider_client.rs
//! (`odd_provider_answers_are_read_as_zts_reads_them`), which found each rule here:
//!
//! - a refusal's text is the body as sent (newlines made spaces); "N/A" only when no body could
//!   be read at all, never for an empty one (`responseText`);
//! - a 200 is read only when labelled JSON (`application/json`, `text/json` or `…+json`): Jersey
//!   has no reader for `InstanceConfirmation` from any other media type, so ZTS gets an exception
//!   and answers 403;
//! - the confirmation must be a JSON object with no field `InstanceConfirmation` does not define
//!   (Jersey's Jackson fails on unknown properties), its strings may come as numbers or booleans
//!   (Jackson coerces scalars to `String`), and so may the attributes' values.

use athenz_core::zts::InstanceConfirmation;
use serde_json::{Map, Value};

/// The fields of Athenz's `InstanceConfirmation`.
const FIELDS: [&str; 5] = [
    "provider",
    "domain",
    "service",
    "attestationData",
    "attributes",
];

/// A refusal's text from the body as read (`None`: it could not be read).
pub fn refusal_text(body: Option<&[u8]>) -> String {
    match body {
        Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        None => "N/A".into(),
    }
}

/// Whether Jersey's Jackson provider reads this media type.
pub fn is_json(content_type: Option<&str>) -> bool {
    let Some(media) = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
    else {
        return false;
    };
    media == "application/json" || media == "text/json" || media.ends_with("+json")
}

/// A 200's body as the confirmation ZTS would hold, or why Athenz's client could not read it.
pub fn read_confirmation(body: &[u8]) -> Result<InstanceConfirmation, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let Value::Object(fields) = value else {
        return Err("not a JSON object".into());
    };
    let mut normalized = Map::new();
    for (name, value) in fields {
        if !FIELDS.contains(&name.as_str()) {
            return Err(format!("unrecognized field \"{name}\""));
        }
        let value = match (name.as_str(), value) {
            (_, Value::Null) => continue,
            ("attributes", Value::Object(attributes)) => Value::Object(
                attributes
                    .into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| scalar_text(&format!("attributes.{k}"), v).map(|t| (k, t.into())))
                    .collect::<Result<_, _>>()?,
            ),
            ("attributes", other) => return Err(format!("attributes is {other}, not an object")),
            (name, scalar) => scalar_text(name, scalar)?.into(),
        };
        normalized.insert(name, value);
    }
    for required in ["provider", "domain", "service"] {
        normalized
            .entry(required)
            .or_insert_with(|| Value::String(String::new()));
    }
    serde_json::from_value(Value::Object(normalized)).map_err(|e| e.to_string())
}

/// A scalar as the text Jackson makes of it for a `String`.
fn scalar_text(name: &str, value: Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("{name} is {other}, not text")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        for yes in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "text/json",
            "application/problem+json",
        ] {
            assert!(is_json(Some(yes)), "{yes}");
        }
        for no in [
            "",
            "text/plain",
            "application/octet-stream",
            "application/jsonx",
        ] {
            assert!(!is_json(Some(no)), "{no}");
        }
        assert!(!is_json(None));
    }

    #[test]
    fn confirmations_are_read_as_jackson_reads_them() {
        let c = read_confirmation(
            br#"{"provider":"p","domain":"d","service":"s","attributes":{"certExpiryTime":90,"flag":true,"gone":null}}"#,
        )
        .unwrap();
        assert_eq!(c.attributes["certExpiryTime"], "90");
        assert_eq!(c.attributes["flag"], "true");
        assert!(!c.attributes.contains_key("gone"));
        let c = read_confirmation(br#"{"domain":7,"attestationData":null}"#).unwrap();
        assert_eq!((c.provider.as_str(), c.domain.as_str()), ("", "7"));
    }

    #[test]
    fn hostile_and_malformed_confirmations_are_unreadable() {
        for bad in [
            &b""[..],
            b"not json",
            b"[]",
            b"\"text\"",
            br#"{"provider":"p","extra":1}"#,
            br#"{"attributes":[]}"#,
            br#"{"attributes":{"a":[1]}}"#,
            br#"{"attributes":{"a":{"b":1}}}"#,
            br#"{"provider":{"nested":true}}"#,
        ] {
            assert!(
                read_confirmation(bad).is_err(),
                "{:?} read",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(read_confirmation(deep.as_bytes()).is_err());
    }

    #[test]
    fn refusal_text_keeps_an_empty_body_empty() {
        assert_eq!(refusal_text(Some(b"")), "");
        assert_eq!(refusal_text(Some(b"no")), "no");
        assert_eq!(refusal_text(None), "N/A");
    }
}
