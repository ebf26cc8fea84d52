//! The template as the install runs it: the deployed file, the image and ZTS from the
//! initializer's environment, and edits of the file followed without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use std::time::Duration;

mod common;
use common::*;

/// The template shipped in deploy/ is valid.
#[test]
fn the_deployed_template_is_valid() {
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/initializer-template.yaml"
    ))
    .unwrap();
    let data = manifest.split("template.yaml: |\n").nth(1).unwrap();
    let yaml: String = data
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let template = athenz_initializer::template::Template::from_yaml(&yaml).unwrap();
    assert!(template.native_sidecar);
    assert_eq!(template.credentials_mount_path, "/var/run/athenz");
}

/// The deployed template as the install runs it: the image and ZTS come from the initializer's
/// environment (SIA_IMAGE, ZTS_URL: the athenz-cluster ConfigMap), the default is csi-socket; a
/// changed template file is used for the next pod with no restart, and one that does not
/// validate is refused and counted while the last good one keeps serving.
#[tokio::test]
async fn the_deployed_template_takes_the_installs_image_and_zts_and_follows_edits() {
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/initializer-template.yaml"
    ))
    .unwrap();
    let map: k8s_openapi::api::core::v1::ConfigMap = serde_saphyr::from_str(&manifest).unwrap();
    let deployed = map.data.unwrap()["template.yaml"].clone();
    let (w, ops, template_file) = start_with(
        &deployed,
        &[
            "--sia-image=registry.example/athenz@sha256:0123",
            "--zts-url=https://zts.example:4443/zts/v1",
            "--tls-reload-interval=100ms",
        ],
    )
    .await;
    let original = pod_object("media-sports");
    let injected =
        |response: &Value| -> Pod { serde_json::from_value(apply(response, &original)).unwrap() };
    let pod = injected(
        &w.review(&review("u1", "CREATE", "media-sports", original.clone()))
            .await,
    );
    let spec = pod.spec.unwrap();
    let identity = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "athenz-identity")
        .unwrap();
    assert_eq!(
        identity
            .csi
            .as_ref()
            .unwrap()
            .volume_attributes
            .as_ref()
            .unwrap()["mode"],
        "socket",
        "the default is csi-socket"
    );
    for sia in spec.init_containers.iter().flatten().take(2) {
        assert_eq!(
            sia.image.as_deref(),
            Some("registry.example/athenz@sha256:0123")
        );
        let zts = sia
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "ZTS_URL")
            .unwrap();
        assert_eq!(
            zts.value.as_deref(),
            Some("https://zts.example:4443/zts/v1")
        );
    }
    // flex is not among the allowed volumes
    let mut flex = original.clone();
    flex["metadata"]["annotations"] = json!({"athenz.io/volume": "flex"});
    let refused = w
        .review(&review("u2", "CREATE", "media-sports", flex.clone()))
        .await;
    assert_eq!(refused["allowed"], false, "{refused}");
    assert!(
        refused["status"]["message"]
            .as_str()
            .unwrap()
            .contains("does not allow flex"),
        "{refused}"
    );

    // the operator allows flex: the next pod asking for it gets it, no restart
    std::fs::write(
        &template_file,
        deployed.replace(
            "allowedVolumes: [csi-socket, csi-files]",
            "allowedVolumes: [csi-socket, csi-files, flex]",
        ),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = w
            .review(&review("u3", "CREATE", "media-sports", flex.clone()))
            .await;
        if answer["allowed"] == true {
            let pod = injected_flex(&answer, &flex);
            assert!(pod, "the flex volume");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never reloaded: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // a template that does not validate: refused, counted, the last good one stays
    std::fs::write(&template_file, "volume: nfs\n").unwrap();
    let metrics_url = format!("http://{ops}/metrics");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("athenz_initializer_template_reloads_total{outcome=\"refused\"}") {
            assert!(
                text.contains("athenz_initializer_template_reloads_total{outcome=\"changed\"} 1"),
                "{text}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never refused: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let still = w
        .review(&review("u4", "CREATE", "media-sports", flex.clone()))
        .await;
    assert!(
        injected_flex(&still, &flex),
        "the last good template serves"
    );
}

fn injected_flex(response: &Value, original: &Value) -> bool {
    let pod: Pod = serde_json::from_value(apply(response, original)).unwrap();
    pod.spec
        .unwrap()
        .volumes
        .unwrap()
        .iter()
        .any(|v| v.name == "athenz-identity" && v.flex_volume.is_some())
}
