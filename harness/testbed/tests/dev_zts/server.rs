//! The server itself: its status and unknown routes, body limits, the standalone process and
//! its configuration files.

use super::*;

/// A plain HTTPS client (no client certificate) trusting only `ca_pem`.
fn https_client(ca_pem: &[u8]) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca_pem).unwrap();
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .build()
        .unwrap()
}

#[tokio::test]
async fn status_and_unknown_routes() {
    let s = stack(allow()).await;
    let http = https_client(s.zts.root_pem().as_bytes());
    // an authenticated resource, as in Athenz's ZTS: no credentials, no status
    let status = http
        .get(format!("{}/status", s.zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 401);
    let missing = http
        .get(format!("{}/nope", s.zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["code"], 404);
    assert!(body["message"].is_string());
    let wrong_method = http
        .get(format!("{}/instance", s.zts.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    // a malformed body is a 400 in the same shape
    let malformed = http
        .post(format!("{}/instance", s.zts.url()))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let body: serde_json::Value = malformed.json().await.unwrap();
    assert_eq!(body["code"], 400);
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let s = stack(allow()).await;
    let http = https_client(s.zts.root_pem().as_bytes());
    let resp = http
        .post(format!("{}/instance", s.zts.url()))
        .body(vec![b'{'; 70 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert!(s.provider.recorded().is_empty());
}

#[tokio::test]
async fn standalone_server_writes_its_address_and_stops() {
    use athenz_testbed::zts::{StandaloneInfo, run_standalone};
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("zts-config.json");
    std::fs::write(
        &config_path,
        r#"{"maxCertLifetimeMinutes": 60, "serviceDnsSuffixes": ["example.test"]}"#,
    )
    .unwrap();
    let config = DevZtsConfig::from_file(&config_path).unwrap();
    assert_eq!(config.max_cert_lifetime_minutes, 60);
    let state = dir.path().join("state");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let state = state.clone();
        async move {
            run_standalone(config, &state, None, async {
                let _ = rx.await;
            })
            .await
        }
    });
    // bounded wait for zts.json
    let info_path = state.join("zts.json");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !info_path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "zts.json never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info: StandaloneInfo = serde_json::from_slice(&std::fs::read(&info_path).unwrap()).unwrap();
    assert!(info.url.ends_with("/zts/v1"), "{}", info.url);
    let http = https_client(&std::fs::read(&info.ca).unwrap());
    // it serves: its keys to anyone (its status only to an authenticated caller)
    let keys = http
        .get(format!("{}/oauth2/keys?rfc=true", info.url))
        .send()
        .await
        .unwrap();
    assert_eq!(keys.status(), 200);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        http.get(format!("{}/status", info.url))
            .send()
            .await
            .is_err()
    );
}

#[test]
fn config_files_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, r#"{"maxCertLifetime": 60}"#).unwrap();
    let err = DevZtsConfig::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("bad.json") && err.contains("unknown field"),
        "{err}"
    );
    std::fs::write(&path, "{").unwrap();
    assert!(DevZtsConfig::from_file(&path).is_err());
    assert!(DevZtsConfig::from_file(&dir.path().join("missing.json")).is_err());
}

#[tokio::test]
async fn invalid_registry_entries_stop_the_start() {
    let config = DevZtsConfig {
        providers: vec![ProviderEntry {
            name: "nodot".into(),
            endpoint: "https://127.0.0.1:1".into(),
            dns_suffixes: vec!["athenz.cloud".into()],
            launch: vec![],
        }],
        ..DevZtsConfig::default()
    };
    let err = DevZts::start(config).await.err().unwrap().to_string();
    assert!(err.contains("provider"), "{err}");
}
