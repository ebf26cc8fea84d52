//! Athenz role tokens (`v=Z1;d=<domain>;r=<role,…>;p=<principal>;a=<salt>;t=<issued>;e=<expires>;
//! k=<key id>;s=<signature>`, docs/design.md §4.11): what ZTS's `GET /domain/{d}/token` returns
//! and a service checks in its `Athenz-Role-Auth` header. Like the ntoken, the signature (SHA-256
//! with ZTS's key, ybase64) covers the exact text before `;s=`, so a parsed token keeps the bytes
//! it was given and verification uses them, never a re-serialisation.

use crate::crypto::{PrivateKey, PublicKey};
use crate::names::{self, NameError, Quoted};
use crate::ntoken::{VerifyLimits, ybase64_decode, ybase64_encode};
use std::fmt;
use thiserror::Error;
use time::{Duration, OffsetDateTime};

/// Longest role token accepted (many roles make long tokens; ZTS caps them well below this).
pub const MAX_ROLE_TOKEN_LEN: usize = 16 * 1024;

const SIGNATURE_MARKER: &str = ";s=";

/// Why a role token was refused.
#[derive(Debug, Error)]
pub enum RoleTokenError {
    /// Not of the `k=v;…;s=sig` form, or a field is missing, repeated or unknown.
    #[error("role token is malformed: {0}")]
    Malformed(String),
    /// A name field broke its rule.
    #[error("role token {0}")]
    Name(#[from] NameError),
    /// The signature does not verify with the key.
    #[error("role token signature does not verify")]
    BadSignature,
    /// Expired, issued in the future, or living longer than allowed.
    #[error("role token {0}")]
    Times(String),
    /// Signing failed.
    #[error("signing the role token failed: {0}")]
    Signing(String),
}

/// A parsed role token, holding the text it was parsed from.
#[derive(Clone)]
pub struct RoleToken {
    raw: String,
    /// The domain of the roles.
    pub domain: String,
    /// The roles granted.
    pub roles: Vec<String>,
    /// The principal they are granted to.
    pub principal: String,
    /// Issued at, Unix seconds.
    pub issued: i64,
    /// Expires at, Unix seconds.
    pub expires: i64,
    /// The id of ZTS's signing key.
    pub key_id: String,
    signature: Vec<u8>,
}

impl fmt::Debug for RoleToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // a role token is a bearer credential: never its text or signature
        f.debug_struct("RoleToken")
            .field("domain", &self.domain)
            .field("roles", &self.roles)
            .field("principal", &self.principal)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// The fields a role token may carry (Athenz's: host, IP, complete-set flag and proxy principal
/// are optional), each at most once.
const FIELDS: [&str; 12] = [
    "v", "d", "r", "c", "p", "h", "a", "t", "e", "k", "i", "proxy",
];

fn valid_role(role: &str) -> bool {
    names::validate_role("role", role).is_ok()
}

impl RoleToken {
    /// Parses a token strictly (see [`FIELDS`]; `s` last).
    pub fn parse(raw: &str) -> Result<Self, RoleTokenError> {
        let malformed = |why: String| RoleTokenError::Malformed(why);
        if raw.len() > MAX_ROLE_TOKEN_LEN {
            return Err(malformed(format!("longer than {MAX_ROLE_TOKEN_LEN} bytes")));
        }
        let sig_at = raw
            .find(SIGNATURE_MARKER)
            .ok_or_else(|| malformed("no signature field".into()))?;
        let sig_text = &raw[sig_at + SIGNATURE_MARKER.len()..];
        if sig_text.is_empty() || sig_text.contains(';') {
            return Err(malformed("the signature must be the last field".into()));
        }
        let signature =
            ybase64_decode(sig_text).ok_or_else(|| malformed("signature is not ybase64".into()))?;
        let mut fields: [Option<&str>; FIELDS.len()] = [None; FIELDS.len()];
        for item in raw[..sig_at].split(';') {
            let (key, value) = item.split_once('=').ok_or_else(|| {
                malformed(format!("field {} is not key=value", Quoted::new(item)))
            })?;
            let idx = FIELDS
                .iter()
                .position(|k| *k == key)
                .ok_or_else(|| malformed(format!("unknown field {}", Quoted::new(key))))?;
            if fields[idx].replace(value).is_some() {
                return Err(malformed(format!("field {key:?} appears twice")));
            }
        }
        let need = |idx: usize| {
            fields[idx]
                .filter(|v| !v.is_empty())
                .ok_or_else(|| malformed(format!("field {:?} is missing", FIELDS[idx])))
        };
        let number = |idx: usize| {
            need(idx)?
                .parse::<i64>()
                .map_err(|_| malformed(format!("field {:?} is not a number", FIELDS[idx])))
        };
        let version = need(0)?;
        if version != "Z1" {
            return Err(malformed(format!(
                "version {} is not Z1",
                Quoted::new(version)
            )));
        }
        let domain = need(1)?;
        names::validate_domain("domain", domain)?;
        let roles: Vec<String> = need(2)?.split(',').map(str::to_owned).collect();
        if let Some(bad) = roles.iter().find(|r| !valid_role(r)) {
            return Err(malformed(format!(
                "role {} is not a role name",
                Quoted::new(bad)
            )));
        }
        let principal = need(4)?;
        let (p_domain, p_service) = principal
            .rsplit_once('.')
            .ok_or_else(|| malformed("the principal is not domain.service".into()))?;
        names::validate_domain("principal domain", p_domain)?;
        names::validate_service("principal service", p_service)?;
        let salt = need(6)?;
        if !salt.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(malformed("salt is not alphanumeric".into()));
        }
        let key_id = need(9)?;
        names::validate_simple_name("key id", key_id)?;
        Ok(Self {
            raw: raw.to_owned(),
            domain: domain.to_owned(),
            roles,
            principal: principal.to_owned(),
            issued: number(7)?,
            expires: number(8)?,
            key_id: key_id.to_owned(),
            signature,
        })
    }

