//! The callback's reading of an attestation JWT (docs/design.md §4.4): header, algorithm, kid and
//! signature, against a real ES256 key; and the node-agent token's shape check.
#![no_main]

use athenz_fuzz::callback_setup;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let setup = callback_setup();
    // an arbitrary token never verifies: a pass would mean the signature check is broken
    assert!(
        athenz_callback::checks::check_token_signature(&setup.policy, &setup.keys, token).is_err()
    );
    let _ = athenz_callback::node::check_token_shape(token);
});
