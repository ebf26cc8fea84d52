//! `cargo bench -p athenz-jwt-service`: identity JWTs signed per second on one core — the whole
//! `issue` path (claims, JSON, base64url, signature), ES256 and RS256.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey};
use athenz_core::identity_jwt::JwtRequest;
use athenz_core::subject::PodSubject;
use athenz_jwt_service::keys::KeyDir;
use athenz_jwt_service::service::{JwtHandler, JwtMetrics};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let request = JwtRequest {
        subject: PodSubject::parse_uri(
            "pod:media-sports/web-7d9f?d=media.sports&n=web&i=10.1.2.3&u=0b6e4c1e-8f57-4d5e-9a51-1f0f3c1a2b3c",
        )
        .unwrap(),
    };
    println!("athenz-jwt-service: JWTs signed on one core (claims + JSON + base64url + signature)");
    for (alg, name, n) in [
        (KeyAlgorithm::P256, "ES256", 50_000),
        (KeyAlgorithm::Rsa2048, "RS256", 5_000),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let pem = PrivateKey::generate(alg).unwrap().to_pkcs8_pem().unwrap();
        std::fs::write(dir.path().join("v1.pem"), pem.expose()).unwrap();
        let handler = JwtHandler {
            keys: Arc::new(KeyDir::load(dir.path()).unwrap()),
            allowed: athenz_core::tls::PrincipalAllowList::default(),
            provider: "k8s.admin.athenz-callback".into(),
            issuer: "athenz-k8s-identity/jwt-service".into(),
            audience: "k8s-athenz-identity".into(),
            lifetime: Duration::from_secs(300),
            metrics: JwtMetrics::default(),
        };
        for _ in 0..n / 10 {
            handler.issue(&request, "node-1").unwrap();
        }
        let started = Instant::now();
        for _ in 0..n {
            std::hint::black_box(handler.issue(&request, "node-1").unwrap());
        }
        let elapsed = started.elapsed();
        println!(
            "  {name}: {:>8.0} JWTs/s ({:.1} µs each, {n} signed)",
            n as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64() * 1e6 / n as f64
        );
    }
}
