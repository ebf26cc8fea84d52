//! Athenz principal tokens ("ntokens"), docs/design.md §4.5.
//!
//! `v=S1;d=<domain>;n=<service>;h=<host>;a=<salt>;t=<issued>;e=<expires>;k=<key version>;s=<sig>`
//!
//! The signature is SHA-256 RSA or ECDSA over the exact text before `;s=`, encoded in "ybase64"
//! (standard base64 with `+/=` replaced by `._-`). Verification always uses the bytes received,
//! never a re-serialisation, so field order and unknown-but-allowed fields cannot break it.

use crate::crypto::{CryptoError, PrivateKey, PublicKey};
use crate::names::{self, NameError, Quoted};
use crate::secret::Secret;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::fmt;
use thiserror::Error;
use time::{Duration, OffsetDateTime};

/// Longest ntoken accepted.
pub const MAX_NTOKEN_LEN: usize = 4096;

const SIGNATURE_MARKER: &str = ";s=";

/// Why a token was refused.
#[derive(Debug, Error)]
pub enum NTokenError {
    /// Not of the `k=v;...;s=sig` form, or a field is missing, repeated or unknown.
    #[error("ntoken is malformed: {0}")]
    Malformed(String),
    /// A name field broke its rule.
    #[error("ntoken {0}")]
    Name(#[from] NameError),
    /// The signature does not verify with the key.
    #[error("ntoken signature does not verify")]
    BadSignature,
    /// The token has expired.
    #[error("ntoken expired at {expires} (now {now})")]
    Expired {
        /// `e` field.
        expires: i64,
        /// Verification time.
        now: i64,
    },
    /// The token was issued further in the future than the allowed skew.
    #[error("ntoken is issued in the future ({issued}, now {now})")]
    IssuedInFuture {
        /// `t` field.
        issued: i64,
        /// Verification time.
        now: i64,
    },
    /// The token's lifetime is longer than allowed, or negative.
    #[error("ntoken lifetime of {lifetime} s is outside 1..={max} s")]
    BadLifetime {
        /// `e - t`.
        lifetime: i64,
        /// The allowed maximum.
        max: i64,
    },
    /// Signing failed.
    #[error("signing the ntoken failed: {0}")]
    Signing(#[from] CryptoError),
}

/// A parsed ntoken. Holds the received text so verification uses exactly those bytes.
#[derive(Clone)]
pub struct NToken {
    raw: String,
    /// `v`: token version, `S1` for services.
    pub version: String,
    /// `d`: domain.
    pub domain: String,
    /// `n`: service name.
    pub service: String,
    /// `h`: host that asked for it, if present.
    pub host: Option<String>,
    /// `i`: IP, if present.
    pub ip: Option<String>,
    /// `a`: random salt.
    pub salt: String,
    /// `t`: issue time, Unix seconds.
    pub issued: i64,
    /// `e`: expiry time, Unix seconds.
    pub expires: i64,
    /// `k`: version of the key that signed it.
    pub key_version: String,
    /// `z`: key service, if present.
    pub key_service: Option<String>,
    signature: Vec<u8>,
}

impl fmt::Debug for NToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NToken")
            .field("domain", &self.domain)
            .field("service", &self.service)
            .field("issued", &self.issued)
            .field("expires", &self.expires)
            .field("key_version", &self.key_version)
            .finish_non_exhaustive()
    }
}

/// Limits applied when verifying.
#[derive(Debug, Clone, Copy)]
pub struct VerifyLimits {
    /// How far in the future `t` may be (clock skew).
    pub max_skew: Duration,
    /// Longest `e - t` accepted.
    pub max_lifetime: Duration,
}

impl Default for VerifyLimits {
    fn default() -> Self {
        Self {
            max_skew: Duration::seconds(60),
            max_lifetime: Duration::days(30),
        }
    }
}

