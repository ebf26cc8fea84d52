//! What several fuzz targets share: a callback policy and a real ES256 key pair (the private
//! half signs fuzzed claims so the checks after the signature are reached; the public half is
//! loaded by the callback's own key loader, from a directory as in production).

use athenz_callback::decision::{NodePolicy, Policy};
use athenz_callback::keys::PublicKeys;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_core::names::DomainMapper;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey};
use std::sync::OnceLock;

/// The fixed "now" of the claim checks (2027-01-15T08:00:00Z), so a run is reproducible.
pub const NOW: i64 = 1_800_000_000;
/// The callback's provider name in the fuzzed policy.
pub const PROVIDER: &str = "k8s.admin.athenz-provider";

/// A callback policy and the key it trusts.
pub struct CallbackSetup {
    /// The policy (audience `athenz-k8s`, skew 60 s, tokens up to an hour).
    pub policy: Policy,
    /// The trusted keys: `v1`, ES256.
    pub keys: PublicKeys,
    signer: EncodingKey,
}

impl CallbackSetup {
    /// A JWT with header `{"alg":"ES256","kid":"v1","typ":"JWT"}` and `claims` as its payload,
    /// signed by the trusted key: the bytes are not checked, so the claims parser sees them all.
    pub fn sign(&self, claims: &[u8]) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","kid":"v1","typ":"JWT"}"#);
        let payload = URL_SAFE_NO_PAD.encode(claims);
        let message = format!("{header}.{payload}");
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &self.signer, Algorithm::ES256)
                .expect("signing with a fresh P-256 key");
        format!("{message}.{signature}")
    }
}

/// The shared setup, made once per fuzzing process.
pub fn callback_setup() -> &'static CallbackSetup {
    static SETUP: OnceLock<CallbackSetup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let key = PrivateKey::generate(KeyAlgorithm::P256).expect("P-256 key");
        let dir = std::env::temp_dir().join(format!("athenz-fuzz-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("key dir");
        std::fs::write(dir.join("v1.pem"), key.key_pair().public_key_pem()).expect("v1.pem");
        let keys = PublicKeys::load(&dir).expect("the callback loads the key");
        let _ = std::fs::remove_dir_all(&dir);
        let signer = EncodingKey::from_ec_pem(key.to_pkcs8_pem().expect("PEM").expose().as_bytes())
            .expect("ES256 signer");
        let policy = Policy {
            provider: PROVIDER.into(),
            algorithms: vec![Algorithm::ES256, Algorithm::RS256],
            audience: "athenz-k8s".into(),
            issuer: Some("athenz-jwt-service".into()),
            skew_secs: 60,
            max_lifetime_secs: 3600,
            mapper: DomainMapper::new("k8s.admin", ["kube-system"]).expect("mapper"),
            dns_suffix: "athenz.cloud".into(),
            node: NodePolicy {
                principal: "k8s.admin.athenz-agent".into(),
                audience: "athenz-node".into(),
                namespace: "athenz-system".into(),
                service_account: "athenz-agent".into(),
            },
        };
        CallbackSetup {
            policy,
            keys,
            signer,
        }
    })
}
