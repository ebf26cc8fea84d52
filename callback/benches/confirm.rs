//! `cargo bench -p athenz-callback`: confirmations per second and latency over mutual TLS with
//! keep-alive, the callback and the Kubernetes API stand-in sharing one core (one runtime worker),
//! the load generator on the other.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use athenz_core::crypto::{KeyAlgorithm, PrivateKey, pem_certificates};
use athenz_core::daemon::Shutdown;
use athenz_core::identity_jwt::IdentityClaims;
use athenz_core::secret::Secret;
use athenz_core::tls::{self, ClientIdentity};
use athenz_core::zts::InstanceConfirmation;
use athenz_jwt_service::signer::JwtSigner;
use athenz_testbed::fixtures::{self, DOMAIN, NAMESPACE, POD_NAME, POD_UID, PROVIDER, SERVICE};
use athenz_testbed::kube_api::{KubeApi, running_pod};
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use clap::Parser;
use std::collections::BTreeMap;
use std::sync::Arc;

const N: usize = 20_000;
const CONCURRENCY: usize = 16;

fn main() {
    athenz_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new_root("Bench Root").unwrap();
    let signer = JwtSigner::from_pem(
        PrivateKey::generate(KeyAlgorithm::P256)
            .unwrap()
            .to_pkcs8_pem()
            .unwrap()
            .expose()
            .as_bytes(),
    )
    .unwrap();
    let keys = dir.path().join("public");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("v1.pem"), signer.public_key_pem().unwrap()).unwrap();
    let files = ca
        .write_service_cert(
            dir.path(),
            "callback",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service(PROVIDER, &[])
            },
        )
        .unwrap();

    // server side: one worker thread = one core for the callback and the API stand-in
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let shutdown = Shutdown::new();
    let (port, kube) = server_rt.block_on(async {
        let kube = KubeApi::start().await.unwrap();
        kube.cluster().put_pod(running_pod(
            NAMESPACE,
            POD_NAME,
            POD_UID,
            SERVICE,
            &fixtures::POD_IP.to_string(),
            "n1",
        ));
        let config = athenz_callback::Config::try_parse_from([
            "athenz-callback",
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
            &format!("--tls-cert={}", files.cert.display()),
            &format!("--tls-key={}", files.key.display()),
            &format!("--client-ca={}", files.ca.display()),
            "--allowed-principals=sys.auth.zts",
            &format!("--provider={PROVIDER}"),
            &format!("--public-keys-dir={}", keys.display()),
            &format!("--dns-suffix={}", fixtures::DNS_SUFFIX),
            &format!("--admin-domain={}", fixtures::ADMIN_DOMAIN),
            &format!("--kube-api-url={}", kube.url()),
            // the API stand-in serves no watch: every confirmation reads its pod
            "--pod-cache=false",
            "--replay-cache-size=1000000",
        ])
        .unwrap();
        let (bound, _) = athenz_callback::start(config, shutdown.clone())
            .await
            .unwrap();
        (bound.api.port(), kube)
    });

    // the confirmations, signed before the clock starts
    let identity = fixtures::pod_identity_without_service_ip();
    let bodies: Vec<String> = (0..N + CONCURRENCY)
        .map(|_| {
            let t = time::OffsetDateTime::now_utc().unix_timestamp();
            let claims = IdentityClaims {
                iss: "athenz-k8s-identity/jwt-service".into(),
                aud: "k8s-athenz-identity".into(),
                sub: format!(
                    "pod:{NAMESPACE}/{POD_NAME}?d={DOMAIN}&n={SERVICE}&i={}&u={POD_UID}",
                    fixtures::POD_IP
                ),
                iat: t,
                nbf: t,
                exp: t + 600,
                jti: athenz_core::random::hex_name::<16>(),
                node: "n1".into(),
            };
            let mut attributes = BTreeMap::new();
            attributes.insert("instanceId".to_owned(), POD_UID.to_owned());
            attributes.insert("sanDNS".to_owned(), identity.dns_names.join(","));
            attributes.insert("sanIP".to_owned(), fixtures::POD_IP.to_string());
            attributes.insert("sanURI".to_owned(), identity.uris.join(","));
            serde_json::to_string(&InstanceConfirmation {
                provider: PROVIDER.into(),
                domain: DOMAIN.into(),
                service: SERVICE.into(),
                attestation_data: Secret::new(signer.sign("v1", &claims).unwrap()),
                attributes,
            })
            .unwrap()
        })
        .collect();
    let bodies = Arc::new(bodies);

    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (elapsed, mut latencies) = client_rt.block_on(async {
        let issued = ca
            .issue(&LeafSpec::service("sys.auth.zts", &[]), KeyAlgorithm::P256)
            .unwrap();
        let roots = pem_certificates(ca.root_pem()).unwrap();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(
                tls::client_config(
                    &roots,
                    Some(ClientIdentity::Fixed(
                        tls::certified_key_from_pem(&issued.chain_pem, issued.key_pem.expose())
                            .unwrap(),
                    )),
                )
                .unwrap(),
            )
            .build()
            .unwrap();
        let url = format!("https://127.0.0.1:{port}/instance");
        // warm up one connection per worker
        for body in bodies.iter().skip(N) {
            let r = client.post(&url).body(body.clone()).send().await.unwrap();
            assert_eq!(r.status(), 200);
        }
        athenz_testbed::load::post_each(&client, &url, bodies, N, CONCURRENCY)
            .await
            .unwrap()
    });
    latencies.sort();
    let at = |p: f64| athenz_testbed::stats::percentile(&latencies, p);
    println!(
        "athenz-callback: confirmations over mTLS keep-alive, callback + API stand-in on one core"
    );
    println!("  confirmations  {N} at concurrency {CONCURRENCY}");
    println!(
        "  throughput     {:.0} confirmations/s",
        N as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  latency        p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
    shutdown.trigger();
    drop(kube);
    drop(server_rt);
}