impl NToken {
    /// Parses a token strictly: fields in any order, each at most once, `s` last; the known
    /// Athenz fields `v d n h i a t e k z s` only.
    pub fn parse(raw: &str) -> Result<Self, NTokenError> {
        let malformed = |why: String| NTokenError::Malformed(why);
        if raw.len() > MAX_NTOKEN_LEN {
            return Err(malformed(format!("longer than {MAX_NTOKEN_LEN} bytes")));
        }
        let sig_at = raw
            .find(SIGNATURE_MARKER)
            .ok_or_else(|| malformed("no signature field".into()))?;
        let signed = &raw[..sig_at];
        let sig_text = &raw[sig_at + SIGNATURE_MARKER.len()..];
        if sig_text.is_empty() || sig_text.contains(';') {
            return Err(malformed("the signature must be the last field".into()));
        }
        let signature =
            ybase64_decode(sig_text).ok_or_else(|| malformed("signature is not ybase64".into()))?;

        let mut fields: [Option<&str>; 9] = [None; 9];
        const KEYS: [&str; 9] = ["v", "d", "n", "h", "i", "a", "t", "e", "k"];
        let mut key_service = None;
        for item in signed.split(';') {
            let (key, value) = item.split_once('=').ok_or_else(|| {
                malformed(format!("field {} is not key=value", Quoted::new(item)))
            })?;
            let slot = if key == "z" {
                &mut key_service
            } else {
                let idx = KEYS
                    .iter()
                    .position(|k| *k == key)
                    .ok_or_else(|| malformed(format!("unknown field {}", Quoted::new(key))))?;
                &mut fields[idx]
            };
            if slot.replace(value).is_some() {
                return Err(malformed(format!("field {key:?} appears twice")));
            }
        }
        let [v, d, n, h, i, a, t, e, k] = fields;
        fn need<'t>(value: Option<&'t str>, key: &str) -> Result<&'t str, NTokenError> {
            value
                .filter(|v| !v.is_empty())
                .ok_or_else(|| NTokenError::Malformed(format!("field {key:?} is missing")))
        }
        let number = |value: Option<&str>, key: &str| -> Result<i64, NTokenError> {
            need(value, key)?
                .parse::<i64>()
                .map_err(|_| malformed(format!("field {key:?} is not a number")))
        };
        let version = need(v, "v")?;
        if version != "S1" {
            return Err(malformed(format!(
                "version {} is not S1",
                Quoted::new(version)
            )));
        }
        let domain = need(d, "d")?;
        let service = need(n, "n")?;
        names::validate_domain("domain", domain)?;
        names::validate_service("service", service)?;
        let key_version = need(k, "k")?;
        names::validate_simple_name("key version", key_version)?;
        if let Some(host) = h {
            names::validate_dns_name("host", host)?;
        }
        let salt = need(a, "a")?;
        if !salt.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(malformed("salt is not alphanumeric".into()));
        }
        Ok(Self {
            raw: raw.to_owned(),
            version: version.to_owned(),
            domain: domain.to_owned(),
            service: service.to_owned(),
            host: h.map(str::to_owned),
            ip: i.map(str::to_owned),
            salt: salt.to_owned(),
            issued: number(t, "t")?,
            expires: number(e, "e")?,
            key_version: key_version.to_owned(),
            key_service: key_service.map(str::to_owned),
            signature,
        })
    }

    /// The exact bytes the signature covers.
    pub fn signed_text(&self) -> &str {
        let end = self.raw.find(SIGNATURE_MARKER).unwrap_or(self.raw.len());
        &self.raw[..end]
    }

    /// `<domain>.<service>`.
    pub fn principal(&self) -> String {
        names::principal(&self.domain, &self.service)
    }

    /// Checks times against `now` and `limits`, then the signature against `key`.
    pub fn verify(
        &self,
        key: &PublicKey,
        now: OffsetDateTime,
        limits: VerifyLimits,
    ) -> Result<(), NTokenError> {
        self.check_times(now, limits)?;
        if key.verify_sha256(self.signed_text().as_bytes(), &self.signature) {
            Ok(())
        } else {
            Err(NTokenError::BadSignature)
        }
    }

    /// Checks issue and expiry times only.
    pub fn check_times(
        &self,
        now: OffsetDateTime,
        limits: VerifyLimits,
    ) -> Result<(), NTokenError> {
        let now = now.unix_timestamp();
        let lifetime = self.expires.saturating_sub(self.issued);
        let max = limits.max_lifetime.whole_seconds();
        if lifetime <= 0 || lifetime > max {
            return Err(NTokenError::BadLifetime { lifetime, max });
        }
        if self.issued > now.saturating_add(limits.max_skew.whole_seconds()) {
            return Err(NTokenError::IssuedInFuture {
                issued: self.issued,
                now,
            });
        }
        if self.expires <= now {
            return Err(NTokenError::Expired {
                expires: self.expires,
                now,
            });
        }
        Ok(())
    }
}

