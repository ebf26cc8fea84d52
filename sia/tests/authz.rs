//! Athenz authorization from the SIA (DESIGN.md 4.11): the real `athenz-sia` process on a whole
//! node, getting role certificates and tokens from the dev ZTS with the pod's own certificate.
//! Tokens are verified by PyJWT against the dev ZTS's JWKS and role certificates by `openssl
//! verify`; the token server is driven with k8s-athenz-sia's own request examples.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::{CertInfo, PublicKey, pem_certificates};
use athenz_core::files::{CERT_FILE, FileSet, KEY_FILE};
use athenz_testbed::zts::DevZtsConfig;
use athenz_testbed::zts::authz::{RoleEntry, thumbprint};
use common::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::timeout;

const READERS: &str = "media.sports:role.readers";
const WRITERS: &str = "media.sports:role.writers";
const READERS_TOKEN: &str = "tokens/media.sports:role.readers.accesstoken";
const READERS_ROLE_TOKEN: &str = "tokens/media.sports:role.readers.roletoken";
const READERS_CERT: &str = "rolecerts/media.sports:role.readers.cert.pem";
const WAIT: Duration = Duration::from_secs(30);

/// A node whose dev ZTS knows the pod's roles: `media.sports.web` is a reader (and a user of
/// `domain.shopping`, the domain of k8s-athenz-sia's examples), not a writer.
async fn authz_node() -> Node {
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

fn zts_url(node: &Node) -> String {
    format!("https://127.0.0.1:{}/zts/v1", node.zts_proxy.addr.port())
}

/// `athenz-sia <verb>` for a new pod `n` with ZTS configured and `extra` settings.
async fn sia_with_zts(
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
async fn init_pod(node: &Node, n: usize, extra: &[(&str, &str)]) -> PathBuf {
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

async fn jwks(node: &Node) -> Value {
    node.zts.fetch_jwks().await.unwrap()
}

/// The `x5t#S256` a token bound to the leaf of `cert_pem` must carry.
fn cert_thumbprint(cert_pem: &str) -> String {
    thumbprint(&pem_certificates(cert_pem).unwrap()[0])
}

fn read_set(out: &Path, names: &[&str]) -> Vec<String> {
    FileSet::new(out)
        .read(names)
        .unwrap()
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

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

/// A refresh sidecar of pod `n` serving tokens (REST and header mode, both token types) and
/// metrics; returns it with its token server and metrics URLs and its output directory.
struct Sidecar {
    _child: tokio::process::Child,
    tokens: String,
    metrics: String,
    out: PathBuf,
}

async fn sidecar(node: &Node, n: usize, extra: &[(&str, &str)]) -> Sidecar {
    let targets = [
        ("TARGET_DOMAIN_ROLES", READERS),
        ("TOKEN_TYPE", "roletoken+accesstoken"),
    ];
    init_pod(node, n, &targets).await;
    let (token_port, metrics_port) = (free_port().to_string(), free_port().to_string());
    let token_addr = format!("127.0.0.1:{token_port}");
    let metrics_addr = format!(":{metrics_port}");
    let mut env = targets.to_vec();
    env.extend_from_slice(&[
        ("TOKEN_SERVER_ADDR", token_addr.as_str()),
        ("TOKEN_SERVER_REST_API", "true"),
        ("USE_TOKEN_SERVER", "true"),
        ("METRICS_SERVER_ADDR", metrics_addr.as_str()),
    ]);
    env.extend_from_slice(extra);
    let (mut cmd, out) = sia_with_zts(node, "refresh", n, &env).await;
    let child = cmd.spawn().unwrap();
    let tokens = format!("http://{token_addr}");
    let metrics = format!("http://127.0.0.1:{metrics_port}");
    timeout(WAIT, async {
        while reqwest::get(format!("{metrics}/healthz")).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the sidecar never served /healthz");
    Sidecar {
        _child: child,
        tokens,
        metrics,
        out,
    }
}

async fn post(url: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let res = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/k8s-athenz-sia")
            .join(name),
    )
    .unwrap()
}

/// Same field names, and each the same JSON type, as k8s-athenz-sia's example.
fn same_shape(ours: &Value, theirs: &Value) {
    let (ours, theirs) = (ours.as_object().unwrap(), theirs.as_object().unwrap());
    let names = |o: &serde_json::Map<String, Value>| o.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(ours), names(theirs), "field names");
    for (name, value) in theirs {
        let kind = |v: &Value| std::mem::discriminant(v);
        assert_eq!(
            kind(&ours[name]),
            kind(value),
            "type of {name}: {}",
            ours[name]
        );
        assert_eq!(ours[name].is_i64(), value.is_i64(), "{name} is an integer");
    }
}

#[tokio::test]
async fn the_token_server_answers_k8s_athenz_sia_requests_with_its_shapes() {
    let node = authz_node().await;
    let side = sidecar(&node, 4, &[]).await;
    let jwks = jwks(&node).await;
    let cert = read_set(&side.out, &[CERT_FILE]).remove(0);

    // REST, access token: the example request as it is
    let (status, body) = post(
        &format!("{}/accesstoken", side.tokens),
        fixture("access_token_request.json"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Every role asked for was granted, so ZTS sends no `scope` back
    // (ZTSImpl.processAccessTokenStandardRequest), and k8s-athenz-sia's token server then sends
    // none either: it sets scope "ONLY when non-nil & non-empty" (pkg/token/server.go,
    // postAccessToken). Their example answer is for a ZTS that did send one.
    let mut theirs: Value = serde_json::from_str(&fixture("access_token_response.json")).unwrap();
    theirs.as_object_mut().unwrap().remove("scope");
    same_shape(&body, &theirs);
    assert_eq!(body["token_type"], "Bearer");
    // the whole domain: ZTS names the roles granted, and so does the token server, in their shape
    let (status, whole) = post(
        &format!("{}/accesstoken", side.tokens),
        r#"{"domain": "domain.shopping", "expiry": 1800}"#,
    )
    .await;
    assert_eq!(status, 200, "{whole}");
    same_shape(
        &whole,
        &serde_json::from_str(&fixture("access_token_response.json")).unwrap(),
    );
    assert_eq!(whole["scope"], "domain.shopping:role.users");
    let expires_in = body["expires_in"].as_i64().unwrap();
    assert!((1790..=1800).contains(&expires_in), "{expires_in}");
    let claims = athenz_testbed::pyjwt::verify_es256(
        body["access_token"].as_str().unwrap(),
        &jwks,
        "domain.shopping",
    )
    .unwrap();
    assert_eq!(
        claims["cnf"]["x5t#S256"],
        cert_thumbprint(&cert),
        "bound to the pod's certificate"
    );

    // REST, role token: the example request as it is
    let (status, body) = post(
        &format!("{}/roletoken", side.tokens),
        fixture("role_token_request.json"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    same_shape(
        &body,
        &serde_json::from_str(&fixture("role_token_response.json")).unwrap(),
    );
    let left =
        body["expiryTime"].as_i64().unwrap() - time::OffsetDateTime::now_utc().unix_timestamp();
    assert!(
        (7190..=10_000).contains(&left),
        "between min_expiry and max_expiry: {left}"
    );
    let token = athenz_core::role_token::RoleToken::parse(body["token"].as_str().unwrap()).unwrap();
    token
        .verify(
            &PublicKey::from_pem(&node.zts.token_public_key_pem()).unwrap(),
            time::OffsetDateTime::now_utc(),
            athenz_core::ntoken::VerifyLimits {
                max_lifetime: time::Duration::days(1),
                ..Default::default()
            },
        )
        .unwrap();

    // header mode: a configured target, its tokens in headers and JSON
    let res = reqwest::Client::new()
        .get(&side.tokens)
        .header("X-Athenz-Domain", "media.sports")
        .header("X-Athenz-Role", "readers")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let bearer = res.headers()["authorization"].to_str().unwrap().to_owned();
    let role_auth = res.headers()["athenz-role-auth"]
        .to_str()
        .unwrap()
        .to_owned();
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        bearer,
        format!("bearer {}", body["accesstoken"].as_str().unwrap())
    );
    assert_eq!(role_auth, body["roletoken"].as_str().unwrap());
    // the same tokens as the files of that target
    let files = read_set(&side.out, &[READERS_TOKEN, READERS_ROLE_TOKEN]);
    assert_eq!(body["accesstoken"], files[0].as_str());
    assert_eq!(body["roletoken"], files[1].as_str());

    // refusals: each a JSON error naming the reason
    let at = format!("{}/accesstoken", side.tokens);
    for (request, status, says) in [
        (r#"{"domain":"media.sports","role":"writers"}"#, 403, "403"),
        (
            r#"{"domain":"media.sports","rol":"readers"}"#,
            400,
            "unknown field",
        ),
        (r#"{"domain":""}"#, 400, "domain is required"),
        (r#"{"domain":"media.sports","expiry":-5}"#, 400, "expiry"),
        (r#"{"domain":"media/sports"}"#, 400, "domain"),
        (r#"{"domain":"media.sports","role":"../x"}"#, 400, "role"),
        (
            r#"{"domain":"media.sports","proxy_for_principal":"sys.auth.zms"}"#,
            403,
            "proxy",
        ),
        (r#"{"domain":"#, 400, "invalid request body"),
        (r#"[1,2,3]"#, 400, "invalid request body"),
    ] {
        let (got, body) = post(&at, request).await;
        assert_eq!(got, status, "{request}: {body}");
        let reason = body["error"].as_str().unwrap_or_default();
        assert!(reason.contains(says), "{request}: {body}");
    }
    let (status, _) = post(&at, format!(r#"{{"domain":"{}"}}"#, "a".repeat(20_000))).await;
    assert_eq!(status, 413, "a body over the limit");
    let header_mode = |domain: &'static str, role: &'static str| {
        let url = side.tokens.clone();
        async move {
            let mut req = reqwest::Client::new().get(url);
            if !domain.is_empty() {
                req = req.header("X-Athenz-Domain", domain);
            }
            if !role.is_empty() {
                req = req.header("X-Athenz-Role", role);
            }
            let res = req.send().await.unwrap();
            (res.status().as_u16(), res.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = header_mode("media.sports", "").await;
    assert_eq!(
        (status, body["error"].as_str().unwrap()),
        (
            400,
            "http headers not set: X-Athenz-Domain[media.sports] X-Athenz-Role[]."
        )
    );
    let (status, body) = header_mode("media.sports", "writers").await;
    assert_eq!(
        (status, body["error"].as_str().unwrap()),
        (
            400,
            "domain[media.sports] role[writers] was not found in cache."
        )
    );

    // metrics: every cached token's remaining life, and the cache's size
    let text = reqwest::get(format!("{}/metrics", side.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{prefix} not in\n{text}"))
    };
    let left = value(
        r#"token_expires_in_seconds{domain="domain.shopping",role="users",type="accesstoken"}"#,
    );
    assert!((1700.0..=1800.0).contains(&left), "{left}");
    assert!(
        value(r#"token_expires_in_seconds{domain="media.sports",role="readers",type="roletoken"}"#)
            > 0.0
    );
    assert_eq!(
        value(r#"cached_token_entries{type="accesstoken"}"#),
        3.0, // the example's role, the whole domain, and the header mode's
        "{text}"
    );
    assert!(value(r#"cached_token_bytes{type="roletoken"}"#) > 100.0);
}

/// Raises this process's open-file limit to its hard limit (a thousand client sockets).
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_misses_make_one_zts_call() {
    raise_fd_limit();
    let node = authz_node().await;
    let side = sidecar(&node, 5, &[]).await;
    let before = node.zts.requests("oauth2_token");
    let url = format!("{}/accesstoken", side.tokens);
    // HTTP/1.1: each request in flight has its own connection, so a thousand are really at once
    let client = reqwest::Client::builder().http1_only().build().unwrap();
    let requests: Vec<_> = (0..1000)
        .map(|_| {
            let (url, client) = (url.clone(), client.clone());
            tokio::spawn(async move {
                let res = client
                    .post(url)
                    .body(r#"{"domain":"domain.shopping","role":"users","expiry":4321}"#)
                    .send()
                    .await
                    .unwrap();
                let status = res.status();
                let body = res.json::<Value>().await.unwrap();
                assert_eq!(status, 200, "{body}");
                body["access_token"].as_str().unwrap().to_owned()
            })
        })
        .collect();
    let mut tokens = std::collections::BTreeSet::new();
    for r in requests {
        tokens.insert(timeout(WAIT, r).await.unwrap().unwrap());
    }
    assert_eq!(tokens.len(), 1, "every request got the one token fetched");
    assert_eq!(
        node.zts.requests("oauth2_token") - before,
        1,
        "one ZTS call for the key"
    );
}

#[tokio::test]
async fn zts_down_past_a_tokens_life_is_named_and_heals_by_itself() {
    let node = authz_node().await;
    let side = sidecar(&node, 6, &[]).await;
    let url = format!("{}/accesstoken", side.tokens);
    // a token of 3 s: under a minute left, so every request asks ZTS for a new one
    let request = r#"{"domain":"domain.shopping","role":"users","expiry":3}"#;
    let (status, first) = post(&url, request).await;
    assert_eq!(status, 200, "{first}");

    node.zts_proxy.set_down(true).await;
    // while the last token lives, it is still served
    let (status, body) = post(&url, request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["access_token"], first["access_token"]);
    // past its life, the error says why
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, body) = post(&url, request).await;
    assert_eq!(status, 503, "{body}");
    let reason = body["error"].as_str().unwrap();
    assert!(reason.contains("ZTS unavailable"), "{reason}");

    node.zts_proxy.set_down(false).await;
    let healed = timeout(WAIT, async {
        loop {
            let (status, body) = post(&url, request).await;
            if status == 200 {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the token server never recovered");
    assert_ne!(healed["access_token"], first["access_token"]);
}

#[tokio::test]
async fn after_a_rotation_tokens_carry_the_new_certificates_thumbprint() {
    let node = authz_node().await;
    let side = sidecar(&node, 7, &[("REFRESH_INTERVAL", "2s")]).await;
    let first_cert = read_set(&side.out, &[CERT_FILE]).remove(0);
    let url = format!("{}/accesstoken", side.tokens);
    let cnf = |token: &str| -> String {
        let payload = token.split('.').nth(1).unwrap();
        let json: Value = serde_json::from_slice(
            &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload)
                .unwrap(),
        )
        .unwrap();
        json["cnf"]["x5t#S256"].as_str().unwrap().to_owned()
    };
    let (_, body) = post(&url, r#"{"domain":"media.sports","role":"readers"}"#).await;
    let before = cnf(body["access_token"].as_str().unwrap());

    // wait for two rotations; every set seen meanwhile pairs the certificate with its own token
    let mut serials = std::collections::BTreeSet::new();
    timeout(WAIT, async {
        while serials.len() < 3 {
            let set = read_set(&side.out, &[CERT_FILE, READERS_TOKEN]);
            assert_eq!(
                cnf(&set[1]),
                cert_thumbprint(&set[0]),
                "token file bound to the set's certificate"
            );
            serials.insert(CertInfo::from_pem(&set[0]).unwrap().serial_hex);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("no rotations");
    let cert = read_set(&side.out, &[CERT_FILE]).remove(0);
    assert_ne!(cert, first_cert);
    let (_, body) = post(&url, r#"{"domain":"media.sports","role":"readers"}"#).await;
    let after = cnf(body["access_token"].as_str().unwrap());
    assert_ne!(after, before);
    // the server's token is of a certificate at least as new as the one read just before
    let now_cert = read_set(&side.out, &[CERT_FILE]).remove(0);
    assert!(after == cert_thumbprint(&cert) || after == cert_thumbprint(&now_cert));
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
