//! `cargo bench -p athenz-initializer`: admission reviews of a typical pod, on one core — the
//! decision alone (parse, inject, diff, encode), and over HTTPS with keep-alive (the webhook on one
//! runtime worker, the load generator on the other core).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use athenz_core::daemon::Shutdown;
use athenz_initializer::template::Template;
use athenz_testbed::pki::{CertAuthority, LeafSpec};
use clap::Parser;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

const TEMPLATE: &str = "image: registry.example/athenz-k8s-identity:1.0\nnativeSidecar: true\n";

fn typical_review(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{i}"), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "media-sports", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": {"kind": "Pod", "apiVersion": "v1",
                "metadata": {"generateName": "web-7d9f-", "namespace": "media-sports", "labels": {"app": "web"}},
                "spec": {
                    "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                    "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}],
                        "volumeMounts": [{"name": "kube-api-access", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]},
                        {"name": "sidecar", "image": "envoy:1"}],
                    "serviceAccountName": "web", "restartPolicy": "Always"},
                "status": {}},
            "dryRun": false}
    }))
    .unwrap()
}

fn main() {
    athenz_core::install_crypto_provider();
    let template = Template::from_yaml(TEMPLATE).unwrap();
    let skip: BTreeSet<String> = ["kube-system".to_owned()].into();
    let body = typical_review(0);
    let n = 20_000;
    for _ in 0..1000 {
        athenz_initializer::review::review(&template, &skip, &body).unwrap();
    }
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(athenz_initializer::review::review(&template, &skip, &body).unwrap());
    }
    let each = started.elapsed() / n;
    println!("athenz-initializer: a typical pod (2 containers, 1 projected volume)");
    println!(
        "  decision alone  {:.0} reviews/s on one core ({:.1} µs each)",
        1.0 / each.as_secs_f64(),
        each.as_secs_f64() * 1e6
    );

    // over HTTPS with keep-alive
    let dir = tempfile::tempdir().unwrap();
    let template_path = dir.path().join("t.yaml");
    std::fs::write(&template_path, TEMPLATE).unwrap();
    let ca = CertAuthority::new_root("Bench").unwrap();
    let files = ca
        .write_service_cert(
            dir.path(),
            "wh",
            &LeafSpec {
                ip_addresses: vec![[127, 0, 0, 1].into()],
                ..LeafSpec::service("wh", &[])
            },
        )
        .unwrap();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let shutdown = Shutdown::new();
    let port = server_rt.block_on(async {
        let config = athenz_initializer::Config::try_parse_from([
            "athenz-initializer",
            "--listen=127.0.0.1:0",
            "--ops-listen=127.0.0.1:0",
            &format!("--tls-cert={}", files.cert.display()),
            &format!("--tls-key={}", files.key.display()),
            &format!("--template={}", template_path.display()),
        ])
        .unwrap();
        athenz_initializer::start(config, shutdown.clone())
            .await
            .unwrap()
            .0
            .api
            .port()
    });
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let bodies = Arc::new((0..n as usize).map(typical_review).collect::<Vec<_>>());
    let (elapsed, mut lat) = client_rt.block_on(async {
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(ca.root_pem().as_bytes()).unwrap()])
            .build()
            .unwrap();
        let url = format!("https://127.0.0.1:{port}/mutate");
        for b in bodies.iter().take(16) {
            assert_eq!(
                client
                    .post(&url)
                    .body(b.clone())
                    .send()
                    .await
                    .unwrap()
                    .status(),
                200
            );
        }
        let count = bodies.len();
        athenz_testbed::load::post_each(&client, &url, bodies, count, 16)
            .await
            .unwrap()
    });
    lat.sort();
    let at = |p: f64| athenz_testbed::stats::percentile(&lat, p);
    println!(
        "  over HTTPS      {:.0} reviews/s on one core, p50 {:.2} ms, p99 {:.2} ms ({} at concurrency 16)",
        lat.len() as f64 / elapsed.as_secs_f64(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        lat.len()
    );
    shutdown.trigger();
    drop(server_rt);
}
