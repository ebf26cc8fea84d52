//! JWT signing with a parsed key kept in memory: ES256 (P-256, raw `r‖s` signature as JWS wants)
//! or RS256 (RSA PKCS#1 v1.5). jsonwebtoken re-parses an RSA key on every call (~560 µs,
//! docs/benchmarks.md); keeping aws-lc-rs's parsed key makes RS256 signing ~4× faster and ES256 as
//! fast as it gets.

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, RSA_PKCS1_SHA256, RsaKeyPair,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;

/// A JWT signing key.
pub enum JwtSigner {
    /// ES256.
    Es256(EcdsaKeyPair),
    /// RS256.
    Rs256(RsaKeyPair),
}

impl std::fmt::Debug for JwtSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Es256(_) => "JwtSigner(ES256)",
            Self::Rs256(_) => "JwtSigner(RS256)",
        })
    }
}

#[derive(Serialize)]
struct Header<'a> {
    alg: &'a str,
    typ: &'a str,
    kid: &'a str,
}

impl JwtSigner {
    /// Parses a PEM private key: EC P-256 (PKCS#8 or SEC1) or RSA (PKCS#8 or PKCS#1, ≥ 2048 bits).
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let der = PrivateKeyDer::from_pem_slice(pem)
            .map_err(|e| format!("no private key PEM block ({e})"))?;
        let bytes = der.secret_der();
        if let Ok(k) = EcdsaKeyPair::from_private_key_der(&ECDSA_P256_SHA256_FIXED_SIGNING, bytes) {
            return Ok(Self::Es256(k));
        }
        let rsa = match der {
            PrivateKeyDer::Pkcs1(_) => RsaKeyPair::from_der(bytes),
            _ => RsaKeyPair::from_pkcs8(bytes),
        };
        match rsa {
            Ok(k) if k.public_modulus_len() >= 256 => Ok(Self::Rs256(k)),
            Ok(_) => Err("RSA keys must be at least 2048 bits".into()),
            Err(_) => Err("not an EC P-256 or RSA private key".into()),
        }
    }

    /// `ES256` or `RS256`.
    pub fn alg(&self) -> &'static str {
        match self {
            Self::Es256(_) => "ES256",
            Self::Rs256(_) => "RS256",
        }
    }

    /// The public key as SubjectPublicKeyInfo PEM (what the callback is given).
    pub fn public_key_pem(&self) -> Result<String, String> {
        use aws_lc_rs::signature::KeyPair;
        let der = match self {
            Self::Es256(k) => k.public_key().as_der().map(|d| d.as_ref().to_vec()),
            Self::Rs256(k) => k.public_key().as_der().map(|d| d.as_ref().to_vec()),
        }
        .map_err(|_| "cannot encode the public key".to_string())?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(chunk));
            pem.push('\n');
        }
        pem.push_str("-----END PUBLIC KEY-----\n");
        Ok(pem)
    }

    /// Signs `claims` into a compact JWS with header `{alg, typ: JWT, kid}`.
    pub fn sign<C: Serialize>(&self, kid: &str, claims: &C) -> Result<String, String> {
        let header = serde_json::to_vec(&Header {
            alg: self.alg(),
            typ: "JWT",
            kid,
        })
        .map_err(|e| e.to_string())?;
        let payload = serde_json::to_vec(claims).map_err(|e| e.to_string())?;
        let mut token = URL_SAFE_NO_PAD.encode(header);
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(payload));
        let rng = SystemRandom::new();
        let signature = match self {
            Self::Es256(k) => k
                .sign(&rng, token.as_bytes())
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| "ES256 signing failed".to_string())?,
            Self::Rs256(k) => {
                let mut sig = vec![0u8; k.public_modulus_len()];
                k.sign(&RSA_PKCS1_SHA256, &rng, token.as_bytes(), &mut sig)
                    .map_err(|_| "RS256 signing failed".to_string())?;
                sig
            }
        };
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature));
        Ok(token)
    }
}
