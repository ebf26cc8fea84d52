//! Athenz authorization from the SIA (docs/design.md §4.11): the real `athenz-sia` process on a
//! whole node, getting role certificates and tokens from the dev ZTS with the pod's own
//! certificate. Tokens are verified by PyJWT against the dev ZTS's JWKS and role certificates by
//! `openssl verify`. The token server's tests are in token_server.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::{CertInfo, PublicKey};
use athenz_core::files::{CERT_FILE, FileSet, KEY_FILE};
use common::authz::*;
use common::*;
#[tokio::test]
async fn init_writes_role_certificates_and_tokens_in_the_identity_set() {
    let node = authz_node().await;
    let out = init_pod(
        &node,
        1,
        &[
            ("TARGET_DOMAIN_ROLES", READERS),
            ("TOKEN_TYPE", "roletoken+accesstoken"),
        ],
    )
    .await;

    // one set: the service credentials, the role certificate and both tokens
    let set = read_set(
        &out,
        &[
            KEY_FILE,
            CERT_FILE,
            READERS_CERT,
            READERS_TOKEN,
            READERS_ROLE_TOKEN,
        ],
    );
    let (key, cert, role_cert, access, role_token) = (&set[0], &set[1], &set[2], &set[3], &set[4]);

    // the role certificate: issued by the ZTS CA, over the service key, naming role and caller
    athenz_testbed::openssl::verify(node.zts.root_pem(), node.zts.ca_bundle(), role_cert).unwrap();
    let info = CertInfo::from_pem(role_cert).unwrap();
    assert_eq!(info.common_name, READERS);
    assert_eq!(
        info.uris,
        [
            "spiffe://media.sports/ra/readers",
            "athenz://principal/media.sports.web"
        ]
    );
    let service = CertInfo::from_pem(cert).unwrap();
    assert_eq!(
        info.public_key_der, service.public_key_der,
        "role certificate over the service key"
    );
    assert!(athenz_core::crypto::key_matches_cert(
        &athenz_core::crypto::PrivateKey::from_pem(key).unwrap(),
        &info
    ));

    // the access token: verified by PyJWT, bound to the service certificate
    let claims =
        athenz_testbed::pyjwt::verify_es256(access, &jwks(&node).await, "media.sports").unwrap();
    assert_eq!(claims["sub"], "media.sports.web");
    assert_eq!(claims["scp"], serde_json::json!(["readers"]));
    assert_eq!(claims["cnf"]["x5t#S256"], cert_thumbprint(cert));

    // the role token: ZTS's signature over its text
    let parsed = athenz_core::role_token::RoleToken::parse(role_token).unwrap();
    let zts_key = PublicKey::from_pem(&node.zts.token_public_key_pem()).unwrap();
    parsed
        .verify(
            &zts_key,
            time::OffsetDateTime::now_utc(),
            Default::default(),
        )
        .unwrap();
    assert!(role_token.contains(";r=readers;") && role_token.contains(";p=media.sports.web;"));

    // modes: certificates public, tokens as secret as the key
    assert_eq!(mode(&out.join(READERS_CERT)), 0o644);
    assert_eq!(mode(&out.join(READERS_TOKEN)), 0o600);
    assert_eq!(mode(&out.join(KEY_FILE)), 0o600);
}

#[tokio::test]
async fn init_refuses_a_role_the_pod_is_not_in_and_writes_nothing() {
    let node = authz_node().await;
    pod_with_volume(&node, "web-2", &uid(2), "10.9.0.2");
    let (mut cmd, out) = sia_with_zts(
        &node,
        "init",
        2,
        &[("TARGET_DOMAIN_ROLES", &format!("{READERS},{WRITERS}"))],
    )
    .await;
    let done = cmd.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("media.sports:role.writers") && stderr.contains("403"),
        "{stderr}"
    );
    assert!(stderr.contains("not retried"), "{stderr}");
    assert!(
        FileSet::new(&out).read(&[CERT_FILE]).is_err(),
        "no set may be written"
    );
}

#[tokio::test]
async fn bad_authorization_settings_exit_2_naming_the_setting() {
    let node = authz_node().await;
    pod_with_volume(&node, "web-3", &uid(3), "10.9.0.3");
    for (env, named) in [
        (
            vec![("TARGET_DOMAIN_ROLES", "media.sports")],
            "TARGET_DOMAIN_ROLES",
        ),
        (
            vec![("TARGET_DOMAIN_ROLES", READERS), ("TOKEN_TYPE", "jwt")],
            "TOKEN_TYPE",
        ),
        (
            vec![
                ("TARGET_DOMAIN_ROLES", READERS),
                ("TOKEN_EXPIRY", "10m"),
                ("TOKEN_REFRESH_INTERVAL", "30m"),
            ],
            "TOKEN_REFRESH_INTERVAL",
        ),
        (vec![("TOKEN_SERVER_ADDR", "nowhere")], "TOKEN_SERVER_ADDR"),
        (
            vec![
                ("TARGET_DOMAIN_ROLES", READERS),
                ("ROLE_AUTH_HEADER", "bad header"),
            ],
            "ROLE_AUTH_HEADER",
        ),
    ] {
        let (mut cmd, _) = sia_with_zts(&node, "init", 3, &env).await;
        let done = cmd.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert_eq!(done.status.code(), Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(named), "{env:?}: {stderr}");
    }
    // no ZTS named at all
    let id = volume_for(&node, "web-3", &uid(3));
    let out = node.dir.path().join("out-3b");
    let done = sia(
        &node,
        "init",
        &id,
        &out,
        &[("TARGET_DOMAIN_ROLES", READERS)],
    )
    .await
    .output()
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("ZTS_URL"), "{stderr}");
}

/// With no CA bundle of its own (the image holds none, and a tenant's namespace none of the
/// install's ConfigMaps), the SIA verifies ZTS with the one its agent publishes beside the socket;
/// the same bundle the agent was given.
#[tokio::test]
async fn the_agents_published_ca_verifies_zts_when_the_pod_has_none() {
    let node = authz_node().await;
    let url = zts_url(&node);
    // `athenz-sia init` for a new pod `n`, given ZTS's URL and a role, but no CA bundle
    let init_without_ca = |n: usize| {
        let (node, url) = (&node, url.clone());
        async move {
            pod_with_volume(node, &format!("web-{n}"), &uid(n), &format!("10.9.0.{n}"));
            let id = volume_for(node, &format!("web-{n}"), &uid(n));
            let out = node.dir.path().join(format!("out-{n}"));
            let env = [("ZTS_URL", url.as_str()), ("TARGET_DOMAIN_ROLES", READERS)];
            let done = sia(node, "init", &id, &out, &env)
                .await
                .output()
                .await
                .unwrap();
            (done, out)
        }
    };
    let published = node.socket.parent().unwrap().join("zts-ca.pem");
    assert_eq!(
        std::fs::read_to_string(&published).unwrap().trim(),
        std::fs::read_to_string(&node.agent_config.zts_ca)
            .unwrap()
            .trim(),
        "the agent publishes its --zts-ca"
    );
    let (done, out) = init_without_ca(41).await;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(read_set(&out, &[READERS_CERT])[0].contains("BEGIN CERTIFICATE"));

    // the published copy gone: the SIA names the file it looked for
    std::fs::remove_file(&published).unwrap();
    let (done, _) = init_without_ca(42).await;
    assert!(!done.status.success());
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(
        err.contains("zts-ca.pem") && err.contains("SERVER_CA_CERT"),
        "{err}"
    );
}
