//! The agent's socket API across versions (docs/design.md §4.2; README "Upgrades"), against golden
//! files: `golden/socket-api/<major.minor>/<call>.json`, one per call of each version, holding
//! its method, path, request body, status and answer as that version sends them.
//!
//! A node runs an agent and SIAs of different versions for as long as a DaemonSet rollout and
//! the pods' own lifetimes overlap, in both orders. So, for every version's files:
//! - this version reads them: an older SIA's requests reach this agent, an older agent's
//!   answers reach this SIA;
//! - this version writes every field they hold, under the same name and with the same JSON
//!   type: an older peer reads what this one sends (a renamed or removed field fails here);
//! - this version ignores fields it does not know, at every level: a newer peer may add them;
//! - the current version's files are exactly what this version writes, so a change to the wire
//!   is a change to the files, in review.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::agent_api::{
    AgentRoute, AttestationRequest, AttestationResponse, CertificateReport, CsrTemplate,
    IdentityResponse, InitRequest, RefreshRequest, VOLUME_HEADER, zts_authority,
};
use athenz_core::http::ErrorBody;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One golden file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Golden {
    #[allow(dead_code)]
    about: String,
    method: String,
    /// The request path (`/v1/...`), or for `CONNECT` the authority.
    path: String,
    #[serde(default)]
    headers: Map<String, Value>,
    request: Option<Value>,
    status: u16,
    response: Option<Value>,
}

/// The answer to a certificate report: a JSON object whose contents the SIA does not use.
#[derive(Debug, serde::Deserialize, Serialize)]
struct Acknowledged {}

fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/socket-api")
}

/// `major.minor` of this crate: the directory of the current version's files.
fn current_version() -> String {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    format!("{}.{}", parts.next().unwrap(), parts.next().unwrap())
}

/// Every version directory and its files, oldest first.
fn versions() -> Vec<(String, Vec<(String, Golden)>)> {
    let mut versions: Vec<(String, Vec<(String, Golden)>)> = std::fs::read_dir(golden_root())
        .unwrap()
        .map(|entry| {
            let dir = entry.unwrap().path();
            let version = dir.file_name().unwrap().to_string_lossy().into_owned();
            let mut files: Vec<(String, Golden)> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|f| {
                    let path = f.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    let text = std::fs::read_to_string(&path).unwrap();
                    let golden = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("{version}/{name}: {e}"));
                    (name, golden)
                })
                .collect();
            files.sort_by(|a, b| a.0.cmp(&b.0));
            (version, files)
        })
        .collect();
    versions.sort_by(|a, b| a.0.cmp(&b.0));
    versions
}

/// Reads `value` as `T` and writes it back: what this version makes of what a peer sent.
fn through<T: DeserializeOwned + Serialize>(what: &str, value: &Value) -> Value {
    let parsed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{what}: this version cannot read it: {e}"));
    serde_json::to_value(&parsed).unwrap()
}

/// The request and answer of `golden` through this version's types (`None`: no body).
fn round_trip(what: &str, golden: &Golden) -> (Option<Value>, Option<Value>) {
    let request = golden.request.as_ref();
    let response = golden.response.as_ref();
    if golden.method == "CONNECT" {
        assert!(
            request.is_none() && response.is_none(),
            "{what}: CONNECT has no bodies"
        );
        return (None, None);
    }
    let route = AgentRoute::parse(&golden.path)
        .unwrap_or_else(|| panic!("{what}: this version has no route {}", golden.path))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        golden.method,
        route.method().as_str(),
        "{what}: the method of {}",
        route.name()
    );
    let request = request.map(|r| match route {
        AgentRoute::Init(_) => through::<InitRequest>(what, r),
        AgentRoute::Refresh(_) => through::<RefreshRequest>(what, r),
        AgentRoute::Csr(_) => panic!("{what}: GET has no body"),
        AgentRoute::Attestation(_) => through::<AttestationRequest>(what, r),
        AgentRoute::Certificate(_) => through::<CertificateReport>(what, r),
    });
    let answer = response.unwrap_or_else(|| panic!("{what}: no answer"));
    let response = if golden.status == 200 {
        match route {
            AgentRoute::Init(_) | AgentRoute::Refresh(_) => {
                through::<IdentityResponse>(what, answer)
            }
            AgentRoute::Csr(_) => through::<CsrTemplate>(what, answer),
            AgentRoute::Attestation(_) => through::<AttestationResponse>(what, answer),
            AgentRoute::Certificate(_) => through::<Acknowledged>(what, answer),
        }
    } else {
        through::<ErrorBody>(what, answer)
    };
    (request, Some(response))
}

/// Where `written` (this version's) lacks a field of `older` (a golden's), or holds it with
/// another JSON type: what an older reader would miss.
fn missing_for_older(older: &Value, written: &Value, at: &str) -> Vec<String> {
    match (older, written) {
        (Value::Object(old), Value::Object(new)) => old
            .iter()
            .flat_map(|(key, old_value)| {
                let path = format!("{at}.{key}");
                match new.get(key) {
                    None => vec![format!("{path} is gone")],
                    Some(new_value) => missing_for_older(old_value, new_value, &path),
                }
            })
            .collect(),
        (Value::Array(old), Value::Array(new)) => old
            .iter()
            .zip(new)
            .enumerate()
            .flat_map(|(i, (o, n))| missing_for_older(o, n, &format!("{at}[{i}]")))
            .collect(),
        (o, n) if std::mem::discriminant(o) != std::mem::discriminant(n) => {
            vec![format!("{at} was {o}, is now {n}")]
        }
        _ => Vec::new(),
    }
}

