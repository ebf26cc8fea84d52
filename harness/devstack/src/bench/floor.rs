//! The cryptography one identity cannot do without, timed on this machine in the same run: the
//! floor the bench's CPU figures are compared with.

use super::{AGENT, CALLBACK, JWT_SERVICE, SIA, ZTS};
use athenz_core::agent_api::KeySource;
use athenz_core::crypto::{KeyAlgorithm, PrivateKey, PublicKey};
use serde::Serialize;
use std::time::Instant;

/// The unavoidable cryptography of one identity, each step's cost on this machine now.
#[derive(Debug, Serialize)]
pub struct CryptoFloor {
    /// Steps, who does them and their microseconds.
    pub steps: Vec<FloorStep>,
    /// Their sum, milliseconds.
    pub total_ms: f64,
}

impl CryptoFloor {
    /// The floor of one part, ms.
    pub fn of(&self, part: &str) -> f64 {
        self.steps
            .iter()
            .filter(|s| s.part == part)
            .map(|s| s.us)
            .sum::<f64>()
            / 1e3
    }
}

/// One unavoidable cryptographic step.
#[derive(Debug, Serialize)]
pub struct FloorStep {
    /// Who must do it: `sia`, `agent`, `jwt-service`, `callback` or `zts`.
    pub part: &'static str,
    /// What it is.
    pub step: &'static str,
    /// Its cost on this machine now, µs.
    pub us: f64,
}

/// The cryptography one identity needs, whoever implements it: the pod's key pair and CSR
/// signature (by whoever `key_source` says makes the key: the pod's SIA, which the agent then
/// checks by verifying the CSR's signature, or the agent), the identity JWT's signature
/// (jwt-service, ES256), its verification and one mutual-TLS handshake with ZTS as the server
/// (callback), the CSR's verification and the certificate's and ntoken's signatures (ZTS,
/// P-256). Connections from the agent to the jwt-service and ZTS are reused, so their handshakes
/// are not per identity.
pub fn crypto_floor(algorithm: KeyAlgorithm, key_source: KeySource) -> anyhow::Result<CryptoFloor> {
    let message = [7u8; 256];
    let p256 = PrivateKey::generate(KeyAlgorithm::P256)?;
    let p256_public = PublicKey::from_spki_der(&p256.public_key_der())?;
    let p256_signature = p256.sign_sha256(&message)?;
    let pod_key = PrivateKey::generate(algorithm)?;
    let pod_public = PublicKey::from_spki_der(&pod_key.public_key_der())?;
    let pod_signature = pod_key.sign_sha256(&message)?;
    let keygen_runs = if algorithm == KeyAlgorithm::P256 {
        500
    } else {
        30
    };
    let check = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(anyhow::anyhow!("a signature did not verify"))
        }
    };
    let sign_p256 = || {
        time_us(500, || {
            p256.sign_sha256(&message)?;
            Ok(())
        })
    };
    let step = |part, step, us| FloorStep { part, step, us };
    let key_maker = match key_source {
        KeySource::Pod => SIA,
        KeySource::Agent => AGENT,
    };
    let verify_csr = || {
        time_us(200, || {
            check(pod_public.verify_sha256(&message, &pod_signature))
        })
    };
    let mut steps = vec![
        step(
            key_maker,
            "pod key generation",
            time_us(keygen_runs, || {
                PrivateKey::generate(algorithm)?;
                Ok(())
            })?,
        ),
        step(
            key_maker,
            "CSR signature (pod key)",
            time_us(200, || {
                pod_key.sign_sha256(&message)?;
                Ok(())
            })?,
        ),
        step(JWT_SERVICE, "JWT signature (ES256)", sign_p256()?),
        step(
            CALLBACK,
            "JWT verification (ES256)",
            time_us(500, || {
                check(p256_public.verify_sha256(&message, &p256_signature))
            })?,
        ),
        step(
            CALLBACK,
            "TLS 1.2 handshake as ZTS resumes it, server side (P-256 session)",
            crate::handshake::server_side_us(rustls::HandshakeKind::Resumed, 100)?,
        ),
        step(ZTS, "CSR verification", verify_csr()?),
        step(ZTS, "certificate signature (CA, P-256)", sign_p256()?),
        step(ZTS, "ntoken signature (P-256)", sign_p256()?),
    ];
    if key_source == KeySource::Pod {
        // the agent checks the pod's CSR before it asks for a JWT (agent/src/csr_check.rs)
        steps.insert(
            2,
            step(AGENT, "CSR verification (the pod's CSR)", verify_csr()?),
        );
    }
    let total_ms = steps.iter().map(|s| s.us).sum::<f64>() / 1e3;
    Ok(CryptoFloor { steps, total_ms })
}

/// Mean microseconds of `op` over `n` runs.
fn time_us(n: u32, mut op: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        op()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(n))
}
