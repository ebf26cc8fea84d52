//! The agent socket API's request parsing (DESIGN.md 4.2): the path (first line of the input)
//! and, for refresh, the body (the rest): the strict JSON and the presented key and certificate.
#![no_main]

use athenz_core::agent_api::AgentRoute;
use athenz_identity_agent::service::{PresentedPair, parse_refresh_request};
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
        let id = match route {
            AgentRoute::Init(id) | AgentRoute::Refresh(id) => id.to_string(),
        };
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
});
