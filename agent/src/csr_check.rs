//! A pod-made CSR, checked against what the agent derives for the pod (docs/design.md §4.6): the
//! subject and every SAN exactly, and a key type and size that are allowed. Anything else is a
//! 400 naming each difference, before a JWT is asked for or ZTS is called, so a pod cannot use
//! the agent's attestation for a name it is not entitled to (the callback would refuse it too,
//! but only after the node had vouched for the request).

use crate::failure::{Failure, fail};
use athenz_core::crypto::{CsrInfo, KeyType, public_key_type};
use athenz_core::names::CsrIdentity;
use http::StatusCode;
use std::collections::BTreeSet;
use std::fmt::Display;

/// Smallest RSA key accepted (bits): what Athenz ZTS itself requires.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest RSA key accepted (bits): bounds the verification work a pod can cause.
pub const MAX_RSA_BITS: usize = 4096;

/// 400 unless `csr` (read and signature-checked) says exactly what `expected` says.
pub fn check(csr: &CsrInfo, expected: &CsrIdentity) -> Result<(), Failure> {
    let differences = differences(csr, expected);
    if differences.is_empty() {
        return Ok(());
    }
    Err(fail(
        StatusCode::BAD_REQUEST,
        format!(
            "the pod's CSR is not what this pod may ask for: {}",
            differences.join("; ")
        ),
    ))
}

/// Every way `csr` differs from `expected`, each said in words.
pub fn differences(csr: &CsrInfo, expected: &CsrIdentity) -> Vec<String> {
    let mut found = Vec::new();
    if csr.common_name != expected.common_name {
        found.push(format!(
            "subject CN is {:?}, this pod's is {:?}",
            csr.common_name, expected.common_name
        ));
    }
    let expected_ous: Vec<String> = expected.organizational_unit.iter().cloned().collect();
    if csr.organizational_units != expected_ous {
        found.push(format!(
            "subject OU is {:?}, this pod's is {:?}",
            csr.organizational_units, expected_ous
        ));
    }
    for extra in csr
        .subject_attributes
        .iter()
        .filter(|a| !a.starts_with("CN=") && !a.starts_with("OU="))
    {
        found.push(format!("subject attribute {extra} is not allowed"));
    }
    compare_sans("DNS", &csr.dns_names, &expected.dns_names, &mut found);
    compare_sans("IP", &csr.ip_addresses, &expected.ip_addresses, &mut found);
    compare_sans("URI", &csr.uris, &expected.uris, &mut found);
    for email in &csr.emails {
        found.push(format!("email SAN {email:?} is not allowed"));
    }
    if let Some(why) = key_refusal(&csr.public_key_der) {
        found.push(why);
    }
    found
}

/// Why the key is not allowed, if it is not: EC P-256, or RSA of 2048 to 4096 bits.
fn key_refusal(spki_der: &[u8]) -> Option<String> {
    match public_key_type(spki_der) {
        Ok(KeyType::EcP256) => None,
        Ok(KeyType::Rsa { bits }) if (MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) => None,
        Ok(KeyType::Rsa { bits }) if bits < MIN_RSA_BITS => Some(format!(
            "key RSA-{bits} is too weak: RSA keys need at least {MIN_RSA_BITS} bits"
        )),
        Ok(KeyType::Rsa { bits }) => Some(format!(
            "key RSA-{bits} is larger than the {MAX_RSA_BITS} bits allowed"
        )),
        Ok(other) => Some(format!(
            "key type {other} is not allowed: use EC P-256 or RSA of {MIN_RSA_BITS} to {MAX_RSA_BITS} bits"
        )),
        Err(e) => Some(format!("key: {e}")),
    }
}

/// SANs of one kind, as sets: each one the CSR adds, each one it lacks, each one it repeats.
fn compare_sans<T: Ord + Display>(kind: &str, got: &[T], want: &[T], found: &mut Vec<String>) {
    let got_set: BTreeSet<&T> = got.iter().collect();
    let want_set: BTreeSet<&T> = want.iter().collect();
    for extra in got_set.difference(&want_set) {
        found.push(format!("{kind} SAN {extra} is not this pod's"));
    }
    for missing in want_set.difference(&got_set) {
        found.push(format!("{kind} SAN {missing} is missing"));
    }
    if got_set.len() != got.len() {
        found.push(format!("{kind} SANs are repeated"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use athenz_core::crypto::{KeyAlgorithm, PrivateKey, build_csr};
    use athenz_core::names::PodIdentityInput;

    fn expected() -> CsrIdentity {
        CsrIdentity::for_pod(&PodIdentityInput {
            domain: "media.sports",
            service: "web",
            provider: "k8s.admin.athenz-callback",
            dns_suffix: "athenz.cloud",
            instance_id: "2b9c1f7a-3d2e-4f5a-8b6c-7d8e9f0a1b2c",
            pod_ip: Some("10.1.0.7".parse().unwrap()),
            service_ip: None,
        })
        .unwrap()
    }

    fn csr_for(identity: &CsrIdentity, alg: KeyAlgorithm) -> CsrInfo {
        let key = PrivateKey::generate(alg).unwrap();
        CsrInfo::from_pem(&build_csr(identity, &key).unwrap()).unwrap()
    }

    fn refusal(identity: &CsrIdentity) -> String {
        let failure = check(&csr_for(identity, KeyAlgorithm::P256), &expected()).unwrap_err();
        assert_eq!(failure.status, StatusCode::BAD_REQUEST);
        failure.message
    }

    #[test]
    fn the_exact_identity_passes_with_either_key() {
        for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
            check(&csr_for(&expected(), alg), &expected()).unwrap();
        }
    }

    #[test]
    fn each_difference_is_named() {
        let mut changed = expected();
        changed.dns_names[0] = "api.media-sports.athenz.cloud".into();
        let why = refusal(&changed);
        assert!(
            why.contains("DNS SAN api.media-sports.athenz.cloud is not this pod's"),
            "{why}"
        );
        assert!(
            why.contains(&format!("DNS SAN {} is missing", expected().dns_names[0])),
            "{why}"
        );

        let mut added = expected();
        added.ip_addresses.push("10.9.9.9".parse().unwrap());
        assert!(refusal(&added).contains("IP SAN 10.9.9.9 is not this pod's"));

        let mut removed = expected();
        let uri = removed.uris.pop().unwrap();
        assert!(refusal(&removed).contains(&format!("URI SAN {uri} is missing")));

        let mut other_service = expected();
        other_service.common_name = "media.sports.api".into();
        assert!(refusal(&other_service).contains("subject CN is \"media.sports.api\""));

        let mut no_ou = expected();
        no_ou.organizational_unit = None;
        assert!(refusal(&no_ou).contains("subject OU is []"));

        let mut repeated = expected();
        repeated.dns_names.push(repeated.dns_names[0].clone());
        assert!(refusal(&repeated).contains("DNS SANs are repeated"));
    }

    #[test]
    fn weak_and_foreign_keys_are_named() {
        // public keys made with `openssl genrsa 1024` and `openssl ecparam -name secp384r1`
        let rsa_1024 = include_bytes!("../tests/fixtures/rsa1024.spki.der");
        assert_eq!(
            key_refusal(rsa_1024).unwrap(),
            "key RSA-1024 is too weak: RSA keys need at least 2048 bits"
        );
        let why = key_refusal(include_bytes!("../tests/fixtures/p384.spki.der")).unwrap();
        assert!(
            why.starts_with("key type EC on curve 1.3.132.0.34 is not allowed"),
            "{why}"
        );
    }
}