/// What goes into a new token.
#[derive(Debug, Clone)]
pub struct NTokenBuilder {
    /// Domain.
    pub domain: String,
    /// Service.
    pub service: String,
    /// Host name to record (`h`), if any.
    pub host: Option<String>,
    /// Version of the signing key as registered in Athenz (`k`).
    pub key_version: String,
    /// Service whose key signed it (`z`), when not the principal's own (ZTS signs with `z=zts`).
    pub key_service: Option<String>,
    /// How long the token is valid.
    pub lifetime: Duration,
}

impl NTokenBuilder {
    /// Builds and signs a token issued at `now`.
    pub fn sign(&self, key: &PrivateKey, now: OffsetDateTime) -> Result<Secret, NTokenError> {
        names::validate_domain("domain", &self.domain)?;
        names::validate_service("service", &self.service)?;
        names::validate_simple_name("key version", &self.key_version)?;
        if let Some(host) = &self.host {
            names::validate_dns_name("host", host)?;
        }
        if self.lifetime <= Duration::ZERO {
            return Err(NTokenError::BadLifetime {
                lifetime: self.lifetime.whole_seconds(),
                max: i64::MAX,
            });
        }
        let mut salt = [0u8; 8];
        crate::random::fill(&mut salt).map_err(|_| NTokenError::Signing(CryptoError::Signing))?;
        let issued = now.unix_timestamp();
        let expires = issued + self.lifetime.whole_seconds();
        let host = self
            .host
            .as_deref()
            .map(|h| format!(";h={h}"))
            .unwrap_or_default();
        let key_service = match &self.key_service {
            Some(z) => {
                names::validate_simple_name("key service", z)?;
                format!(";z={z}")
            }
            None => String::new(),
        };
        let unsigned = format!(
            "v=S1;d={};n={}{host};a={};t={issued};e={expires};k={}{key_service}",
            self.domain,
            self.service,
            crate::encoding::hex(&salt),
            self.key_version
        );
        let signature = key.sign_sha256(unsigned.as_bytes())?;
        Ok(Secret::new(format!(
            "{unsigned}{SIGNATURE_MARKER}{}",
            ybase64_encode(&signature)
        )))
    }
}

/// Athenz "ybase64": standard base64 with `+` → `.`, `/` → `_`, `=` → `-`.
pub fn ybase64_encode(bytes: &[u8]) -> String {
    STANDARD
        .encode(bytes)
        .chars()
        .map(|c| match c {
            '+' => '.',
            '/' => '_',
            '=' => '-',
            c => c,
        })
        .collect()
}