    /// The token as received.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Checks the times against `now` and `limits`, then the signature against ZTS's `key`.
    pub fn verify(
        &self,
        key: &PublicKey,
        now: OffsetDateTime,
        limits: VerifyLimits,
    ) -> Result<(), RoleTokenError> {
        let now = now.unix_timestamp();
        let lifetime = self.expires.saturating_sub(self.issued);
        if lifetime <= 0 || lifetime > limits.max_lifetime.whole_seconds() {
            return Err(RoleTokenError::Times(format!(
                "lifetime of {lifetime} s is outside 1..={} s",
                limits.max_lifetime.whole_seconds()
            )));
        }
        if self.issued > now.saturating_add(limits.max_skew.whole_seconds()) {
            return Err(RoleTokenError::Times(format!(
                "is issued in the future ({}, now {now})",
                self.issued
            )));
        }
        if self.expires <= now {
            return Err(RoleTokenError::Times(format!(
                "expired at {} (now {now})",
                self.expires
            )));
        }
        let signed = &self.raw[..self.raw.find(SIGNATURE_MARKER).unwrap_or(self.raw.len())];
        if key.verify_sha256(signed.as_bytes(), &self.signature) {
            Ok(())
        } else {
            Err(RoleTokenError::BadSignature)
        }
    }
}

