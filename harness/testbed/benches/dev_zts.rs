//! `cargo bench -p athenz-testbed --bench dev_zts`: registrations per second through the dev ZTS
//! with a provider that always confirms, over real mutual TLS, so later benchmarks know what share
//! of their time is the stand-in's. Also prints the in-process cost of the cryptography every
//! registration needs (CSR signature check + certificate signing) for comparison.
//!
//! `DEV_ZTS_BENCH_N` (default 10000) registrations at `DEV_ZTS_BENCH_C` (default 16) concurrency.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use athenz_core::crypto::{CsrInfo, KeyAlgorithm, PrivateKey, build_csr, pem_certificates};
use athenz_core::names::{CsrIdentity, PodIdentityInput};
use athenz_core::ntoken::NTokenBuilder;
use athenz_core::secret::Secret;
use athenz_core::zts::{InstanceRegisterInformation, ZtsClient, ZtsClientConfig};
use athenz_testbed::fixtures::{DNS_SUFFIX, DOMAIN, POD_IP, PROVIDER, SERVICE};
use athenz_testbed::pki::LeafSpec;
use athenz_testbed::provider_stub::{Decision, ProviderStub};
use athenz_testbed::stats::percentile;
use athenz_testbed::zts::registry::ProviderEntry;
use athenz_testbed::zts::{DevZts, DevZtsConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn csr_for(i: usize) -> String {
    let uid = format!("00000000-0000-4000-8000-{i:012x}");
    let identity = CsrIdentity::for_pod(&PodIdentityInput {
        domain: DOMAIN,
        service: SERVICE,
        provider: PROVIDER,
        dns_suffix: DNS_SUFFIX,
        instance_id: &uid,
        pod_ip: Some(POD_IP),
        service_ip: None,
    })
    .unwrap();
    build_csr(
        &identity,
        &PrivateKey::generate(KeyAlgorithm::P256).unwrap(),
    )
    .unwrap()
}

fn main() {
    let n = env_usize("DEV_ZTS_BENCH_N", 10_000);
    let concurrency = env_usize("DEV_ZTS_BENCH_C", 16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let zts = DevZts::start(DevZtsConfig::default()).await.unwrap();
        let provider = ProviderStub::start(
            zts.ca(),
            PROVIDER,
            zts.root_pem(),
            "/callback",
            Decision::Allow {
                cert_expiry_minutes: None,
            },
        )
        .await
        .unwrap();
        zts.add_provider(ProviderEntry {
            name: PROVIDER.into(),
            endpoint: provider.endpoint().into(),
            dns_suffixes: vec![DNS_SUFFIX.into()],
            launch: vec!["*".into()],
        })
        .unwrap();
        let client = ZtsClient::new(ZtsClientConfig {
            url: zts.url().into(),
            ca: athenz_core::tls::ServerCaBundle::fixed(pem_certificates(zts.root_pem()).unwrap()).unwrap(),
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
        })
        .unwrap();

        // The CSRs are made before the clock starts: only ZTS's work is measured.
        let csrs: Arc<Vec<String>> = Arc::new((0..n).map(csr_for).collect());

        // Warm up connections.
        for csr in csrs.iter().take(concurrency) {
            register(&client, csr).await;
        }

        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..concurrency {
            let (client, csrs, next) = (client.clone(), csrs.clone(), next.clone());
            workers.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(csr) = csrs.get(i) else { break };
                    let t = Instant::now();
                    register(&client, csr).await;
                    latencies.push(t.elapsed());
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for w in workers {
            latencies.extend(w.await.unwrap());
        }
        let elapsed = started.elapsed();
        latencies.sort();

        // The unavoidable cryptography of one registration, in-process, same machine, same run:
        // verify the CSR, sign the certificate, sign the ntoken.
        let crypto_runs = 500;
        let token_key = PrivateKey::generate(KeyAlgorithm::P256).unwrap();
        let t = Instant::now();
        for csr in csrs.iter().take(crypto_runs) {
            let info = CsrInfo::from_pem(csr).unwrap();
            zts.ca()
                .issue_for_key(
                    &LeafSpec::from_csr(&info, time::Duration::hours(1)),
                    &info.public_key_der,
                )
                .unwrap();
            NTokenBuilder {
                domain: DOMAIN.into(),
                service: SERVICE.into(),
                host: None,
                key_version: "0".into(),
                key_service: Some("zts".into()),
                lifetime: time::Duration::hours(1),
            }
            .sign(&token_key, time::OffsetDateTime::now_utc())
            .unwrap();
        }
        let crypto = t.elapsed() / crypto_runs as u32;

        let per_sec = n as f64 / elapsed.as_secs_f64();
        println!("dev ZTS registrations (provider always confirms, mTLS both hops, P-256 CSRs)");
        println!("  registrations      {n} at concurrency {concurrency}");
        println!("  wall time          {:.2} s", elapsed.as_secs_f64());
        println!("  throughput         {per_sec:.0} registrations/s");
        println!(
            "  latency            p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.9)),
            ms(percentile(&latencies, 0.99))
        );
        println!(
            "  crypto per registration (verify CSR + sign certificate + sign ntoken, one core): {:.3} ms = {:.0}% of the per-registration CPU budget at this throughput on 2 cores",
            ms(crypto),
            100.0 * crypto.as_secs_f64() * per_sec / 2.0
        );
        println!("  provider calls     {}", provider.recorded().len());
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn register(client: &ZtsClient, csr: &str) {
    client
        .register(&InstanceRegisterInformation {
            provider: PROVIDER.into(),
            domain: DOMAIN.into(),
            service: SERVICE.into(),
            attestation_data: Secret::new("jwt"),
            csr: csr.to_owned(),
            token: Some(true),
            ..Default::default()
        })
        .await
        .unwrap();
}
