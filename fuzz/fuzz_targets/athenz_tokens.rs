//! The Athenz token parsers: the principal token (ntoken) and the role token, parsed strictly
//! then verified (times, then the signature) against a real key.
#![no_main]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, PublicKey};
use athenz_core::ntoken::{NToken, VerifyLimits};
use athenz_core::role_token::RoleToken;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use time::OffsetDateTime;

fn key() -> &'static PublicKey {
    static KEY: OnceLock<PublicKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let private = PrivateKey::generate(KeyAlgorithm::P256).expect("P-256 key");
        PublicKey::from_spki_der(&private.public_key_der()).expect("public key")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = OffsetDateTime::from_unix_timestamp(athenz_fuzz::NOW).expect("time");
    if let Ok(token) = NToken::parse(text) {
        let _ = token.principal();
        // fuzzed bytes never carry a signature of a key made in this process
        assert!(token.verify(key(), now, VerifyLimits::default()).is_err());
    }
    if let Ok(token) = RoleToken::parse(text) {
        assert!(token.verify(key(), now, VerifyLimits::default()).is_err());
    }
});