/// Makes and signs a role token (what ZTS does; the dev ZTS uses it).
pub fn sign(
    key: &PrivateKey,
    key_id: &str,
    domain: &str,
    roles: &[String],
    principal: &str,
    now: OffsetDateTime,
    lifetime: Duration,
) -> Result<String, RoleTokenError> {
    names::validate_domain("domain", domain)?;
    names::validate_simple_name("key id", key_id)?;
    if roles.is_empty() || roles.iter().any(|r| !valid_role(r)) {
        return Err(RoleTokenError::Malformed(
            "no roles, or a bad role name".into(),
        ));
    }
    if lifetime <= Duration::ZERO {
        return Err(RoleTokenError::Times("lifetime must be positive".into()));
    }
    let mut salt = [0u8; 8];
    crate::random::fill(&mut salt).map_err(|e| RoleTokenError::Signing(e.to_string()))?;
    let issued = now.unix_timestamp();
    let unsigned = format!(
        "v=Z1;d={domain};r={};p={principal};a={};t={issued};e={};k={key_id}",
        roles.join(","),
        crate::encoding::hex(&salt),
        issued + lifetime.whole_seconds()
    );
    let signature = key
        .sign_sha256(unsigned.as_bytes())
        .map_err(|e| RoleTokenError::Signing(e.to_string()))?;
    Ok(format!(
        "{unsigned}{SIGNATURE_MARKER}{}",
        ybase64_encode(&signature)
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::crypto::KeyAlgorithm;

    fn key() -> PrivateKey {
        PrivateKey::generate(KeyAlgorithm::P256).unwrap()
    }

    fn public(k: &PrivateKey) -> PublicKey {
        PublicKey::from_spki_der(&k.public_key_der()).unwrap()
    }

    #[test]
    fn signed_tokens_parse_and_verify_over_the_received_text() {
        let k = key();
        let now = OffsetDateTime::now_utc();
        let roles = vec!["readers".to_owned(), "writers".to_owned()];
        let text = sign(
            &k,
            "0",
            "media.sports",
            &roles,
            "media.sports.web",
            now,
            Duration::hours(1),
        )
        .unwrap();
        assert!(text.starts_with("v=Z1;d=media.sports;r=readers,writers;p=media.sports.web;a="));
        let token = RoleToken::parse(&text).unwrap();
        assert_eq!(token.roles, roles);
        assert_eq!(token.principal, "media.sports.web");
        assert_eq!(token.expires - token.issued, 3600);
        token
            .verify(&public(&k), now, VerifyLimits::default())
            .unwrap();
        assert!(
            !format!("{token:?}").contains(";s="),
            "the Debug form shows the token"
        );
        // another key, a changed field, expired, too long-lived
        assert!(matches!(
            token.verify(&public(&key()), now, VerifyLimits::default()),
            Err(RoleTokenError::BadSignature)
        ));
        let tampered = RoleToken::parse(&text.replace("r=readers,writers", "r=admin")).unwrap();
        assert!(matches!(
            tampered.verify(&public(&k), now, VerifyLimits::default()),
            Err(RoleTokenError::BadSignature)
        ));
        let late = now + Duration::hours(2);
        assert!(
            token
                .verify(&public(&k), late, VerifyLimits::default())
                .unwrap_err()
                .to_string()
                .contains("expired")
        );
        let strict = VerifyLimits {
            max_lifetime: Duration::minutes(5),
            ..VerifyLimits::default()
        };
        assert!(token.verify(&public(&k), now, strict).is_err());
    }

    #[test]
    fn hostile_and_malformed_tokens_are_refused_naming_the_problem() {
        let good = sign(
            &key(),
            "0",
            "media.sports",
            &["readers".to_owned()],
            "media.sports.web",
            OffsetDateTime::now_utc(),
            Duration::hours(1),
        )
        .unwrap();
        for (bad, why) in [
            (good.replace("v=Z1", "v=S1"), "not Z1"),
            (good.replace(";s=", ";x=1;s="), "unknown field"),
            (good.replace(";k=0", ";k=0;k=1"), "appears twice"),
            (good.replace("r=readers", "r=read ers"), "not a role name"),
            (good.replace("r=readers", "r=readers,"), "not a role name"),
            (
                good.replace("p=media.sports.web", "p=web"),
                "domain.service",
            ),
            (good.replace(";t=", ";t=x"), "not a number"),
            (good.split(";s=").next().unwrap().to_owned(), "no signature"),
            (format!("{good};"), "last field"),
            (good.replace(";s=", ";s=!!"), "ybase64"),
            ("x".repeat(MAX_ROLE_TOKEN_LEN + 1), "longer than"),
            ("v=Z1;nonsense;s=AA--".to_owned(), "key=value"),
        ] {
            let err = RoleToken::parse(&bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:.80}: {err}");
        }
    }
}
