//! The agent socket API's request parsing (docs/design.md §4.2): the path (first line of the input)
//! and the body (the rest) as every route reads it: a refresh's strict JSON and presented key
//! and certificate, an init's pod-made CSR and its check against a pod's identity, and the
//! certificate report of the attestation and certificate routes.
#![no_main]

use athenz_core::agent_api::AgentRoute;
use athenz_core::agent_api::InitRequest;
use athenz_core::crypto::CsrInfo;
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_identity_agent::csr_check;
use athenz_identity_agent::manager::PresentedPair;
use athenz_identity_agent::serve::pod_keys::parse_report;
use athenz_identity_agent::serve::socket::parse_refresh_request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (path, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    if let Ok(path) = std::str::from_utf8(path)
        && let Some(Ok(route)) = AgentRoute::parse(path)
    {
        // a valid id is exactly 64 lowercase hex characters, nothing a path could escape with
        let id = route.volume().to_string();
        assert!(
            id.len() == 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
    if let Ok(request) = parse_refresh_request(body) {
        let _ = PresentedPair::parse(request.key_pem.expose(), &request.cert_pem);
    }
    if let Ok(InitRequest { csr: Some(pem) }) = serde_json::from_slice::<InitRequest>(body)
        && let Ok(csr) = CsrInfo::from_pem(&pem)
        && let Ok(expected) = CsrIdentity::for_pod(&PodIdentityInput {
            domain: "media.sports",
            service: "web",
            provider: "k8s.admin.athenz-callback",
            dns_suffix: "athenz.cloud",
            instance_id: "2b9c1f7a-3d2e-4f5a-8b6c-7d8e9f0a1b2c",
            pod_ip: Some(std::net::IpAddr::from([10, 1, 0, 7])),
            service_ip: None,
        })
    {
        let _ = csr_check::differences(&csr, &expected);
    }
    if let Ok(report) = parse_report(body) {
        let _ = athenz_core::crypto::CertInfo::from_pem(&report.cert_pem);
    }
});
