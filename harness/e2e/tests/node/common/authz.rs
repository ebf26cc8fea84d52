//! What the SIA's authorization tests share (authz.rs, token_server.rs): a node whose dev ZTS
//! knows the pod's roles, an SIA configured for ZTS, and readers of what it writes.

use super::*;
use athenz_core::crypto::pem_certificates;
use athenz_core::files::FileSet;
use athenz_testbed::zts::DevZtsConfig;
use athenz_testbed::zts::authz::{RoleEntry, thumbprint};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const READERS: &str = "media.sports:role.readers";
pub const WRITERS: &str = "media.sports:role.writers";
pub const READERS_TOKEN: &str = "tokens/media.sports:role.readers.accesstoken";
pub const READERS_ROLE_TOKEN: &str = "tokens/media.sports:role.readers.roletoken";
pub const READERS_CERT: &str = "rolecerts/media.sports:role.readers.cert.pem";
pub const WAIT: Duration = Duration::from_secs(30);

/// A node whose dev ZTS knows the pod's roles: `media.sports.web` is a reader (and a user of
/// `domain.shopping`, the domain of k8s-athenz-sia's examples), not a writer.
pub async fn authz_node() -> Node {
    let role = |domain: &str, role: &str, members: &[&str]| RoleEntry {
        domain: domain.into(),
        role: role.into(),
        members: members.iter().map(|m| (*m).to_owned()).collect(),
    };
    node_with(
        "p256",
        DevZtsConfig {
            roles: vec![
                role("media.sports", "readers", &["media.sports.web"]),
                role("media.sports", "writers", &["media.sports.api"]),
                role("domain.shopping", "users", &["media.sports.*"]),
            ],
            max_token_expiry_secs: 86_400,
            ..DevZtsConfig::default()
        },
    )
    .await
}

pub fn zts_url(node: &Node) -> String {
    format!("https://127.0.0.1:{}/zts/v1", node.zts_proxy.addr.port())
}

/// `athenz-sia <verb>` for a new pod `n` with ZTS configured and `extra` settings.
pub async fn sia_with_zts(
    node: &Node,
    verb: &str,
    n: usize,
    extra: &[(&str, &str)],
) -> (tokio::process::Command, PathBuf) {
    let id = volume_for(node, &format!("web-{n}"), &uid(n));
    let out = node.dir.path().join(format!("out-{n}"));
    let url = zts_url(node);
    let ca = node.zts.ca_path();
    let mut env = vec![
        ("ZTS_URL", url.as_str()),
        ("SERVER_CA_CERT", ca.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    (sia(node, verb, &id, &out, &env).await, out)
}

/// A pod `n` on `node` whose init has run with `extra`; panics with its stderr if it failed.
pub async fn init_pod(node: &Node, n: usize, extra: &[(&str, &str)]) -> PathBuf {
    pod_with_volume(node, &format!("web-{n}"), &uid(n), &format!("10.9.0.{n}"));
    let (mut cmd, out) = sia_with_zts(node, "init", n, extra).await;
    let done = cmd.output().await.unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    out
}

pub async fn jwks(node: &Node) -> Value {
    node.zts.fetch_jwks().await.unwrap()
}

/// The `x5t#S256` a token bound to the leaf of `cert_pem` must carry.
pub fn cert_thumbprint(cert_pem: &str) -> String {
    thumbprint(&pem_certificates(cert_pem).unwrap()[0])
}

pub fn read_set(out: &Path, names: &[&str]) -> Vec<String> {
    FileSet::new(out)
        .read(names)
        .unwrap()
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect()
}

pub fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}