/// Decodes ybase64; `None` if it is not.
pub fn ybase64_decode(text: &str) -> Option<Vec<u8>> {
    if text.contains(['+', '/', '=']) {
        return None;
    }
    let standard: String = text
        .chars()
        .map(|c| match c {
            '.' => '+',
            '_' => '/',
            '-' => '=',
            c => c,
        })
        .collect();
    STANDARD.decode(standard).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::KeyAlgorithm;

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn builder() -> NTokenBuilder {
        NTokenBuilder {
            domain: "k8s.admin".into(),
            service: "athenz-callback".into(),
            host: Some("node-1.example".into()),
            key_version: "v1".into(),
            key_service: None,
            lifetime: Duration::hours(1),
        }
    }

    #[test]
    fn key_service_field() {
        let (key, public) = keypair(KeyAlgorithm::P256);
        let b = NTokenBuilder {
            key_service: Some("zts".into()),
            ..builder()
        };
        let token = NToken::parse(b.sign(&key, now()).unwrap().expose()).unwrap();
        assert_eq!(token.key_service.as_deref(), Some("zts"));
        assert!(token.signed_text().ends_with(";k=v1;z=zts"));
        token
            .verify(&public, now(), VerifyLimits::default())
            .unwrap();
        let bad = NTokenBuilder {
            key_service: Some("a;b".into()),
            ..builder()
        };
        assert!(bad.sign(&key, now()).is_err());
    }

    fn keypair(alg: KeyAlgorithm) -> (PrivateKey, PublicKey) {
        let key = PrivateKey::generate(alg).unwrap();
        let public = PublicKey::from_spki_der(&key.public_key_der()).unwrap();
        (key, public)
    }

    #[test]
    fn sign_parse_verify_rsa_and_ec() {
        for alg in [KeyAlgorithm::P256, KeyAlgorithm::Rsa2048] {
            let (key, public) = keypair(alg);
            let token = builder().sign(&key, now()).unwrap();
            let text = token.expose();
            assert!(text.starts_with("v=S1;d=k8s.admin;n=athenz-callback;h=node-1.example;a="));
            let sig = text.split(";s=").nth(1).unwrap();
            assert!(!sig.contains(['+', '/', '=']), "{sig}");
            let parsed = NToken::parse(text).unwrap();
            assert_eq!(parsed.principal(), "k8s.admin.athenz-callback");
            assert_eq!(parsed.expires - parsed.issued, 3600);
            assert_eq!(parsed.key_version, "v1");
            parsed
                .verify(&public, now(), VerifyLimits::default())
                .unwrap();
            let (_, other) = keypair(alg);
            assert!(matches!(
                parsed.verify(&other, now(), VerifyLimits::default()),
                Err(NTokenError::BadSignature)
            ));
        }
    }

    #[test]
    fn field_order_does_not_matter_and_exact_bytes_are_verified() {
        let (key, public) = keypair(KeyAlgorithm::P256);
        // hand-made token with reordered fields and an ip, signed over its own text
        let unsigned = "k=v1;e=1800003600;t=1800000000;a=00ff;n=web;d=media.sports;v=S1;i=10.0.0.1";
        let sig = ybase64_encode(&key.sign_sha256(unsigned.as_bytes()).unwrap());
        let token = NToken::parse(&format!("{unsigned};s={sig}")).unwrap();
        assert_eq!(token.signed_text(), unsigned);
        assert_eq!(token.ip.as_deref(), Some("10.0.0.1"));
        token
            .verify(&public, now(), VerifyLimits::default())
            .unwrap();
    }

    #[test]
    fn tampering_is_detected() {
        let (key, public) = keypair(KeyAlgorithm::P256);
        let token = builder().sign(&key, now()).unwrap();
        let text = token.expose();
        let tampered = [
            text.replace("n=athenz-callback", "n=athenz-callbacc"),
            text.replace("d=k8s.admin", "d=k8s.admim"),
            // reordering the signed fields changes the signed bytes
            text.replacen(
                "d=k8s.admin;n=athenz-callback",
                "n=athenz-callback;d=k8s.admin",
                1,
            ),
        ];
        for t in tampered {
            let parsed = NToken::parse(&t).unwrap();
            assert!(
                matches!(
                    parsed.verify(&public, now(), VerifyLimits::default()),
                    Err(NTokenError::BadSignature)
                ),
                "{t}"
            );
        }
        // extending the expiry by a second is a bad signature too (times stay in range)
        let expires = NToken::parse(text).unwrap().expires;
        let extended = text.replace(&format!(";e={expires}"), &format!(";e={}", expires + 1));
        let parsed = NToken::parse(&extended).unwrap();
        assert!(matches!(
            parsed.verify(&public, now(), VerifyLimits::default()),
            Err(NTokenError::BadSignature)
        ));
    }

    #[test]
    fn time_checks() {
        let (key, public) = keypair(KeyAlgorithm::P256);
        let limits = VerifyLimits::default();
        let token = NToken::parse(builder().sign(&key, now()).unwrap().expose()).unwrap();
        // expired
        let later = now() + Duration::hours(2);
        assert!(matches!(
            token.verify(&public, later, limits),
            Err(NTokenError::Expired { .. })
        ));
        // issued in the future beyond the skew, and within it
        let earlier = now() - Duration::minutes(5);
        assert!(matches!(
            token.verify(&public, earlier, limits),
            Err(NTokenError::IssuedInFuture { .. })
        ));
        token
            .verify(&public, now() - Duration::seconds(30), limits)
            .unwrap();
        // over-long lifetime
        let long = NTokenBuilder {
            lifetime: Duration::days(60),
            ..builder()
        };
        let token = NToken::parse(long.sign(&key, now()).unwrap().expose()).unwrap();
        assert!(matches!(
            token.verify(&public, now(), limits),
            Err(NTokenError::BadLifetime { .. })
        ));
        // zero or negative lifetime
        let unsigned = "v=S1;d=a;n=b;a=1;t=1800000000;e=1800000000;k=0";
        let sig = ybase64_encode(&key.sign_sha256(unsigned.as_bytes()).unwrap());
        let token = NToken::parse(&format!("{unsigned};s={sig}")).unwrap();
        assert!(matches!(
            token.verify(&public, now(), limits),
            Err(NTokenError::BadLifetime { .. })
        ));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let cases = [
            "",
            "garbage",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0;s=",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0;s=abc;x=1",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0;s=a+b/",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0;q=1;s=AAAA",
            "v=S1;d=a;d=a;n=b;a=1;t=1;e=2;k=0;s=AAAA",
            "v=S2;d=a;n=b;a=1;t=1;e=2;k=0;s=AAAA",
            "v=S1;n=b;a=1;t=1;e=2;k=0;s=AAAA",
            "v=S1;d=a;n=b;a=1;t=x;e=2;k=0;s=AAAA",
            "v=S1;d=a;n=b;a=1;t=1;e=2;s=AAAA",
            "v=S1;d=a/..;n=b;a=1;t=1;e=2;k=0;s=AAAA",
            "v=S1;d=a;n=b.c;a=1;t=1;e=2;k=0;s=AAAA",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0;h=bad host;s=AAAA",
            "v=S1;d=a;n=b;a=1;t=1;e=2;k=0;noequals;s=AAAA",
            "v=S1;d=a;n=b;a=1%;t=1;e=2;k=0;s=AAAA",
        ];
        for bad in cases {
            assert!(NToken::parse(bad).is_err(), "accepted {bad:?}");
        }
        let long = format!("v=S1;d=a;n=b;a=1;t=1;e=2;k=0;h={};s=AAAA", "a".repeat(5000));
        assert!(
            NToken::parse(&long)
                .unwrap_err()
                .to_string()
                .contains("4096")
        );
        assert!(
            NToken::parse("v=S1;d=a;n=b;a=1;t=1;e=2;k=0;s=AAAA")
                .unwrap()
                .principal()
                == "a.b"
        );
    }

    #[test]
    fn debug_hides_the_signature() {
        let (key, _) = keypair(KeyAlgorithm::P256);
        let secret = builder().sign(&key, now()).unwrap();
        let token = NToken::parse(secret.expose()).unwrap();
        let shown = format!("{token:?} {secret:?}");
        let sig = secret.expose().split(";s=").nth(1).unwrap();
        assert!(!shown.contains(sig), "{shown}");
    }

    #[test]
    fn ybase64_alphabet() {
        let bytes = [0xfb, 0xff, 0xfe];
        assert_eq!(STANDARD.encode(bytes), "+//+");
        assert_eq!(ybase64_encode(&bytes), ".__.");
        assert_eq!(ybase64_encode(b"a"), "YQ--");
        assert_eq!(ybase64_decode("YQ--").unwrap(), b"a");
        assert_eq!(ybase64_decode(".__.").unwrap(), bytes);
        assert!(ybase64_decode("YQ==").is_none());
        assert!(ybase64_decode("!!").is_none());
    }
}
