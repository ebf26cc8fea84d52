//! What the real-node tests of the release share: the image as `deploy/image.sh` builds it, the
//! features pod's verdict, and Helm's release Secrets holding no key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::scenario::RESTRICTED_NAMESPACE;
use std::process::Command;

/// Builds the release image as CI and operators do: `deploy/image.sh` (warm: seconds). Its
/// release builds go where `harness/e2e/tests/deploy/image.rs` has them go (`target/image-build`: a cargo
/// run inside `cargo test` keeps off the test build's directory), so a clean clone's test run
/// compiles the release binaries once, not once per test.
pub fn build_image() -> std::path::PathBuf {
    let repo = athenz_testbed::bins::repo_root();
    let out = Command::new(repo.join("deploy/image.sh"))
        .current_dir(&repo)
        .env("CARGO_TARGET_DIR", repo.join("target/image-build"))
        .output()
        .expect("deploy/image.sh");
    assert!(
        out.status.success(),
        "deploy/image.sh failed (it needs buildah, binutils and cargo-auditable: harness/setup \
         installs them): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = repo.join(format!(
        "target/image/athenz-k8s-identity-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    assert!(archive.is_file(), "{} was not written", archive.display());
    archive
}

/// The features pod, with no mode annotation under Pod Security `restricted`, used each feature
/// (run_all checked each from inside the pod; here what it found is held to the row).
pub fn check_features(features: &athenz_devstack::cluster::features::Features) {
    use athenz_devstack::cluster::features::{FEATURES, ROLE, ROLE_DOMAIN};
    assert_eq!(features.identity.namespace, RESTRICTED_NAMESPACE);
    assert_eq!(
        features.identity.mode,
        VolumeMode::CsiSocket,
        "the template's default"
    );
    let principal = format!("bank.vault.{}", FEATURES.service_account);
    assert_eq!(features.identity.principal, principal);
    assert_eq!(
        features.role_certificate,
        format!("{ROLE_DOMAIN}:role.{ROLE}")
    );
    assert_eq!(features.access_token_scope, vec![ROLE.to_owned()]);
    assert_eq!(features.sds_principal, principal);
}

/// Every Secret Helm keeps of its releases, decoded (base64, gzip, JSON), holds no private key.
pub fn check_no_key_in_helm_releases(kubectl: &athenz_devstack::cluster::kubectl::Kubectl) {
    use base64::Engine as _;
    use std::io::Read as _;
    let secrets = kubectl
        .get_json(&["secrets", "-A", "-l", "owner=helm"])
        .unwrap();
    let items = secrets["items"].as_array().unwrap();
    assert!(!items.is_empty(), "no Helm release Secret: {secrets}");
    for item in items {
        let name = item["metadata"]["name"].as_str().unwrap();
        // the Secret's data is base64 (the API), of Helm's base64 of a gzip of the release JSON
        let outer = base64::engine::general_purpose::STANDARD
            .decode(item["data"]["release"].as_str().unwrap())
            .unwrap();
        let gzipped = base64::engine::general_purpose::STANDARD
            .decode(&outer)
            .unwrap();
        let mut gunzip = Command::new("gzip")
            .arg("-dc")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("gzip (Debian's) decodes Helm's release");
        std::io::Write::write_all(&mut gunzip.stdin.take().unwrap(), &gzipped).unwrap();
        let mut release = String::new();
        gunzip
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut release)
            .unwrap();
        assert!(gunzip.wait().unwrap().success(), "{name}: not gzip");
        assert!(release.contains("\"config\""), "{name}: not a release");
        assert!(
            !release.contains("PRIVATE KEY"),
            "{name} holds a private key"
        );
    }
}
