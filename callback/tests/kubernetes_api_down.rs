//! The callback when the Kubernetes API cannot answer: every "cannot tell now" is 504 with its
//! cause (never a verdict), and readiness follows the API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use athenz_callback::Config;
use athenz_testbed::fixtures::{self, PROVIDER};
use athenz_testbed::pki::LeafSpec;
use clap::Parser;
use std::time::Duration;

mod common;

use common::*;

/// Confirms a fresh launch, expecting 504 "cannot tell now" from the Kubernetes API; its message.
async fn undecided(f: &Fixture) -> String {
    let (status, body) = f.confirm(&confirmation(es256(f, &claims()))).await;
    assert_eq!(status, 504, "{body}");
    let message = body["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("cannot tell now (kubernetes_api): Kubernetes API"),
        "{message}"
    );
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_kubernetes_api_is_504_not_a_verdict() {
    let f = start().await;
    // Real ZTS passes only a provider's 504 on as retryable (ZTSImpl.validateConfirmationData):
    // every "cannot tell now" is 504 with its cause, never 403 and never another 5xx.
    f.kube.set_unreachable(true).await;
    undecided(&f).await;
    f.kube.set_unreachable(false).await;
    for failing in [429, 500, 503] {
        f.kube
            .set_failing_status(Some(http::StatusCode::from_u16(failing).unwrap()));
        let message = undecided(&f).await;
        assert!(message.contains(&failing.to_string()), "{message}");
    }
    f.kube.set_failing_status(None);
    // and once it answers again, the same pod is confirmed
    assert_eq!(f.confirm(&confirmation(es256(&f, &claims()))).await.0, 200);
    let metrics = f.metrics_text().await;
    assert!(
        metrics.contains(
            r#"athenz_callback_decisions_total{route="instance",outcome="undecided",check="kubernetes_api"} 4"#
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_kubernetes_api() {
    athenz_core::install_crypto_provider();
    let mut f = start().await;
    // find the ops address from the metrics of a fresh start is not exposed; start one more
    // callback on a known ops port instead
    let ops_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let files = f
        .zts
        .ca()
        .write_service_cert(
            f._dir.path(),
            "callback2",
            &LeafSpec::service(PROVIDER, &["localhost"]),
        )
        .unwrap();
    let config = Config::try_parse_from([
        "athenz-callback",
        "--listen=127.0.0.1:0",
        &format!("--ops-listen=127.0.0.1:{ops_port}"),
        &format!("--tls-cert={}", files.cert.display()),
        &format!("--tls-key={}", files.key.display()),
        &format!("--client-ca={}", f.zts.ca_path().display()),
        "--allowed-principals=sys.auth.zts",
        &format!("--provider={PROVIDER}"),
        &format!(
            "--public-keys-dir={}",
            f._dir.path().join("public").display()
        ),
        &format!("--dns-suffix={}", fixtures::DNS_SUFFIX),
        &format!("--admin-domain={}", fixtures::ADMIN_DOMAIN),
        &format!("--kube-api-url={}", f.kube.url()),
        // the API stand-in serves no watch
        "--pod-cache=false",
    ])
    .unwrap();
    let (bound, _) = athenz_callback::start(config, f.shutdown.clone())
        .await
        .unwrap();
    let readyz = format!("http://{}/readyz", bound.ops);
    let plain = reqwest::Client::new();
    let wait_for = |want: u16| {
        let (plain, readyz) = (plain.clone(), readyz.clone());
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                if plain.get(&readyz).send().await.unwrap().status().as_u16() == want {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "readyz never became {want}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    wait_for(200).await;
    f.kube.stop();
    wait_for(503).await;
    let metrics = plain
        .get(format!("http://{}/metrics", bound.ops))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("athenz_callback_kube_api_duration_seconds"),
        "{metrics}"
    );
}
