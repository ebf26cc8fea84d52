//! What athenz-core produces, judged by openssl: CSRs (signature, subject, every SAN), keys,
//! certificate chains from the test PKI, and ntoken signatures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr};
use athenz_core::ntoken::{NToken, NTokenBuilder, ybase64_decode};
use athenz_testbed::fixtures::pod_identity;
use athenz_testbed::openssl;
use athenz_testbed::pki::{CertAuthority, LeafSpec};

/// The line after `X509v3 Subject Alternative Name:` in openssl's text output.
fn san_line(text: &str) -> String {
    let mut lines = text.lines();
    lines
        .find(|l| l.contains("X509v3 Subject Alternative Name"))
        .expect("no SAN extension in openssl output");
    lines.next().unwrap_or_default().trim().to_owned()
}

fn subject_line(text: &str) -> String {
    text.lines()
        .find(|l| l.trim_start().starts_with("Subject:"))
        .expect("no Subject line")
        .trim()
        .to_owned()
}

#[test]
fn openssl_accepts_pod_csrs_and_shows_exactly_the_identity() {
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PrivateKey::generate(alg).unwrap();
        let csr = build_csr(&pod_identity(), &key).unwrap();
        let text = openssl::csr_text(&csr).unwrap();
        assert!(
            text.contains("verify OK"),
            "openssl did not verify the CSR signature: {text}"
        );
        assert_eq!(
            subject_line(&text),
            "Subject: CN = media.sports.web, OU = k8s.admin.athenz-callback"
        );
        assert_eq!(
            san_line(&text),
            "DNS:web.media-sports.athenz.cloud, \
             DNS:0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c.instanceid.athenz.athenz.cloud, \
             IP Address:10.1.2.3, IP Address:FD00:0:0:0:0:0:0:10, \
             URI:spiffe://media.sports/sa/web, \
             URI:athenz://instanceid/k8s.admin.athenz-callback/0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c"
        );
        let expected_alg = match alg {
            KeyAlgorithm::P256 => "ecdsa-with-SHA256",
            KeyAlgorithm::Rsa2048 => "sha256WithRSAEncryption",
        };
        assert!(text.contains(expected_alg), "{text}");
    }
}

#[test]
fn openssl_rejects_a_tampered_csr() {
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let csr = build_csr(&pod_identity(), &key).unwrap();
    // change one base64 character in the middle of the body
    let mut lines: Vec<String> = csr.lines().map(str::to_owned).collect();
    let mid = lines.len() / 2;
    let flipped: String = lines[mid]
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i == 10 {
                if c == 'A' { 'B' } else { 'A' }
            } else {
                c
            }
        })
        .collect();
    lines[mid] = flipped;
    let tampered = lines.join("\n") + "\n";
    assert!(openssl::csr_text(&tampered).is_err());
}

#[test]
fn generated_keys_are_pkcs8_that_openssl_reads() {
    for (alg, kind) in [
        (KeyAlgorithm::P256, "ASN1 OID: prime256v1"),
        (KeyAlgorithm::Rsa2048, "Private-Key: (2048 bit"),
    ] {
        let key = PrivateKey::generate(alg).unwrap();
        let pem = key.to_pkcs8_pem().unwrap();
        assert!(pem.expose().starts_with("-----BEGIN PRIVATE KEY-----"));
        let text = openssl::run(&["pkey", "-noout", "-text"], pem.expose().as_bytes()).unwrap();
        assert!(text.contains(kind), "{text}");
    }
}

#[test]
fn openssl_verifies_the_test_pki_chain() {
    let root = CertAuthority::new_root("Athenz Test Root").unwrap();
    let inter = root.new_intermediate("Athenz Test Intermediate").unwrap();
    let identity = pod_identity();
    let key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
    let leaf = inter
        .issue_for_key(
            &LeafSpec::from_identity(&identity, time::Duration::hours(1)),
            &key.public_key_der(),
        )
        .unwrap();
    openssl::verify(root.root_pem(), inter.intermediates_pem(), &leaf.cert_pem).unwrap();
    let text = openssl::cert_text(&leaf.cert_pem).unwrap();
    assert!(text.contains("TLS Web Server Authentication, TLS Web Client Authentication"));
    assert!(san_line(&text).starts_with("DNS:web.media-sports.athenz.cloud"));
    // a leaf from another root does not verify
    let other = CertAuthority::new_root("Other Root").unwrap();
    assert!(openssl::verify(other.root_pem(), "", &leaf.cert_pem).is_err());
}

#[test]
fn openssl_verifies_ntoken_signatures() {
    for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
        let key = PrivateKey::generate(alg).unwrap();
        let token = NTokenBuilder {
            domain: "k8s.admin".into(),
            service: "athenz-callback".into(),
            host: None,
            key_version: "v1".into(),
            key_service: None,
            lifetime: time::Duration::hours(1),
        }
        .sign(&key, time::OffsetDateTime::now_utc())
        .unwrap();
        let parsed = NToken::parse(token.expose()).unwrap();
        let sig = ybase64_decode(token.expose().split(";s=").nth(1).unwrap()).unwrap();

        let public = key.key_pair().public_key_pem();
        openssl::verify_sha256_signature(&public, &sig, parsed.signed_text().as_bytes()).unwrap();
        // and a different text does not verify
        let tampered = format!("{}x", parsed.signed_text());
        assert!(openssl::verify_sha256_signature(&public, &sig, tampered.as_bytes()).is_err());
    }
}
