//! What the real-node tests of the release share: the image as `deploy/image.sh` builds it, the
//! features pod's verdict, a CA change reaching new pods, and Helm's release Secrets holding no
//! key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use athenz_core::volume_mode::VolumeMode;
use athenz_devstack::cluster::install::{CONTROL_NAMESPACE, NODE_NAMESPACE};
use athenz_devstack::cluster::scenario::{RESTRICTED_NAMESPACE, Scenario};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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

/// An Athenz CA change reaches new pods with no restart and no failed pod: a second CA appended
/// to the install's `athenz-zts-ca` (both namespaces, as an operator edits them), then removed
/// again. The agent publishes each bundle beside its socket (the file every SIA pod reads), and
/// a new pod asking for every feature works with each. (The dev ZTS cannot move to another CA,
/// so the CA appended and removed is the extra one, not ZTS's own.)
pub fn rotate_the_athenz_ca_and_check_new_pods(scenario: &Scenario) {
    use athenz_devstack::cluster::features::FEATURES;
    let kubectl = scenario.kubectl();
    let published = Path::new(athenz_core::volume::DEFAULT_AGENT_DIR).join("zts-ca.pem");
    let certificates = || {
        athenz_core::tls::read_certs_file(&published)
            .map(|c| c.len())
            .unwrap_or(0)
    };
    let original = kubectl
        .get_json(&["configmap", "-n", NODE_NAMESPACE, "athenz-zts-ca"])
        .unwrap()["data"]["ca.pem"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = certificates();
    assert!(before >= 1, "{} holds no certificate", published.display());
    let extra = athenz_testbed::pki::CertAuthority::new_root("Athenz Next Root")
        .unwrap()
        .cert_pem()
        .to_owned();
    for (bundle, expected) in [
        (format!("{original}{extra}"), before + 1),
        (original, before),
    ] {
        let patch = serde_json::json!({"data": {"ca.pem": bundle}}).to_string();
        for ns in [NODE_NAMESPACE, CONTROL_NAMESPACE] {
            kubectl
                .run(&[
                    "patch",
                    "configmap",
                    "-n",
                    ns,
                    "athenz-zts-ca",
                    "--type",
                    "merge",
                    "-p",
                    &patch,
                ])
                .unwrap();
        }
        let started = Instant::now();
        while certificates() != expected {
            assert!(
                started.elapsed() < Duration::from_secs(240),
                "the agent did not publish the {expected}-certificate bundle"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        eprintln!(
            "the CA bundle change ({expected} certificates) reached the pods' copy in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        kubectl
            .run(&[
                "delete",
                "pod",
                "-n",
                FEATURES.namespace,
                FEATURES.service_account,
                "--wait=true",
            ])
            .unwrap();
        check_features(&scenario.check_features().unwrap());
    }
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
