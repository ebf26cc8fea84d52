//! `kubectl kustomize` of `deploy/` and of overlays built on it, for the manifest tests
//! (`manifests.rs`, `deploy_overlays.rs`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// An object's identity in a rendering: (kind, namespace or "", name).
pub type Key = (String, String, String);

/// The repository's `deploy/`.
pub fn deploy_dir() -> PathBuf {
    athenz_testbed::bins::repo_root().join("deploy")
}

/// The key of `kind` `name` in `namespace` ("" for cluster-scoped objects).
pub fn key(kind: &str, namespace: &str, name: &str) -> Key {
    (kind.to_owned(), namespace.to_owned(), name.to_owned())
}

/// `kubectl kustomize` of `dir`, parsed: every document by its [`Key`].
pub fn kustomize(dir: &Path) -> BTreeMap<Key, Value> {
    let out = std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(dir)
        .output()
        .expect("kubectl is needed (.ci/run installs Debian's kubernetes-client)");
    assert!(
        out.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let mut objects = BTreeMap::new();
    for doc in docs {
        let k = key(
            doc["kind"].as_str().unwrap(),
            doc["metadata"]["namespace"].as_str().unwrap_or(""),
            doc["metadata"]["name"].as_str().unwrap(),
        );
        assert!(
            objects.insert(k.clone(), doc).is_none(),
            "{k:?} twice in {}",
            dir.display()
        );
    }
    objects
}

/// A copy of `deploy/` in a temporary directory whose `overlays/local/generated/` holds
/// stand-ins for what an operator puts there (the ZTS URL, the CA, the keys).
pub struct LocalOverlay {
    /// Holds the copy.
    pub dir: tempfile::TempDir,
    /// The copy's `overlays/local`.
    pub overlay: PathBuf,
    /// The stand-in CA's text (`generated/zts-ca.pem`).
    pub ca: String,
}

/// The ZTS URL [`LocalOverlay`] writes.
pub const STAND_IN_ZTS_URL: &str = "https://192.0.2.2:4443/zts/v1";

impl LocalOverlay {
    /// Copies `deploy/` and writes the stand-ins.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("cp")
            .arg("-r")
            .arg(deploy_dir())
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success());
        let overlay = dir.path().join("deploy/overlays/local");
        let generated = overlay.join("generated");
        std::fs::create_dir_all(&generated).unwrap();
        std::fs::write(
            generated.join("cluster.env"),
            format!("ZTS_URL={STAND_IN_ZTS_URL}\n"),
        )
        .unwrap();
        // long enough that kustomize wraps its base64 form over several lines
        let ca = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            "QUJD".repeat(40)
        );
        std::fs::write(generated.join("zts-ca.pem"), &ca).unwrap();
        for file in [
            "jwt-public-v1.pem",
            "athenz-jwt-service.key",
            "athenz-callback.key",
            "jwt-signing-v1.pem",
        ] {
            std::fs::write(generated.join(file), format!("stand-in {file}\n")).unwrap();
        }
        Self { dir, overlay, ca }
    }
}
