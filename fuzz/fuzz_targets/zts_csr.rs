//! The dev ZTS's handling of a CSR (docs/design.md §4.5): PEM, DER, signature, then ZTS's rules for
//! an instance CSR and a service (key-based) CSR.
#![no_main]

use athenz_core::crypto::CsrInfo;
use athenz_testbed::zts::x509_cert_request::{
    check_instance_csr, check_parsable, check_service_csr,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = match std::str::from_utf8(data) {
        Ok(pem) if pem.starts_with("-----BEGIN") => CsrInfo::from_pem(pem),
        _ => CsrInfo::from_der(data),
    };
    let Ok(csr) = parsed else {
        return;
    };
    let suffixes = ["athenz.cloud".to_owned()];
    let _ = check_parsable(&csr);
    if let Ok(id) = check_instance_csr(&csr, "media.sports", "web", &suffixes) {
        assert!(!id.is_empty() && !id.contains('/'));
    }
    let _ = check_service_csr(&csr, "k8s.admin", "callback", &suffixes);
});
