//! `athenz-sia status`, as a real process over real files written the way the SIA and the CSI
//! driver write them (one atomic set): healthy, then each way the files can be unusable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::KeyAlgorithm;
use athenz_core::files::{Credentials, FileSet, credential_files};
use athenz_core::secret::Secret;
use athenz_testbed::pki::{CertAuthority, IssuedCert, LeafSpec};
use std::path::Path;
use std::process::Command;
use time::Duration;

const SIA: &str = env!("CARGO_BIN_EXE_athenz-sia");
const PRINCIPAL: &str = "media.sports.web";

fn leaf(ca: &CertAuthority, validity: Duration) -> IssuedCert {
    let mut spec = LeafSpec::service(PRINCIPAL, &["web.media-sports.athenz.cloud"]);
    spec.uris = vec!["spiffe://media.sports/sa/web".into()];
    spec.ip_addresses = vec!["10.1.2.3".parse().unwrap()];
    spec.validity = validity;
    spec.backdate = Duration::minutes(5);
    ca.issue(&spec, KeyAlgorithm::P256).unwrap()
}

fn write(dir: &Path, key: &Secret, cert: &str, ca: &str) {
    let ntoken = Secret::new("v=S1;d=media.sports;n=web;s=x");
    let creds = Credentials {
        key_pem: Some(key),
        cert_pem: cert,
        ca_pem: ca,
        ntoken: &ntoken,
    };
    FileSet::new(dir)
        .write(&credential_files(&creds, None), None)
        .unwrap();
}

fn status(dir: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(SIA)
        .args(["status", "--json", "--out-dir"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap(), json)
}

fn problems(json: &serde_json::Value) -> String {
    json["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn healthy_files_are_described_and_exit_0() {
    let ca = CertAuthority::new_root("Athenz CA").unwrap();
    let cert = leaf(&ca, Duration::hours(1));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &cert.key_pem, &cert.chain_pem, ca.root_pem());
    let (code, json) = status(dir.path(), &[]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["healthy"], true);
    assert_eq!(json["principal"], PRINCIPAL);
    assert_eq!(json["dns_names"][0], "web.media-sports.athenz.cloud");
    assert_eq!(json["ip_addresses"][0], "10.1.2.3");
    assert_eq!(json["uris"][0], "spiffe://media.sports/sa/web");
    assert_eq!(json["serial"], cert.serial_hex.as_str());
    assert_eq!(json["chain_verified"], true);
    assert_eq!(json["key_matches"], true);
    let left = json["expires_in_seconds"].as_i64().unwrap();
    assert!((3500..=3600).contains(&left), "{left}");
    assert_eq!(problems(&json), "");

    // the text form says the same, for a person
    let out = Command::new(SIA)
        .args(["status", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("healthy:     yes"), "{text}");
    assert!(
        text.contains(&format!("principal:   {PRINCIPAL}")),
        "{text}"
    );
    assert!(text.contains("verified against ca.cert.pem"), "{text}");
    // the private key is never printed
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}

#[test]
fn a_certificate_close_to_expiry_fails_a_probe_that_asks_for_more() {
    let ca = CertAuthority::new_root("Athenz CA").unwrap();
    let cert = leaf(&ca, Duration::minutes(5));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &cert.key_pem, &cert.chain_pem, ca.root_pem());
    assert_eq!(status(dir.path(), &["--min-remaining", "1m"]).0, 0);
    let (code, json) = status(dir.path(), &["--min-remaining", "10m"]);
    assert_eq!(code, 1);
    assert!(
        problems(&json).contains("less than --min-remaining 600 s"),
        "{json}"
    );
}

#[test]
fn every_unusable_set_exits_1_naming_the_fault() {
    let ca = CertAuthority::new_root("Athenz CA").unwrap();
    let other_ca = CertAuthority::new_root("Another CA").unwrap();
    let good = leaf(&ca, Duration::hours(1));
    let expired = leaf(&ca, Duration::minutes(-1));
    let foreign = leaf(&other_ca, Duration::hours(1));
    let another_key = leaf(&ca, Duration::hours(1)).key_pem;
    let cases: [(&str, &Secret, &str, &str); 4] = [
        (
            "expired at",
            &expired.key_pem,
            &expired.chain_pem,
            ca.root_pem(),
        ),
        (
            "does not verify against ca.cert.pem",
            &foreign.key_pem,
            &foreign.chain_pem,
            ca.root_pem(),
        ),
        (
            "is not the private key of service.cert.pem",
            &another_key,
            &good.chain_pem,
            ca.root_pem(),
        ),
        (
            "service.cert.pem",
            &good.key_pem,
            "not a certificate",
            ca.root_pem(),
        ),
    ];
    for (fault, key, cert, ca_pem) in cases {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), key, cert, ca_pem);
        let (code, json) = status(dir.path(), &[]);
        assert_eq!(code, 1, "{fault}: {json}");
        assert_eq!(json["healthy"], false);
        assert!(problems(&json).contains(fault), "{fault}: {json}");
    }
    // nothing written yet (an init container that has not run)
    let empty = tempfile::tempdir().unwrap();
    let (code, json) = status(empty.path(), &[]);
    assert_eq!(code, 1);
    assert!(
        problems(&json).contains("cannot read the identity files"),
        "{json}"
    );
    assert_eq!(json["principal"], serde_json::Value::Null);
}
