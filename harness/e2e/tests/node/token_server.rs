//! The SIA's token server (docs/design.md §4.11) on a whole node: the real `athenz-sia refresh`
//! serving role and access tokens from the dev ZTS, driven with k8s-athenz-sia's own request
//! examples and answering in its shapes; one ZTS call for many concurrent misses; a ZTS outage
//! past a token's life; tokens bound to the new certificate after a rotation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use athenz_core::crypto::{CertInfo, PublicKey};
use athenz_core::files::CERT_FILE;
use common::authz::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::timeout;

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
            .join("tests/node/fixtures/k8s-athenz-sia")
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