/// `value` with a field no version has, added to every object in it.
fn with_a_newer_field(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut map: Map<String, Value> = map
                .iter()
                .map(|(k, v)| (k.clone(), with_a_newer_field(v)))
                .collect();
            map.insert(
                "addedInALaterVersion".into(),
                serde_json::json!({"any": ["shape", 1]}),
            );
            Value::Object(map)
        }
        Value::Array(items) => Value::Array(items.iter().map(with_a_newer_field).collect()),
        other => other.clone(),
    }
}

#[test]
fn every_call_of_this_version_has_a_golden_file() {
    let versions = versions();
    let (_, current) = versions
        .iter()
        .find(|(v, _)| *v == current_version())
        .unwrap_or_else(|| {
            panic!(
                "no golden files for this version ({}) under {}",
                current_version(),
                golden_root().display()
            )
        });
    let id = "a".repeat(64);
    let calls = [
        format!("/v1/init/{id}"),
        format!("/v1/refresh/{id}"),
        format!("/v1/csr/{id}"),
        format!("/v1/attestation/{id}"),
        format!("/v1/certificate/{id}"),
    ];
    for call in &calls {
        let route = AgentRoute::parse(call).unwrap().unwrap();
        let covered = current.iter().any(|(_, g)| {
            g.status == 200
                && AgentRoute::parse(&g.path)
                    .is_some_and(|r| r.is_ok_and(|r| r.name() == route.name()))
        });
        assert!(covered, "no golden file answers {} ({call})", route.name());
    }
    assert!(
        current.iter().any(|(_, g)| g.status != 200),
        "no golden file for a refusal"
    );
    assert!(
        current.iter().any(|(_, g)| g.method == "CONNECT"),
        "no golden file for the CONNECT tunnel"
    );
}

#[test]
fn this_version_reads_every_versions_calls_and_writes_every_field_they_hold() {
    for (version, files) in versions() {
        for (name, golden) in &files {
            let what = format!("{version}/{name}");
            let (request, response) = round_trip(&what, golden);
            for (side, older, written) in [
                ("request", golden.request.as_ref(), request.as_ref()),
                ("response", golden.response.as_ref(), response.as_ref()),
            ] {
                let (Some(older), Some(written)) = (older, written) else {
                    continue;
                };
                let missing = missing_for_older(older, written, side);
                assert!(
                    missing.is_empty(),
                    "{what}: a peer of version {version} would not find: {missing:?}"
                );
                if version == current_version() {
                    assert_eq!(
                        older, written,
                        "{what}: the {side} this version writes differs from its golden file \
                         (a change to the wire is a change to the files)"
                    );
                }
            }
        }
    }
}

#[test]
fn this_version_ignores_what_a_newer_version_adds() {
    for (version, files) in versions() {
        for (name, golden) in &files {
            let what = format!("{version}/{name}, with a field from a later version");
            let newer = Golden {
                about: String::new(),
                method: golden.method.clone(),
                path: golden.path.clone(),
                headers: golden.headers.clone(),
                request: golden.request.as_ref().map(with_a_newer_field),
                status: golden.status,
                response: golden.response.as_ref().map(with_a_newer_field),
            };
            // read as well as the golden itself, and to the same thing
            assert_eq!(
                round_trip(&what, &newer),
                round_trip(&format!("{version}/{name}"), golden),
                "{what}"
            );
        }
    }
}

#[test]
fn the_tunnel_keeps_its_header_and_authority() {
    for (version, files) in versions() {
        for (name, golden) in files.iter().filter(|(_, g)| g.method == "CONNECT") {
            let what = format!("{version}/{name}");
            assert!(
                golden.headers.contains_key(VOLUME_HEADER),
                "{what}: the volume header is now {VOLUME_HEADER:?}, the file says {:?}",
                golden.headers.keys().collect::<Vec<_>>()
            );
            let attestation = files
                .iter()
                .find_map(|(_, g)| g.path.starts_with("/v1/attestation/").then_some(g))
                .and_then(|g| g.response.as_ref())
                .unwrap_or_else(|| panic!("{version}: no attestation answer to name ZTS"));
            let url = attestation["zts"]["url"].as_str().unwrap();
            let (host, port) = zts_authority(url).unwrap();
            assert_eq!(golden.path, format!("{host}:{port}"), "{what}");
        }
    }
}

#[test]
fn the_older_reader_check_catches_a_renamed_removed_or_retyped_field() {
    let golden = serde_json::json!({"certPEM": "x", "csr": {"dnsNames": ["a"], "uris": []}});
    assert!(missing_for_older(&golden, &golden, "r").is_empty());
    let renamed = serde_json::json!({"certPem": "x", "csr": {"dnsNames": ["a"], "uris": []}});
    assert_eq!(
        missing_for_older(&golden, &renamed, "r"),
        ["r.certPEM is gone"]
    );
    let removed = serde_json::json!({"certPEM": "x", "csr": {"dnsNames": ["a"]}});
    assert_eq!(
        missing_for_older(&golden, &removed, "r"),
        ["r.csr.uris is gone"]
    );
    let retyped = serde_json::json!({"certPEM": "x", "csr": {"dnsNames": "a", "uris": []}});
    assert_eq!(
        missing_for_older(&golden, &retyped, "r"),
        [r#"r.csr.dnsNames was ["a"], is now "a""#]
    );
    // an added field is for newer readers: older ones ignore it
    let added =
        serde_json::json!({"certPEM": "x", "new": 1, "csr": {"dnsNames": ["a"], "uris": []}});
    assert!(missing_for_older(&golden, &added, "r").is_empty());
}
